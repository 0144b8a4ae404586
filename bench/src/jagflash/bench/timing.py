"""Timing: ``triton.testing.do_bench`` on a GPU, a wall clock on the CPU.

On a GPU each measurement is do_bench's p20/p50/p80 over CUDA-event timings, with the L2 cache
flushed before every run (do_bench does that) *and* the inputs rotated over several sets when one
set is small enough that L2 could hold it. ``rep_ms`` is do_bench's repetition time; at least
``min_reps`` timed runs are asked for by lengthening it from a one-shot estimate. With
``cuda_graph`` a problem whose single run is under ``graph_below_ms`` is timed by replaying a CUDA
graph (``do_bench_cudagraph``: no launch gaps, no L2 flush, so rotation matters there); a capture
that fails falls back to do_bench and the row's ``timer`` says so, with the error.

A backward row is offered to a graph by :func:`graph_backward`, not by ``do_bench_cudagraph``:
autograd runs a backward on the stream of the forward that recorded it and accumulates into each
leaf on the stream its AccumulateGrad node was made on, the default stream for the leaves the
eager check used, while ``do_bench_cudagraph`` captures on a side stream of its own (session 10:
every provider's backward failed to capture so). ``graph_backward`` takes a builder of *fresh*
leaves and their forwards, runs it on its own side stream, warms each set's backward there and
captures the backwards (``autograd.grad``, ``retain_graph``) on that same stream: the forward
stays outside the graph, as it stays outside an eager backward row's timing.

:func:`loop_ms` is the other figure of an eager row: wall time per call of calls issued back to
back in a loop, synchronised once at the end (what a training or serving loop of eager calls
runs at: its host time where the host is the bound, else the device's). do_bench's figure of a
host-bound call is not that: the L2 flush before each run hides up to the flush's duration of
host time, and the rest moves with the process (session 16: one tree's 1-token forward read
0.24-0.46 ms in three processes).

On the CPU (smoke runs) fn is synchronous: ``min_reps`` calls after one warm-up, percentiles of
their wall-clock times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "Rotator", "Timing", "estimate_ms", "first_call_ms", "graph_backward", "loop_ms", "measure",
    "rotation_sets",
]

QUANTILES = (0.2, 0.5, 0.8)


@dataclass(frozen=True)
class Timing:
    p20: float
    p50: float
    p80: float
    runs: int
    timer: str


class Rotator:
    """Calls ``fns`` in turn: each call of the benchmark loop reads the next input set."""

    def __init__(self, fns: Sequence[Callable[[], object]]):
        if not fns:
            raise ValueError("Rotator needs at least one function")
        self.fns = list(fns)
        self.i = 0

    def __call__(self) -> None:
        fn = self.fns[self.i]
        self.i = (self.i + 1) % len(self.fns)
        fn()


def rotation_sets(set_bytes: int, device: torch.device, max_sets: int = 4) -> int:
    """How many input sets to rotate so that together they are at least 3x the L2 cache."""
    if device.type != "cuda" or set_bytes <= 0:
        return 1
    props = torch.cuda.get_device_properties(device)
    l2 = int(getattr(props, "L2_cache_size", 0) or 64 << 20)
    return int(max(1, min(max_sets, -(-3 * l2 // set_bytes))))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def estimate_ms(fn: Callable[[], object], device: torch.device) -> float:
    """One run of ``fn`` (already warm), in ms."""
    _sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def first_call_ms(fn: Callable[[], object], device: torch.device) -> tuple[float, object]:
    """One call of ``fn``, cold (where a compiled function compiles): wall-clock ms with the
    device synchronised around it, and its result."""
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3, out


def loop_ms(fn: Callable[[], object], device: torch.device, *, budget_ms: float = 20.0, rounds: int = 5) -> float:
    """ms per call of ``fn`` called back to back (the device drained before each round and
    waited for after it), the median of ``rounds`` rounds of about ``budget_ms`` each (5 to 50
    calls, from one call's time)."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    one = (time.perf_counter() - t0) * 1e3
    calls = int(max(5, min(50, budget_ms / max(one, 1e-3))))
    times = []
    for _ in range(rounds):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3 / calls)
    return float(np.median(times))


def _wallclock(fn: Callable[[], object], reps: int) -> Timing:
    times = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    p20, p50, p80 = np.percentile(np.asarray(times), [20, 50, 80]).tolist()
    return Timing(p20, p50, p80, len(times), "wall clock")


