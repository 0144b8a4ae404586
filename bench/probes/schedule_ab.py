"""A/B of the tile schedules on the bench's jagged workloads: the portable kernels under each
schedule, the Plan's build time, and the CPU simulator's efficiency.

    python bench/probes/schedule_ab.py kernels                  # GPU: every jagged workload
    python bench/probes/schedule_ab.py kernels --workloads '*causal*' --workers 0,264
    python bench/probes/schedule_ab.py kernels --schedules none,static,static/none --csv ab.csv
    python bench/probes/schedule_ab.py plan-time [--workload W] [--device cuda] [--profile]
    python bench/probes/schedule_ab.py simulate [--workers 132]  # CPU

``kernels``: the portable jagged kernels under ``none`` (batch order, one program a tile),
``static`` (cost-sorted, zigzag over persistent workers), ``dynamic`` (cost-sorted, atomic tile
counter) and ``grouped`` (sequences cost-sorted, their tiles together, zigzag), forward and
backward; a schedule ``fwd/bwd`` gives the backward passes their own kind
(``backward_schedule``). Times are medians of CUDA-event timings of the ops alone
(``jagflash::jagged_fwd`` / ``jagged_bwd`` with a prebuilt plan laid out for the portable
kernels), after a warm-up that compiles them; FLOPs from the real lengths
(``jagflash.bench.flops``). Each workload is followed by the same kernels on equal lengths of
4,096 at about its FLOPs (the jagged rate as a fraction of the dense one).

``plan-time``: median µs of ``jagflash.core.plan.build.make_plan`` per schedule, forward only and
with the backward passes (synchronised wall clock, host enqueue time, CUDA-graph replay), with
the portable kernels' tile sizes. ``simulate``: every schedule's simulated efficiency on W
workers (forward / dQ / dK-dV passes), and the forward's sequences in flight.

Until session 10 (2026-12-01) these were ``python -m jagflash.variants.jagged.ab_schedules`` and
``python -m jagflash.core.schedule --bench`` / ``--simulate`` (on core's mirror of the bench's
jagged lengths: the same lengths); ``kernels`` drew its own input values then.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from jagflash.bench.data import make_batch
from jagflash.bench.flops import BWD_FACTOR, fwd_flops
from jagflash.bench.workloads import WORKLOADS, Fixed, Workload, select

DENSE_LENGTH = 4096  # the equal lengths each workload is compared with


def jagged_workloads(patterns: str | None = None) -> list[Workload]:
    """The bench's jagged workloads whose names match any comma-separated glob (all: None)."""
    try:
        chosen = [w for w in select(patterns) if w.kind == "jagged"]
    except ValueError as exc:  # a pattern that matches no workload
        raise SystemExit(str(exc)) from None
    if not chosen:
        known = ", ".join(n for n, w in WORKLOADS.items() if w.kind == "jagged")
        raise SystemExit(f"no jagged workload matches {patterns}; known: {known}")
    return chosen


def plan_kwargs(
    w: Workload, schedule: str, *, device: torch.device | str = "cpu", backend: str = "portable",
    workers: int | None = None, backward: bool = True,
) -> dict:
    """``jagflash.core.plan.build.make_plan``'s arguments for workload ``w`` (offsets on
    ``device``), with the portable kernels' tile sizes for ``backend``."""
    from jagflash.core.jagged import offsets_from_lengths
    from jagflash.core.tuning import plan_blocks

    q_lens, kv_lens = w.sample_lengths()
    bl = plan_blocks(backend, w.head_dim)
    return {
        "q_offsets": offsets_from_lengths(q_lens.tolist(), device),
        "kv_offsets": offsets_from_lengths(kv_lens.tolist(), device),
        "total_q": int(q_lens.sum()), "total_kv": int(kv_lens.sum()), "heads_q": w.heads,
        "heads_kv": w.hkv, "causal": w.causal, "block_m": bl["fwd"][0], "block_n": bl["fwd"][1],
        "dq_blocks": bl["dq"], "dkdv_blocks": bl["dkdv"], "max_seqlen_q": int(q_lens.max(initial=0)),
        "max_seqlen_kv": int(kv_lens.max(initial=0)), "workers": workers, "schedule": schedule,
        "backward": backward,
    }


# --- kernels --------------------------------------------------------------------------------


