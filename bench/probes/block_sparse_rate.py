"""Probe (one GPU; issue 22): block-sparse attention against density, and what a mask costs to
build, on a bench workload's batch.

    python bench/probes/block_sparse_rate.py --workload jagged-lognormal-causal-d128 --csv $OUT/bs.csv
    python bench/probes/block_sparse_rate.py --workload dense-b4h16n8192d128 --block 128
    TRITON_INTERPRET=1 python bench/probes/block_sparse_rate.py --smoke    # the CPU, tiny, no figures

For each density (random per-sequence grids, one list for every head) it times
``block_sparse_attention`` forward and forward + backward (the plan built once outside the
timing, as the bench does), beside the jagged variant's dense call on the same batch (its
fastest backend and the portable kernels: the baseline the issue's >= 3.2x at 25 % is against),
and times building the mask: ``BlockMask.from_dense`` of the grid and ``from_mask_mod`` of a
local + global rule given the max lengths (the issue's goal: <= 10 % of one forward). Rows:
``what, density, ms_p50 (fwd), ms_p50 (fwd+bwd), listed blocks``. FLOP rates are not printed:
the listed blocks' visible pairs under causal are what a rate would divide by.
"""

from __future__ import annotations

import argparse
import csv
import sys

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="jagged-lognormal-causal-d128")
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--densities", default="0.1,0.25,0.5,1.0")
    ap.add_argument("--smoke", action="store_true", help="the workload's smoke version (CPU interpreter)")
    ap.add_argument("--csv", default=None)
    a = ap.parse_args()

    from jagflash.bench.data import make_batch
    from jagflash.bench.timing import measure
    from jagflash.bench.workloads import get
    from jagflash.core.block_mask import BlockMask
    from jagflash.variants.block_sparse import block_sparse_attention, make_plan
    from jagflash.variants.jagged import jagged_attention
    from jagflash.variants.jagged import make_plan as jagged_plan

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    w = get(a.workload, smoke=a.smoke)
    b = make_batch(w, dev)
    q, k, v = (t.detach().requires_grad_() for t in (b.q, b.k, b.v))
    qo, ko, bs = b.q_offsets, b.kv_offsets, (a.block, a.block)
    nq, nk = -(-b.max_q // a.block), -(-b.max_kv // a.block)
    rows = []

    def timed(fn):
        def step():
            out = fn()
            out.backward(b.dout)
        return measure(fn, dev).p50, measure(step, dev, grad_to_none=(q, k, v)).p50

    for backend in ([None, "portable"] if dev.type == "cuda" else [None]):
        plan = jagged_plan(q, k, qo, ko, causal=w.causal, max_seqlen_q=b.max_q, max_seqlen_kv=b.max_kv, backend=backend)
        f, fb = timed(lambda plan=plan, backend=backend: jagged_attention(q, k, v, qo, ko, causal=w.causal, max_seqlen_q=b.max_q, max_seqlen_kv=b.max_kv, plan=plan, backend=backend))
        rows.append((f"jagged dense ({backend or 'default'})", 1.0, f, fb, ""))
    gen = torch.Generator(device=dev).manual_seed(0)
    for density in (float(x) for x in a.densities.split(",")):
        grid = torch.rand(len(b.q_lens), 1, nq, nk, generator=gen, device=dev) < density
        build = measure(lambda grid=grid: BlockMask.from_dense(grid, qo, ko, bs), dev).p50
        m = BlockMask.from_dense(grid, qo, ko, bs)
        plan = make_plan(q, k, qo, ko, m, causal=w.causal)
        f, fb = timed(lambda m=m, plan=plan: block_sparse_attention(q, k, v, qo, ko, m, causal=w.causal, plan=plan))
        rows.append(("block_sparse", density, f, fb, int(m.kv_counts.sum())))
        rows.append(("from_dense build", density, build, "", ""))

    def local_global(bb, h, qi, kj):
        return ((qi // 512 - kj // 512).abs() <= 1) | (kj < 128)

    build = measure(lambda: BlockMask.from_mask_mod(local_global, qo, ko, 1, bs, max_seqlen_q=b.max_q, max_seqlen_kv=b.max_kv), dev).p50
    rows.append(("from_mask_mod build (local+global)", "", build, "", ""))
    header = ["what", "density", "fwd_ms_p50", "fwd_bwd_ms_p50", "listed_blocks"]
    csv.writer(sys.stdout).writerows([header, *rows])
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            csv.writer(f).writerows([header, *rows])
    print(f"# {w.name}: {w.describe()}, block {a.block}, device {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}", file=sys.stderr)


if __name__ == "__main__":
    main()