def _event_bench(
    fn: Callable[[], object], warmup_ms: float, rep_ms: float, est: float, grad_to_none
) -> Timing:
    """Fallback when triton.testing is unusable: CUDA events around each run, no L2 flush."""
    n_warm = max(1, int(warmup_ms / max(est, 1e-3)))
    n_rep = max(5, int(rep_ms / max(est, 1e-3)))
    for _ in range(n_warm):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for s, e in zip(starts, ends):
        for x in grad_to_none or ():
            x.grad = None
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = np.asarray([s.elapsed_time(e) for s, e in zip(starts, ends)])
    p20, p50, p80 = np.percentile(times, [20, 50, 80]).tolist()
    return Timing(p20, p50, p80, n_rep, "cuda events")


def measure(
    fn: Callable[[], object],
    device: torch.device,
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_reps: int = 20,
    max_rep_ms: float = 2000.0,
    grad_to_none: Sequence[torch.Tensor] | None = None,
    cuda_graph: bool = False,
    graph_below_ms: float = 0.1,
) -> Timing:
    """p20/p50/p80 of ``fn`` in ms (see the module docstring)."""
    if device.type != "cuda":
        return _wallclock(fn, min_reps)
    est = estimate_ms(fn, device)
    rep = min(max(rep_ms, min_reps * est), max(max_rep_ms, rep_ms))
    grads = list(grad_to_none) if grad_to_none else None
    try:
        import triton.testing as tt
    except Exception:  # time without triton rather than not at all
        return _event_bench(fn, warmup_ms, rep, est, grads)
    if cuda_graph and est < graph_below_ms:
        try:
            qs = tt.do_bench_cudagraph(fn, rep=rep, grad_to_none=grads, quantiles=list(QUANTILES))
            return Timing(*map(float, qs), max(1, int(rep / max(est, 1e-3))), "do_bench_cudagraph")
        except Exception as e:
            _sync(device)
            why = (str(e).strip().splitlines() or [""])[0][:80]
            fallback = f"do_bench (graph capture failed: {type(e).__name__}{': ' + why if why else ''})"
        else:  # pragma: no cover - returned above
            fallback = "do_bench"
    else:
        fallback = "do_bench"
    qs = tt.do_bench(fn, warmup=warmup_ms, rep=rep, grad_to_none=grads, quantiles=list(QUANTILES))
    return Timing(*map(float, qs), max(1, int(rep / max(est, 1e-3))), fallback)


def _replay_times(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, replays: int) -> list[float]:
    """ms of each of ``replays`` replays of ``graph`` on ``stream`` (CUDA events on it)."""
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        graph.replay()
        end.record(stream)
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return times


def graph_backward(
    make_backwards: Callable[[], Sequence[Callable[[], object]]],
    device: torch.device,
    *,
    rep_ms: float = 100.0,
    replays: int = 10,
    max_calls: int = 1000,
) -> tuple[Timing | None, str]:
    """Time backwards replayed in a CUDA graph: ``(timing, "")``, or ``(None, why)`` when the
    capture fails (its memory given back first).

    ``make_backwards()`` is called on a side stream: it makes fresh leaves (never used on another
    stream), records their forwards and returns one backward callable per input set. Each is
    warmed twice on that stream; one graph of the sets in turn gives an estimate, then one graph
    of ``rep_ms / estimate`` calls (at most ``max_calls``) is replayed ``replays`` times; the
    p20/p50/p80 are of those replays' times over the calls each holds, as ``do_bench_cudagraph``
    reports them.
    """
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    graphs: list[torch.cuda.CUDAGraph] = []
    try:
        with torch.cuda.stream(side):
            fns = list(make_backwards())
            if not fns:
                raise ValueError("graph_backward needs at least one backward")
            rot = Rotator(fns)
            for _ in range(2 * len(fns)):
                rot()
            side.synchronize()
            one = torch.cuda.CUDAGraph()
            graphs.append(one)
            with torch.cuda.graph(one, stream=side):
                for _ in range(len(fns)):
                    rot()
            est = min(_replay_times(one, side, 3)) / len(fns)
            calls = int(max(len(fns), min(max_calls, rep_ms / max(est, 1e-3))))
            calls -= calls % len(fns)  # whole rotations: every set timed alike
            many = torch.cuda.CUDAGraph()
            graphs.append(many)
            with torch.cuda.graph(many, stream=side):
                for _ in range(calls):
                    rot()
            many.replay()  # the first replay uploads the graph
            times = np.asarray(_replay_times(many, side, replays)) / calls
    except Exception as e:
        _sync(device)
        graphs.clear()
        torch.cuda.empty_cache()
        why = (str(e).strip().splitlines() or [""])[0][:80]
        return None, f"{type(e).__name__}{': ' + why if why else ''}"
    torch.cuda.current_stream(device).wait_stream(side)
    p20, p50, p80 = np.percentile(times, [20, 50, 80]).tolist()
    return Timing(p20, p50, p80, calls * replays, "graph_backward (fresh leaves, autograd.grad)"), ""
