"""Probe (H200): what dQ costs broadcast-Q's one-pass backward. Every kv-tile of every sequence
adds its share of dQ into the one shared fp32 accumulator ``[Lq, Hq * D]`` (512 KB at Lq 64,
H16, D128), so at Lq 64 x 1,024 sequences ~6,000 tiles a head reduce-add 32 KB each into the
same L2 lines. This times, kernels alone, on the bench's broadcast-Q workloads (``bq-*``: bf16,
H16, D128, lognormal K/V lengths, median 512; ``jagflash.bench.data.make_batch``'s inputs; until
session 10 the probe drew its own lengths, other draws of the same distribution): the one pass
(TMA reduce-adds, as calls run it) and the same kernel without dQ (``backward_dkdv`` on the
same plan: what any change to the dQ write-back can win at most); and prints TFLOP/s (backward
= 2.5 x the forward's 4 * Lq * sum(Lk) * D * H) and the time to move K, V, dK, dV once at the copy
ceiling the bench measured (4.24 TB/s).

Run on the GPU: ``PROBE=bench/probes/probe_bq_backward.py bash bench/gpu.sh probe``."""

from __future__ import annotations

import argparse
import functools

from triton.testing import do_bench

from jagflash.bench.data import make_batch
from jagflash.bench.flops import bwd_flops, fwd_flops
from jagflash.bench.workloads import get
from jagflash.core.plan.build import make_plan
from jagflash.core.tlx import bwd_sm90, fwd_sm90
from jagflash.core.tuning import default_schedules

COPY_TB_S = 4.24  # the bench's device-copy ceiling on this H200 (session 10)


WORKLOADS = ("bq-lq64-b1024", "bq-lq256-b256", "bq-lq256-b64", "bq-lq1024-b64")


def _case(name: str) -> None:
    w = get(name)
    b = make_batch(w, "cuda")
    lq, count, heads, dim, total = w.q_len, b.num_seqs, w.heads, w.head_dim, b.total_kv
    q, k, v, kv_offs, q_offs = b.q, b.k, b.v, b.kv_offsets, b.q_offsets
    dout = b.dout.view(count * lq, heads, dim)  # [B, Lq, Hq, D] as the kernels' [B * Lq, Hq, D]
    scale = dim**-0.5
    schedule, bwd_schedule = default_schedules("tlx-sm90", dim)
    plan = make_plan(
        q_offs, kv_offs, total_q=count * lq, total_kv=total, heads_q=heads, heads_kv=heads,
        window=(-1, -1), block_m=128, block_n=128,
        dkdv_blocks=(64, 128), backward=True, schedule=schedule,
        backward_schedule=bwd_schedule,
    )
    out, lse = fwd_sm90.forward(q, k, v, q_offs, kv_offs, lq, left=-1, right=-1, scale=scale, plan=plan, q_shared=True)
    delta = (dout.float() * out.float()).sum(-1).t().contiguous()  # [Hq, Tq], as the kernels take it
    kw = dict(left=-1, right=-1, scale=scale, plan=plan, q_shared=True)
    one_pass = functools.partial(bwd_sm90.backward, dout, q, k, v, out, lse, q_offs, kv_offs, **kw)
    dkdv_alone = functools.partial(bwd_sm90.backward_dkdv, dout, q, k, v, lse, delta, q_offs, kv_offs, **kw)
    ref = one_pass()
    flops = bwd_flops(fwd_flops(b.q_lens, b.kv_lens, heads=heads, head_dim=dim))
    moved = 4 * total * heads * dim * 2  # K, V read and dK, dV written, bf16
    print(f"bq Lq{lq} x {count}: {total} keys; K, V, dK, dV once at {COPY_TB_S} TB/s: {moved / COPY_TB_S / 1e9:.3f} ms", flush=True)
    for mode, run in (("one pass, TMA dQ", one_pass), ("dK/dV alone, no dQ", dkdv_alone)):
        got = run()
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(got[-2:], ref[-2:]))
        ms = do_bench(run, warmup=10, rep=300, return_mode="median")
        print(f"  {mode:22s} {ms:8.3f} ms {flops / ms / 1e9:8.1f} TFLOP/s   max|dK,dV - one pass| {diff:.2e}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workloads", nargs="*", default=WORKLOADS, help=f"default: {WORKLOADS}")
    for name in parser.parse_args(argv).workloads:
        _case(name)


if __name__ == "__main__":
    main()
