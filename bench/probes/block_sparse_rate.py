"""Probe (one GPU; issue 22): block-sparse attention against density, and what a mask costs to
build, on a bench workload's batch.

    python bench/probes/block_sparse_rate.py --workload jagged-lognormal-causal-d128 --csv $OUT/bs.csv
    python bench/probes/block_sparse_rate.py --workload dense-b4h16n8192d128 --block 64
    TRITON_INTERPRET=1 python bench/probes/block_sparse_rate.py --smoke    # the CPU, tiny, no figures

For each density (random per-sequence grids, one list for every head) it times
``block_sparse_attention`` forward and forward + backward on each backend that takes the mask
(on a GPU: the default pick, ``tlx-sm90`` for 128 x 128 blocks, ``portable``; the plan built
once outside the timing, as the bench does), beside the jagged variant's dense call on the same
batch (its fastest backend, ``tlx-sm90`` on a Hopper GPU, and the portable kernels: the
baseline the issue's >= 3.2x at 25 % is against), and times building the mask:
``BlockMask.from_dense`` of the grid and ``from_mask_mod`` of a local + global rule given the
max lengths (the issue's goal: <= 10 % of one forward). Rows: ``what, backend, density,
ms_p50 (fwd), ms_p50 (fwd+bwd), listed blocks, TFLOP/s fwd and fwd+bwd`` (FLOPs counted on
the visible pairs: listed blocks cut by causal, ``jagflash.bench.flops.block_mask_pairs``),
and the speed-up of each against the dense jagged call of the same backend (``tlx-sm90`` on a
Hopper GPU for the default pick).
"""

from __future__ import annotations

import argparse
import sys

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="jagged-lognormal-causal-d128")
    ap.add_argument("--block", type=int, default=128, help="block size (the TLX kernels take 128)")
    ap.add_argument("--densities", default="0.1,0.25,0.5,1.0")
    ap.add_argument("--smoke", action="store_true", help="the workload's smoke version (CPU interpreter)")
    ap.add_argument("--csv", default=None)
    a = ap.parse_args()

    from jagflash.bench.data import make_batch
    from jagflash.bench.flops import BWD_FACTOR, block_mask_pairs, visible_pairs
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

    heads, dim = q.shape[1], q.shape[2]

    def rates(pairs, f, fb):  # TFLOP/s of the forward and of forward + backward
        flops = 4 * dim * pairs
        return round(flops / f * 1e-9, 1), round(flops * (1 + BWD_FACTOR) / fb * 1e-9, 1)

    on_gpu = dev.type == "cuda"
    dense_pairs = visible_pairs(b.q_lens, b.kv_lens, w.causal) * heads
    dense = {}
    for backend in ([None, "tlx-sm90", "portable"] if on_gpu else [None]):
        plan = jagged_plan(q, k, qo, ko, causal=w.causal, max_seqlen_q=b.max_q, max_seqlen_kv=b.max_kv, backend=backend)
        f, fb = timed(lambda plan=plan, backend=backend: jagged_attention(q, k, v, qo, ko, causal=w.causal, max_seqlen_q=b.max_q, max_seqlen_kv=b.max_kv, plan=plan, backend=backend))
        dense[backend] = (f, fb)
        rows.append(("jagged dense", backend or "default", 1.0, f, fb, "", *rates(dense_pairs, f, fb), "", ""))
    sparse_backends = [None, *(["tlx-sm90"] if a.block == 128 else []), "portable"] if on_gpu else [None]
    gen = torch.Generator(device=dev).manual_seed(0)
    for density in (float(x) for x in a.densities.split(",")):
        grid = torch.rand(len(b.q_lens), 1, nq, nk, generator=gen, device=dev) < density
        build = measure(lambda grid=grid: BlockMask.from_dense(grid, qo, ko, bs), dev).p50
        m = BlockMask.from_dense(grid, qo, ko, bs)
        pairs = block_mask_pairs(m, heads, w.causal)
        for backend in sparse_backends:
            plan = make_plan(q, k, qo, ko, m, causal=w.causal, backend=backend)
            f, fb = timed(lambda m=m, plan=plan, backend=backend: block_sparse_attention(q, k, v, qo, ko, m, causal=w.causal, plan=plan, backend=backend))
            base_f, base_fb = dense["tlx-sm90" if backend is None and on_gpu and a.block == 128 else backend]
            rows.append((
                "block_sparse", backend or "default", density, f, fb, int(m.kv_counts.sum()), *rates(pairs, f, fb),
                round(base_f / f, 2), round(base_fb / fb, 2),
            ))
        rows.append(("from_dense build", "", density, build, "", "", "", "", "", ""))

    def local_global(bb, h, qi, kj):
        return ((qi // 512 - kj // 512).abs() <= 1) | (kj < 128)

    build = measure(lambda: BlockMask.from_mask_mod(local_global, qo, ko, 1, bs, max_seqlen_q=b.max_q, max_seqlen_kv=b.max_kv), dev).p50
    rows.append(("from_mask_mod build (local+global)", "", "", build, "", "", "", "", "", ""))
    header = [
        "what", "backend", "density", "fwd_ms_p50", "fwd_bwd_ms_p50", "listed_blocks", "fwd_tflops", "fwd_bwd_tflops",
        "fwd_speedup_vs_dense", "fwd_bwd_speedup_vs_dense",
    ]
    from jagflash.bench.report import emit_table

    emit_table([header, *rows], a.csv)
    print(f"# {w.name}: {w.describe()}, block {a.block}, device {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}", file=sys.stderr)


if __name__ == "__main__":
    main()
