"""Probe (H200; issues 22, 20): the TLX forward with and without the tile ring (``RING_TILES``),
in one process on the same inputs and plan.

    python bench/probes/tile_ring_ab.py --workloads bs-lognormal-d25,bs-dense8k-d25,jagged-lognormal-causal-d128

For each workload (its batch, and for a ``bs-*`` one its block pattern, as the bench builds
them) the forward kernel (``jagflash.core.tlx.fwd_sm90.forward``, the plan built once outside
the timing) runs with the ring on and off, the rest of the config the policy's; the two outputs
must be bitwise equal (the ring moves where the tile's fields are read and when the producer
decodes a tile, not what is computed), and each is timed with the bench's ``measure`` (median,
L2 flushed). Rows: ``workload, ring, policy (the ring the policy picks), ms_p50, TFLOP/s
(visible pairs, or listed pairs of a block mask), listed blocks, tiles, tiles with no listed
block`` (the last three blank without a mask).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys

import torch

#: The rows timed by default: the block-sparse forward's, and the non-sparse rows the ring serves
#: (tiny: on by the policy) or not (lognormal: off).
DEFAULT_WORKLOADS = (
    "bs-lognormal-d25", "bs-dense8k-d25", "bs-lognormal-d10", "bs-lognormal-local-global",
    "jagged-tiny-d128", "jagged-lognormal-causal-d128", "jagged-lognormal-d128",
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    a = ap.parse_args()

    from jagflash.bench.data import make_batch
    from jagflash.bench.flops import block_mask_pairs, visible_pairs
    from jagflash.bench.sparsity import make_block_mask
    from jagflash.bench.timing import measure
    from jagflash.bench.workloads import get
    from jagflash.core.tlx import fwd_sm90

    dev = torch.device("cuda")
    print("workload,ring,policy,ms_p50,tflops,listed_blocks,tiles,empty_tiles")
    for name in a.workloads.split(","):
        w = get(name)
        b = make_batch(w, dev)
        q, k, v, qo, ko = b.q, b.k, b.v, b.q_offsets, b.kv_offsets
        m = None if w.blocks is None else make_block_mask(w.blocks, b.q_lens, b.kv_lens, w.causal, qo, ko)
        hq, dim = q.shape[1], q.shape[2]
        left, right = (-1, 0) if w.causal else (-1, -1)
        plan, want = fwd_sm90.plan_and_config(q, k, qo, ko, b.max_q, left=left, right=right, scale=dim**-0.5, blocks=m)
        bm = want.BLOCK_M
        if m is None:
            pairs, listed, tiles, empty = visible_pairs(b.q_lens, b.kv_lens, w.causal) * hq, "", "", ""
        else:
            lq = (qo[1:] - qo[:-1]).to(torch.int64)
            own = torch.arange(m.kv_counts.shape[2], device=dev)[None, None, :] * bm < lq[:, None, None]  # the sequences' own q-blocks
            counts = m.kv_counts.expand(-1, hq, -1)[own.expand(-1, hq, -1)]
            pairs, listed = block_mask_pairs(m, hq, w.causal), int(counts.sum())
            tiles, empty = counts.numel(), int((counts == 0).sum())
        outs = {}
        for ring in (True, False):
            fwd = functools.partial(
                fwd_sm90.forward, q, k, v, qo, ko, b.max_q, left=left, right=right, scale=dim**-0.5, plan=plan,
                config=dataclasses.replace(want, RING_TILES=ring), blocks=m,
            )
            outs[ring] = fwd()
            ms = measure(fwd, dev).p50
            print(f"{name},{int(ring)},{int(want.RING_TILES)},{ms:.4f},{4 * dim * pairs / ms * 1e-9:.1f},{listed},{tiles},{empty}", flush=True)
        same = all(torch.equal(x, y) for x, y in zip(outs[True], outs[False]))
        print(f"# {name}: ring on/off outputs bitwise equal: {same}", file=sys.stderr, flush=True)
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