def _time_ms(fn: Callable[[], object], reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(w: Workload, schedule: str, *, workers: int | None, reps: int) -> dict:
    """Forward and backward ms and TFLOP/s of workload ``w`` under one schedule."""
    from jagflash.variants.jagged import make_plan
    from jagflash.variants.jagged import op as jop

    b = make_batch(w, "cuda")
    fwd, _, bwd = schedule.partition("/")
    plan = make_plan(
        b.q, b.k, b.q_offsets, b.kv_offsets, causal=w.causal, schedule=fwd,
        backward_schedule=bwd or None, workers=workers, max_seqlen_q=b.max_q,
        max_seqlen_kv=b.max_kv, backend="portable",
    )
    extras = (
        b.q_offsets, b.kv_offsets, b.max_q, b.max_kv, w.causal, w.head_dim**-0.5, False, False,
        "portable", *plan.op_args(),
    )
    out, lse = jop.jagged_fwd(b.q, b.k, b.v, *extras)
    fwd_ms = _time_ms(lambda: jop.jagged_fwd(b.q, b.k, b.v, *extras), reps)
    bwd_ms = _time_ms(lambda: jop.jagged_bwd(b.dout, b.q, b.k, b.v, out, lse, *extras), reps)
    flops = fwd_flops(b.q_lens, b.kv_lens, heads=w.heads, head_dim=w.head_dim, causal=w.causal)
    return {
        "workload": w.name, "schedule": schedule, "workers": plan.info.workers or "SMs",
        "tokens": b.total_q, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms,
        "fwd_tflops": flops / fwd_ms * 1e-9, "bwd_tflops": BWD_FACTOR * flops / bwd_ms * 1e-9,
    }


def dense_equivalent(w: Workload, length: int = DENSE_LENGTH) -> Workload:
    """``w`` on equal lengths ``length``, as many sequences as give about its FLOPs (>= 1)."""
    q_lens, kv_lens = w.sample_lengths()
    kw = {"heads": w.heads, "head_dim": w.head_dim, "causal": w.causal}
    count = max(1, round(fwd_flops(q_lens, kv_lens, **kw) / fwd_flops([length], [length], **kw)))
    return dataclasses.replace(
        w, name=f"{w.name} dense-equal ({count}x{length})", kind="dense", lengths=Fixed(count, length)
    )


def _print_row(r: dict, rows: list[dict]) -> None:
    if len(rows) == 1:
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
        print(f"{'workload':48s} {'schedule':8s} {'W':>5s} {'fwd ms':>8s} {'TFLOP/s':>8s} {'bwd ms':>8s} {'TFLOP/s':>8s}")
    base = next((x for x in rows if x["workload"] == r["workload"] and x["schedule"] == "none"), None)
    vs = f"  x{base['fwd_ms'] / r['fwd_ms']:.2f} / x{base['bwd_ms'] / r['bwd_ms']:.2f} vs none" if base and base is not r else ""
    print(
        f"{r['workload']:48s} {r['schedule']:8s} {r['workers']!s:>5s} {r['fwd_ms']:8.3f} "
        f"{r['fwd_tflops']:8.1f} {r['bwd_ms']:8.3f} {r['bwd_tflops']:8.1f}{vs}",
        flush=True,
    )


def kernels(
    workloads: Sequence[Workload], schedules: Sequence[str], workers: Sequence[int | None] = (None,),
    reps: int = 20, csv_path: str | None = None,
) -> list[dict]:
    """Run the kernel A/B and print a table; returns the rows (and writes them to ``csv_path``)."""
    from jagflash.core.tile_scheduler import occupancies

    rows = []
    for w in workloads:
        for schedule in schedules:
            for n in (workers if schedule != "none" else (None,)):
                rows.append(measure(w, schedule, workers=n, reps=reps))
                _print_row(rows[-1], rows)
        dense = measure(dense_equivalent(w), "static", workers=None, reps=reps)
        rows.append(dense)
        _print_row(dense, rows)
        mine = [r for r in rows if r["workload"] == w.name]
        fwd = max(mine, key=lambda r: r["fwd_tflops"])
        bwd = max(mine, key=lambda r: r["bwd_tflops"])
        print(
            f"    jagged / dense rate at equal FLOPs: fwd {fwd['fwd_tflops'] / dense['fwd_tflops']:.0%} "
            f"({fwd['schedule']}), bwd {bwd['bwd_tflops'] / dense['bwd_tflops']:.0%} ({bwd['schedule']})",
            flush=True,
        )
    print("programs per SM of the persistent kernels (W = SMs x this unless --workers):")
    for name, occ in occupancies().items():
        print(f"  {occ}  {name}")
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return rows


# --- plan-time and simulate -----------------------------------------------------------------


def _time_us(fn: Callable[[], object], device: torch.device, reps: int) -> tuple[float, float, float]:
    """Median µs per call: synchronised wall clock, host time to enqueue, and a graph replay."""
    for _ in range(5):
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    wall, host = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e6)
        wall.append((t2 - t0) * 1e6)
    graph = float("nan")
    if device.type == "cuda":
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            fn()
        g.replay()
        sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        sync()
        graph = start.elapsed_time(end) * 1e3 / reps
    return statistics.median(wall), statistics.median(host), graph


