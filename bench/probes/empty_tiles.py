"""Probe (H200; issue 22): what a q-tile with no listed block costs the TLX block-sparse forward.

    python bench/probes/empty_tiles.py --workloads bs-lognormal-d25,bs-lognormal-d10

For each workload (its batch and block grid as the bench builds them) the forward
(``jagflash.core.tlx.fwd_sm90.forward``, the policy's plan and config, tile ring on and off) runs
on three masks of the same batch: the workload's (``pattern``), none listed (``empty``: every
q-tile visits no block, so the kernel only walks the tiles and writes O = 0 and LSE = -inf) and
every block of the band listed (``full``). ``empty``'s time over the q-tiles an SM walks is the
fixed cost of a tile; the ``pattern`` row's empty tiles times it is what they cost that row.
Rows: ``workload, mask, ring, ms_p50, tiles, empty_tiles, listed_blocks, us_per_tile_per_sm``
(the last: ms * SMs / tiles). Each time is the bench's ``measure`` (median, L2 flushed).
"""

from __future__ import annotations

import argparse
import functools

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="bs-lognormal-d25,bs-lognormal-d10")
    a = ap.parse_args()

    from jagflash.bench.data import make_batch
    from jagflash.bench.sparsity import grid
    from jagflash.bench.timing import measure
    from jagflash.bench.workloads import get
    from jagflash.core.block_mask import BlockMask
    from jagflash.core.tlx import fwd_sm90
    from jagflash.core.tuning import forced_ring

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print("workload,mask,ring,ms_p50,tiles,empty_tiles,listed_blocks,us_per_tile_per_sm")
    for name in a.workloads.split(","):
        w = get(name)
        b = make_batch(w, dev)
        q, k, v, qo, ko = b.q, b.k, b.v, b.q_offsets, b.kv_offsets
        hq, dim = q.shape[1], q.shape[2]
        left, right = (-1, 0) if w.causal else (-1, -1)
        g = grid(w.blocks, b.q_lens, b.kv_lens, w.causal)
        size = (w.blocks.block, w.blocks.block)
        masks = {"pattern": g, "empty": torch.zeros_like(g), "full": torch.ones_like(g)}
        for label, cells in masks.items():
            m = BlockMask.from_dense(cells.to(dev), qo, ko, size)
            lens = (qo[1:] - qo[:-1]).to(torch.int64)
            own = torch.arange(m.kv_counts.shape[2], device=dev)[None, None, :] * size[0] < lens[:, None, None]
            counts = m.kv_counts.expand(-1, hq, -1)[own.expand(-1, hq, -1)]
            tiles, empty, listed = counts.numel(), int((counts == 0).sum()), int(counts.sum())
            plan, want = fwd_sm90.plan_and_config(q, k, qo, ko, b.max_q, left=left, right=right, scale=dim**-0.5, blocks=m)
            for ring in (True, False):
                fwd = functools.partial(
                    fwd_sm90.forward, q, k, v, qo, ko, b.max_q, left=left, right=right, scale=dim**-0.5, plan=plan,
                    config=forced_ring(want, ring), blocks=m,
                )
                fwd()
                ms = measure(fwd, dev).p50
                print(f"{name},{label},{int(ring)},{ms:.4f},{tiles},{empty},{listed},{ms * 1e3 * sms / max(tiles, 1):.3f}", flush=True)


if __name__ == "__main__":
    main()
