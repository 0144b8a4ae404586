"""Probe (H200; issue 22): where in a dynamic plan's table the tiles with nothing to compute
should sit, timed on the TLX forward (and the one-pass backward's dK/dV table).

    python bench/probes/empty_order_ab.py --workloads bs-lognormal-d25,bs-lognormal-d10
    python bench/probes/empty_order_ab.py --kernel bwd --workloads bs-dense8k-d25

A tile that visits no block (a q-tile whose row of the block mask lists nothing in its band, a
kv-tile no q-step sees) only writes zeros (O 0 and LSE -inf, or dK = dV = 0). Costed 0, such tiles
end a cost-sorted table (each head's span of it, under the head-major walk): every program
writing zeros at once, bound by the write bandwidth with nothing to overlap (bench/NOTES.md,
session 28: 14,320 such forward tiles took 0.215 ms alone). This probe reorders the built plan's
table, the other tiles kept in their order, and times the kernel on each order in one process:

- ``policy``: the table as built (the builder costs an empty tile as one block since session 29:
  ``jagflash.core.plan.cost.MIN_SORT_COST``);
- ``as-one``: empty tiles costed as one block (a stable sort: they join the last cost class; the
  policy's order since that session, kept as a check that the two agree);
- ``zero-last``: empty tiles after all the others (of their sequence's run in a grouped table):
  the builder's order before the floor;
- ``spread``: empty tiles spaced evenly through the table;
- ``first``: empty tiles first.

Outputs must be bitwise equal to the policy's (the order moves work between programs, not
arithmetic; dQ of the backward adds in a run-dependent order and is compared to rounding).
Rows: ``workload, kernel, order, ms_p50, empty tiles, tiles``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys

import torch

#: The batches timed by default: block-sparse rows with many empty q-tiles and one with few.
DEFAULT_WORKLOADS = ("bs-lognormal-d25", "bs-lognormal-d10", "bs-lognormal-local-global", "bs-dense8k-d25")
ORDERS = ("policy", "as-one", "zero-last", "spread", "first", "policy")


def tile_costs(plan, pass_: str, mask, q_offsets: torch.Tensor, kv_offsets: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """Blocks each valid row of ``pass_``'s table visits (``jagflash.core.mask.listed_blocks``:
    the forward's kv-blocks of a q-tile, the dK/dV pass's q-steps of a kv-tile), int64."""
    from jagflash.core.mask import listed_blocks

    lay = plan.info.layout(pass_)
    rows = plan.section(pass_)[: plan.count(pass_)].to(torch.int64)
    seq, head, start = rows[:, 0], rows[:, 1], rows[:, 2]
    grid = mask.to_dense()  # [B, Hm, nQ, nK]
    hm = head if grid.shape[1] > 1 else torch.zeros_like(head)
    lq = (q_offsets[1:] - q_offsets[:-1]).to(torch.int64)[seq]
    lk = (kv_offsets[1:] - kv_offsets[:-1]).to(torch.int64)[seq]
    if pass_ == "fwd":
        listed = grid[seq, hm, torch.div(start, mask.block_size[0], rounding_mode="floor")]
        return listed_blocks("q", start, lq, lk, lay.block_m, lay.block_n, left, right, listed)
    group = plan.info.heads_q // plan.info.heads_kv
    total = torch.zeros_like(start)
    for g in range(group):  # a kv-tile's steps over its GQA group
        h = head * group + g
        hm = h if grid.shape[1] > 1 else torch.zeros_like(h)
        listed = grid[seq, hm, :, torch.div(start, mask.block_size[1], rounding_mode="floor")]
        total += listed_blocks("kv", start, lq, lk, lay.block_m, lay.block_n, left, right, listed, mask.block_size[0] // lay.block_m)
    return total


def reorder(plan, pass_: str, costs: torch.Tensor, order: str):
    """A copy of ``plan`` whose ``pass_`` rows are in ``order`` (the module's list). Rows move a
    tile slot at a time (the ``heads`` rows of one tile, side by side: the kernels' head-major
    walk reads the table so); a slot costs its largest row (the bench's masks are shared by
    the heads, so a slot's rows cost the same: the builder's cost of the slot), empty at 0."""
    from jagflash.core.plan.model import sort_kind

    lay = plan.info.layout(pass_)
    n = costs.numel()
    heads = lay.heads
    slots = n // heads
    slot_cost = costs.reshape(slots, heads).max(1).values
    table = plan.section(pass_)[:n].reshape(slots, heads, 3)
    idx = torch.arange(slots, device=costs.device)
    empty = slot_cost == 0
    if order == "policy":
        perm = idx
    elif order == "as-one":
        # the builder's order with the floor: cost, then slot (sequence, first row)
        first = table[:, 0].to(torch.int64)
        perm = idx
        for key in (first[:, 2], first[:, 0], -torch.clamp(slot_cost, min=1)):
            perm = perm[torch.sort(key[perm], stable=True).indices]
    elif order == "zero-last":
        # empty slots after the others: of the whole table (cost order), or of their own
        # sequence's run (a grouped table)
        seq = table[:, 0, 0].to(torch.int64)
        if sort_kind(plan.info.schedule_of(pass_)) == 2:
            rank = torch.zeros(int(seq.max()) + 1, dtype=torch.int64, device=seq.device)
            rank[seq.flip(0)] = torch.arange(slots - 1, -1, -1, device=seq.device)  # first occurrence
            key = rank[seq] * 2 + empty.to(torch.int64)
        else:
            key = empty.to(torch.int64)
        perm = torch.sort(key, stable=True).indices
    elif order == "first":
        perm = torch.cat([idx[empty], idx[~empty]])
    elif order == "spread":
        e, f = idx[empty], idx[~empty]
        # empty slot k goes before the round((k + 1) * F / (E + 1))-th of the others
        at = torch.round((torch.arange(e.numel(), device=e.device) + 1) * f.numel() / (e.numel() + 1)).to(torch.int64)
        key = torch.cat([torch.arange(f.numel(), device=f.device) * 2 + 1, at * 2])
        perm = torch.cat([f, e])[torch.sort(key, stable=True).indices]
    else:
        raise ValueError(order)
    tiles = plan.tiles.clone()
    sec = tiles[lay.row0 : lay.row0 + lay.rows]
    sec[:n] = table[perm].reshape(n, 3)
    return dataclasses.replace(plan, tiles=tiles)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--kernel", choices=("fwd", "bwd"), default="fwd")
    a = ap.parse_args()

    from jagflash.bench.data import make_batch
    from jagflash.bench.sparsity import make_block_mask
    from jagflash.bench.timing import measure
    from jagflash.bench.workloads import get
    from jagflash.core.plan.model import sort_kind
    from jagflash.core.tlx import bwd_sm90, fwd_sm90

    dev = torch.device("cuda")
    print("workload,kernel,order,ms_p50,empty_tiles,tiles")
    for name in a.workloads.split(","):
        w = get(name)
        if w.blocks is None:
            raise SystemExit(f"{name}: not a block-sparse workload")
        b = make_batch(w, dev)
        q, k, v, qo, ko = b.q, b.k, b.v, b.q_offsets, b.kv_offsets
        m = make_block_mask(w.blocks, b.q_lens, b.kv_lens, w.causal, qo, ko)
        dim = q.shape[2]
        left, right = (-1, 0) if w.causal else (-1, -1)
        kw = {"left": left, "right": right, "scale": dim**-0.5, "blocks": m}
        if a.kernel == "fwd":
            plan, config = fwd_sm90.plan_and_config(q, k, qo, ko, b.max_q, left=left, right=right, scale=dim**-0.5, blocks=m)
            pass_ = "fwd"
        else:
            out, lse = fwd_sm90.forward(q, k, v, qo, ko, b.max_q, **kw)
            plan, config = bwd_sm90.plan_and_config(q, k, qo, ko, left=left, right=right, blocks=m)
            pass_ = "dkdv"
        costs = tile_costs(plan, pass_, m, qo, ko, left, right)
        empties = int((costs == 0).sum())
        grouped = sort_kind(plan.info.schedule_of(pass_)) == 2
        ref = None
        for order in ORDERS:
            if grouped and order == "as-one":  # a global cost sort would undo the sequences' grouping
                continue
            p = reorder(plan, pass_, costs, order)
            if a.kernel == "fwd":
                fn = functools.partial(fwd_sm90.forward, q, k, v, qo, ko, b.max_q, plan=p, config=config, **kw)
            else:
                fn = functools.partial(bwd_sm90.backward, b.dout, q, k, v, out, lse, qo, ko, plan=p, config=config, **kw)
            got = fn()
            if ref is None:
                ref = got
            if a.kernel == "fwd":
                same = all(torch.equal(x, y) for x, y in zip(got, ref))
            else:
                same = torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
                same = same and (got[0].float() - ref[0].float()).abs().max().item() < 1e-2
            ms = measure(fn, dev).p50
            print(f"{name},{a.kernel},{order},{ms:.4f},{empties},{costs.numel()}", flush=True)
            if not same:
                print(f"# {name}: {order}: outputs differ from the policy order's", file=sys.stderr, flush=True)
                sys.exit(1)


if __name__ == "__main__":
    main()
