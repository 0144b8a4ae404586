"""Probe (H200): where the time of a small call goes. The bench's broadcast-Q Lq256 x 64 and
jagged tiny workloads run at 137 and 23 TFLOP/s forward where FA4 expand-Q runs 343 (2026-12-01,
session 4): the kernels should take a fraction of the 0.8 ms a call measures, so the host is the
suspect. For each workload (a block-sparse one with its batch's block mask), forward (no grad),
training forward (inputs that require grad, as the bench's forward rows) and forward +
backward, with the plan built once outside (as the bench does), this prints:

- ``call``: the median of ``do_bench`` (what the bench reports), and its p20 / p80;
- ``host``: wall time per call of 50 calls issued back to back without synchronising, i.e. how
  fast the host can issue calls (when it is above ``gpu``, the call is host-bound);
- ``gpu``: the summed CUDA time of the call's kernels (torch.profiler), and their names;
- the 12 Python functions with the most cumulative time over those calls (cProfile), which
  name where the host time goes (argument checks, plan checks, the custom op, launches).

Run on the GPU: ``PROBE=bench/probes/probe_host.py bash bench/gpu.sh probe`` (~1 minute)."""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import torch


def _calls(name: str):
    """``(forward, forward + backward)`` closures for bench workload ``name``, plan built once."""
    from jagflash.bench.data import make_batch
    from jagflash.bench.workloads import get

    w = get(name)
    b = make_batch(w, "cuda")
    q, k, v = (t.detach().requires_grad_() for t in (b.q, b.k, b.v))
    if w.kind == "broadcast_q":
        from jagflash.variants.broadcast_q import broadcast_q_attention, make_plan

        plan = make_plan(q, k, b.kv_offsets, max_seqlen_kv=b.max_kv)

        def fwd():
            return broadcast_q_attention(q, k, v, b.kv_offsets, max_seqlen_kv=b.max_kv, plan=plan)
    elif w.blocks is not None:  # a block-sparse workload: the batch's mask, its plan built for a backward (as the bench does)
        from jagflash.variants.block_sparse import block_sparse_attention, make_plan

        m = b.block_mask
        plan = make_plan(q, k, b.q_offsets, b.kv_offsets, m, causal=w.causal, backward=True)

        def fwd():
            return block_sparse_attention(q, k, v, b.q_offsets, b.kv_offsets, m, causal=w.causal, plan=plan)
    else:
        from jagflash.variants.jagged import jagged_attention, make_plan

        plan = make_plan(q, k, b.q_offsets, b.kv_offsets, causal=w.causal, max_seqlen_q=b.max_q, max_seqlen_kv=b.max_kv)

        def fwd():
            return jagged_attention(
                q, k, v, b.q_offsets, b.kv_offsets, causal=w.causal, max_seqlen_q=b.max_q,
                max_seqlen_kv=b.max_kv, plan=plan,
            )

    dout = b.dout

    def fwd_only():
        with torch.no_grad():
            return fwd()

    def fwd_bwd():
        return torch.autograd.grad(fwd(), (q, k, v), dout)

    return fwd_only, fwd, fwd_bwd


def sync() -> None:
    """Drain the GPU, where there is one (the CPU probes time the host alone)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def host_ms_per_call(fn, n: int = 50) -> float:
    """Host wall time per call of ``n`` calls issued back to back without synchronising (the
    GPU, if any, drained before and after): how fast the host can issue them."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    ms = (time.perf_counter() - t0) * 1e3 / n
    sync()
    return ms


def _measure(label: str, fn) -> None:
    from triton.testing import do_bench

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    p20, call_ms, p80 = do_bench(fn, warmup=20, rep=200, quantiles=[0.2, 0.5, 0.8])

    n = 50
    host_ms = host_ms_per_call(fn, n)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us:
            kernels[e.key] = us / 10
    gpu_ms = sum(kernels.values()) / 1e3
    print(f"\n== {label}: call {call_ms:.3f} ms (p20 {p20:.3f}, p80 {p80:.3f}) | host {host_ms:.3f} ms/call | gpu {gpu_ms:.3f} ms/call", flush=True)
    for key, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:8]:
        print(f"   {us / 1e3:8.3f} ms  {key[:100]}")

    prof_py = cProfile.Profile()
    prof_py.enable()
    for _ in range(n):
        fn()
    prof_py.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof_py, stream=out).sort_stats("cumulative").print_stats(12)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    print(f"   cProfile over {n} calls (cumulative s):")
    for ln in lines[start : start + 13]:
        print("   " + ln[:150])


DEFAULT_WORKLOADS = ("bq-lq256-b64", "jagged-tiny-d128", "bq-lq1024-b64")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "workloads", nargs="*", default=DEFAULT_WORKLOADS, help=f"default: {DEFAULT_WORKLOADS}"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_host: needs a CUDA device", file=sys.stderr)
        return 2
    for name in args.workloads:
        fwd_only, fwd_train, fwd_bwd = _calls(name)
        _measure(f"{name} fwd", fwd_only)
        _measure(f"{name} training fwd", fwd_train)
        _measure(f"{name} fwd+bwd", fwd_bwd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