def plan_time(w: Workload, device: torch.device, reps: int, profile: bool = False) -> None:
    from jagflash.core.plan.build import make_plan
    from jagflash.core.plan.model import SCHEDULES

    q_lens = w.sample_lengths()[0]
    backend = "portable" if device.type == "cuda" else "interpreter"
    print(
        f"make_plan on {w.name}: B={len(q_lens)}, T={int(q_lens.sum())}, Hq={w.heads}, "
        f"Hkv={w.hkv}, D={w.head_dim}, causal={w.causal}, device={device}"
    )
    for schedule in SCHEDULES:
        for backward in (False, True):
            kw = plan_kwargs(w, schedule, device=device, backend=backend, backward=backward)
            wall, host, graph = _time_us(lambda kw=kw: make_plan(**kw), device, reps)
            print(
                f"  {schedule:8s} backward={backward!s:5s} rows={make_plan(**kw).info.rows:6d}  "
                f"median {wall:8.1f} us  (host enqueue {host:8.1f} us, CUDA-graph replay {graph:7.1f} us)"
            )
    if profile:
        import cProfile
        import pstats

        kw = plan_kwargs(w, "static", device=device, backend=backend)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(reps):
            make_plan(**kw)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def simulate(workers: int) -> None:
    from jagflash.core.plan.build import make_plan
    from jagflash.core.plan.model import PASSES, SCHEDULES
    from jagflash.core.plan.simulate import simulate_plan

    print(f"simulated efficiency, W={workers} (fwd / dq / dkdv), and the forward's sequences in flight")
    for w in jagged_workloads():
        cells = []
        for schedule in SCHEDULES:
            plan = make_plan(**plan_kwargs(w, schedule))
            sims = [simulate_plan(plan, p, workers) for p in PASSES]
            effs = "/".join(f"{x.efficiency:.3f}" for x in sims)
            cells.append(f"{schedule} {effs} [{sims[0].sequences_in_flight:.0f}]")
        print(f"  {w.name:36s} " + "  ".join(cells))


# --- command line ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    from jagflash.core.plan.model import SCHEDULES

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    k = sub.add_parser("kernels", help="the portable kernels under each schedule (GPU)")
    k.add_argument("--workloads", default="*", help="comma-separated globs over the bench's jagged workloads")
    k.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated kinds; fwd/bwd for a backward of its own kind, e.g. static/none")
    k.add_argument("--workers", default="0", help="comma-separated worker counts for static/dynamic; 0 = the SM count")
    k.add_argument("--reps", type=int, default=20)
    k.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    k.add_argument("--csv", default=None)
    t = sub.add_parser("plan-time", help="make_plan's build time per schedule")
    names = [n for n, w in WORKLOADS.items() if w.kind == "jagged"]
    t.add_argument("--workload", default="jagged-lognormal-d128", choices=names)
    t.add_argument("--device", default="cuda")
    t.add_argument("--reps", type=int, default=200)
    t.add_argument("--profile", action="store_true", help="also print where the host time of a build goes")
    s = sub.add_parser("simulate", help="simulated efficiency of each schedule (CPU)")
    s.add_argument("--workers", type=int, default=132, help="W, the persistent programs")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.what == "simulate":
        simulate(args.workers)
        return 0
    device = torch.device(getattr(args, "device", "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{args.what} needs a CUDA GPU here (the interpreter's timings mean nothing)")
    if args.what == "plan-time":
        plan_time(WORKLOADS[args.workload], device, args.reps, args.profile)
        return 0
    chosen = [dataclasses.replace(w, dtype=args.dtype) for w in jagged_workloads(args.workloads)]
    kernels(
        chosen, [s.strip() for s in args.schedules.split(",")],
        [int(x) or None for x in args.workers.split(",")], args.reps, args.csv,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
