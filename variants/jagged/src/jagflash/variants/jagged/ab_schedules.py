"""A/B of the portable jagged kernels' schedules on a GPU: ``none`` (batch order, one program a
tile), ``static`` (cost-sorted, zigzag over persistent workers), ``dynamic`` (cost-sorted,
atomic tile counter) and ``grouped`` (sequences cost-sorted, their tiles together, zigzag),
forward and backward, on the bench's skewed jagged workloads; and the
jagged rate as a fraction of the dense rate (the same kernels on equal lengths) at equal FLOPs.

    python -m jagflash.variants.jagged.ab_schedules                       # every workload
    python -m jagflash.variants.jagged.ab_schedules --workloads '*causal*' --workers 0,264
    python -m jagflash.variants.jagged.ab_schedules --schedules none,static,static/none --csv ab.csv

A schedule ``fwd/bwd`` gives the backward passes their own kind (``backward_schedule``).

Times are medians of CUDA-event timings of the ops alone (``jagflash::jagged_fwd`` /
``jagged_bwd`` with a prebuilt plan), after a warm-up that compiles the kernels. FLOPs count the
visible (query, key) pairs: forward ``4 * pairs * D * Hq``, backward 2.5 times that.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from jagflash.core.jagged import offsets_from_lengths
from jagflash.core.mask import mask_bounds, visible_pairs
from jagflash.core.plan.model import SCHEDULES
from jagflash.core.tile_scheduler import occupancies
from jagflash.variants.jagged import make_plan
from jagflash.variants.jagged import op as jop

# The bench's jagged workloads, moved here from core (which cannot import jagflash.bench):
# same distributions, seeds and shapes as ``jagflash.bench.workloads.WORKLOADS``. An A/B
# belongs in bench/ (DESIGN), where it would take them from there instead.


def _lognormal(rng: np.random.Generator) -> np.ndarray:
    return np.clip(np.rint(512 * np.exp(rng.standard_normal(128))), 1, 4096).astype(np.int64)


def _heavy_tail(rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(np.concatenate([np.full(2, 4096), rng.integers(32, 768, size=120)]))


def _tiny(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(1, 64, size=2048, dtype=np.int64)


def _bimodal(rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(np.concatenate([rng.integers(64, 256, size=112), rng.integers(2048, 4097, size=16)]))


@dataclass(frozen=True)
class JaggedWorkload:
    """A bench jagged workload: self-attention over ``lengths()``, shapes and mask."""

    name: str
    sample: object  # rng -> int64 lengths
    heads: int = 16
    kv_heads: int = 16
    head_dim: int = 128
    causal: bool = False
    seed: int = 0

    def lengths(self) -> list[int]:
        return [int(x) for x in self.sample(np.random.default_rng(self.seed))]  # type: ignore[operator]


BENCH_JAGGED = {
    w.name: w
    for w in (
        JaggedWorkload("jagged-lognormal-d128", _lognormal),
        JaggedWorkload("jagged-lognormal-causal-d128", _lognormal, causal=True),
        JaggedWorkload("jagged-heavytail-d128", _heavy_tail),
        JaggedWorkload("jagged-tiny-d128", _tiny),
        JaggedWorkload("jagged-bimodal-d128", _bimodal),
        JaggedWorkload("jagged-lognormal-d64", _lognormal, head_dim=64),
        JaggedWorkload("jagged-lognormal-causal-d64", _lognormal, head_dim=64, causal=True),
        JaggedWorkload("jagged-lognormal-gqa4-d128", _lognormal, kv_heads=4),
        JaggedWorkload("jagged-lognormal-causal-gqa4-d128", _lognormal, kv_heads=4, causal=True),
    )
}

#: The skewed workloads the A/B runs by default (every jagged workload of the bench).
DEFAULT_WORKLOADS = tuple(BENCH_JAGGED)


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


def _inputs(lens: Sequence[int], w: JaggedWorkload, dtype: torch.dtype, seed: int = 0) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lens)

    def randn(h: int) -> torch.Tensor:
        return torch.randn(total, h, w.head_dim, device="cuda", dtype=dtype, generator=gen)

    offsets = offsets_from_lengths(list(lens), "cuda")
    return {
        "q": randn(w.heads), "k": randn(w.kv_heads), "v": randn(w.kv_heads), "dout": randn(w.heads),
        "offsets": offsets, "max_len": max(lens, default=0),
    }


def _fwd_flops(lens: Sequence[int], w: JaggedWorkload) -> float:
    left, right = mask_bounds(w.causal)
    lt = torch.tensor(list(lens), dtype=torch.int64)
    return 4.0 * float(visible_pairs(lt, lt, left, right).sum()) * w.head_dim * w.heads


def measure(
    w: JaggedWorkload, lens: Sequence[int], schedule: str, *, workers: int | None, reps: int,
    dtype: torch.dtype,
) -> dict:
    """Forward and backward ms and TFLOP/s of one workload under one schedule."""
    t = _inputs(lens, w, dtype)
    q, k, v, offsets, longest = t["q"], t["k"], t["v"], t["offsets"], t["max_len"]
    fwd, _, bwd = schedule.partition("/")
    plan = make_plan(
        q, k, offsets, offsets, causal=w.causal, schedule=fwd, backward_schedule=bwd or None,
        workers=workers, max_seqlen_q=longest, max_seqlen_kv=longest,
    )
    scale = w.head_dim ** -0.5
    extras = (offsets, offsets, longest, longest, w.causal, scale, False, False, "portable", *plan.op_args())
    out, lse = jop.jagged_fwd(q, k, v, *extras)
    fwd_ms = _time_ms(lambda: jop.jagged_fwd(q, k, v, *extras), reps)
    bwd_ms = _time_ms(lambda: jop.jagged_bwd(t["dout"], q, k, v, out, lse, *extras), reps)
    flops = _fwd_flops(lens, w)
    return {
        "workload": w.name, "schedule": schedule, "workers": plan.info.workers or "SMs",
        "tokens": sum(lens), "fwd_ms": fwd_ms, "bwd_ms": bwd_ms,
        "fwd_tflops": flops / fwd_ms * 1e-9, "bwd_tflops": 2.5 * flops / bwd_ms * 1e-9,
    }


def dense_equivalent(w: JaggedWorkload, lens: Sequence[int], length: int = 4096) -> list[int]:
    """Equal lengths ``length`` with about the FLOPs of ``lens`` (at least one sequence)."""
    one = _fwd_flops([length], w)
    return [length] * max(1, round(_fwd_flops(lens, w) / one))


def run(
    workloads: Sequence[str] = DEFAULT_WORKLOADS,
    schedules: Sequence[str] = SCHEDULES,
    workers: Sequence[int | None] = (None,),
    reps: int = 20,
    dtype: torch.dtype = torch.bfloat16,
    csv_path: str | None = None,
) -> list[dict]:
    """Run the A/B and print a table; returns the rows (and writes them to ``csv_path``)."""
    rows = []
    for name in workloads:
        w = BENCH_JAGGED[name]
        lens = w.lengths()
        for schedule in schedules:
            for n in (workers if schedule != "none" else (None,)):
                rows.append(measure(w, lens, schedule, workers=n, reps=reps, dtype=dtype))
                _print_row(rows[-1], rows)
        dense_lens = dense_equivalent(w, lens)
        dense = measure(w, dense_lens, "static", workers=None, reps=reps, dtype=dtype)
        dense["workload"] = f"{name} dense-equal ({len(dense_lens)}x{dense_lens[0]})"
        rows.append(dense)
        _print_row(dense, rows)
        mine = [r for r in rows if r["workload"] == name]
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jagflash.variants.jagged.ab_schedules", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="*", help="comma-separated globs over the bench's jagged workload names")
    parser.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated kinds; fwd/bwd for a backward of its own kind, e.g. static/none")
    parser.add_argument("--workers", default="0", help="comma-separated worker counts for static/dynamic; 0 = the SM count")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--csv", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the A/B needs a CUDA GPU (the interpreter's timings mean nothing)")
    pats = [p.strip() for p in args.workloads.split(",") if p.strip()]
    names = [n for n in BENCH_JAGGED if any(fnmatch.fnmatchcase(n, p) for p in pats)]
    if not names:
        raise SystemExit(f"no workload matches {args.workloads}; known: {', '.join(BENCH_JAGGED)}")
    run(
        names, [s.strip() for s in args.schedules.split(",")],
        [int(x) or None for x in args.workers.split(",")], args.reps,
        getattr(torch, args.dtype), args.csv,
    )


if __name__ == "__main__":
    main()
