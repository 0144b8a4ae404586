"""The tile cost model, and one pass's section of the table built from it in torch.

A forward (or dQ) q-tile costs the kv-tiles it visits under the mask
(:func:`jagflash.core.mask.kv_tile_ranges`); a dK/dV kv-tile costs the q-tiles it visits
(:func:`jagflash.core.mask.dkdv_q_ranges`). Tiles of no row do not exist; a tile that sees
nothing stays (it writes zeros and LSE -inf) and sorts as costing one partner tile
(:data:`MIN_SORT_COST`): writing its output is work, and costed 0 such tiles would all end a
cost-sorted table, every program writing zeros at once with nothing to overlap (bench/NOTES.md,
session 29). The ``grouped`` schedule sorts by its sequence's cost (q-tiles x kv-tiles) first,
then by the tile's, in one key below 2**31.

With a block mask (``listed``: its bool grid, ``jagflash.core.block_mask.BlockMask.to_dense``)
a tile costs the listed blocks of its band summed over the mask's heads
(:func:`jagflash.core.mask.listed_blocks`) and a sequence its listed blocks: sparse rows
balance by what the kernels visit. Only this torch build takes a mask.

Everything here is torch on the offsets' device; the Triton build
(:mod:`jagflash.core.plan.build`) computes the same costs and keys and is tested against it.
"""

from __future__ import annotations

import torch

from jagflash.core.jagged import slots_of
from jagflash.core.mask import dkdv_q_ranges, kv_tile_ranges, listed_blocks
from jagflash.core.plan.model import PassLayout

__all__ = ["MIN_SORT_COST", "tile_costs"]


def tile_costs(
    side: str,
    start: torch.Tensor,
    lq: torch.Tensor,
    lk: torch.Tensor,
    block_m: int,
    block_n: int,
    left: int,
    right: int,
) -> torch.Tensor:
    """Cost of tiles starting at row ``start`` of sequences with ``lq`` queries, ``lk`` keys:
    kv-tiles visited by a q-tile (``side="q"``: forward, dQ) or q-tiles visited by a kv-tile
    (``side="kv"``: dK/dV), int64."""
    if side == "q":
        lo, _, _, hi = kv_tile_ranges(start, lq, lk, block_m, block_n, left, right)
        return torch.div(hi - lo + block_n - 1, block_n, rounding_mode="floor")
    lo, _, _, hi = dkdv_q_ranges(start, lq, lk, block_m, block_n, left, right)
    return torch.div(hi - lo, block_m, rounding_mode="floor")


#: The least cost a tile sorts by (its output is written even when it visits nothing: see the
#: module's docstring); the Triton build (``jagflash.core.plan.build``) uses the same floor.
MIN_SORT_COST = 1

_TILE_COST_ROOM = 1 << 13  # grouped key: sequence cost * room + tile cost, below 2**31


def _seq_cost(lq: torch.Tensor, lk: torch.Tensor, block_m: int, block_n: int) -> torch.Tensor:
    """The ``grouped`` schedule's first sort key: a sequence's q-tiles times its kv-tiles
    (capped so that the key, with the tile's cost below it, stays under 2**31)."""
    tq = torch.div(lq.clamp(min=0) + block_m - 1, block_m, rounding_mode="floor")
    tk = torch.div(lk.clamp(min=0) + block_n - 1, block_n, rounding_mode="floor")
    return (tq * tk).clamp(max=(2**31 - 1) // _TILE_COST_ROOM - 1)


def _section(
    lengths: torch.Tensor, lq: torch.Tensor, lk: torch.Tensor, side: str, lay: PassLayout,
    left: int, right: int, sort: int, listed: torch.Tensor | None = None, sub: int = 1, grid_block: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass's rows ``[lay.rows, 3]`` int32 and its valid-tile count (a device scalar);
    ``listed``: a block mask's grid ``[B, Hm, tiles, partners]`` for this side, or None;
    ``sub``: the pass's partner tiles per partner block of the mask
    (:func:`jagflash.core.mask.listed_blocks`); ``grid_block``: the grid's rows per block on
    this side where they differ from the pass's tile (a tile then costs its block's row)."""
    dev = lengths.device
    batch = lengths.numel()
    block = lay.block_m if side == "q" else lay.block_n
    if batch == 0 or lay.tiles == 0:
        return torch.full((lay.rows, 3), -1, dtype=torch.int32, device=dev), torch.zeros((), dtype=torch.int64, device=dev)
    per_seq = torch.div(lengths.clamp(min=0) + block - 1, block, rounding_mode="floor")
    seq, item, valid = slots_of(per_seq, lay.tiles)
    start = item * block
    if listed is None:
        cost = tile_costs(side, start, lq[seq], lk[seq], lay.block_m, lay.block_n, left, right)
        seq_cost = _seq_cost(lq[seq], lk[seq], lay.block_m, lay.block_n)
    else:
        cost, seq_cost = _listed_costs(listed, side, seq, start, grid_block or block, lq, lk, lay, left, right, sub)
    cost = cost.clamp(min=MIN_SORT_COST)
    if sort == 2:  # grouped: the sequence's cost, q-tiles x kv-tiles, then the tile's
        cost = seq_cost * _TILE_COST_ROOM + cost.clamp(max=_TILE_COST_ROOM - 1)
    cost = torch.where(valid, cost, -1)
    if sort:
        order = torch.sort(cost, descending=True, stable=True).indices
        seq, start, valid = seq[order], start[order], valid[order]
    head = torch.arange(lay.heads, device=dev)
    rows = torch.stack(torch.broadcast_tensors(seq[:, None], head[None, :], start[:, None]), -1)
    rows = torch.where(valid[:, None, None], rows, -1).to(torch.int32).reshape(lay.rows, 3)
    count = torch.clamp(per_seq.sum(), max=lay.tiles) * lay.heads
    return rows, count


def _listed_costs(listed, side, seq, start, block, lq, lk, lay: PassLayout, left: int, right: int, sub: int):
    """Tile and sequence costs under a block mask (:func:`_section`'s ``listed``)."""
    if listed.shape[2] == 0 or listed.shape[3] == 0:
        zero = torch.zeros_like(seq)
        return zero, zero
    tile = torch.div(start, block, rounding_mode="floor").clamp(0, listed.shape[2] - 1)
    rows = listed[seq, :, tile]  # [tiles, Hm, partners]
    cost = listed_blocks(side, start[:, None], lq[seq][:, None], lk[seq][:, None], lay.block_m, lay.block_n, left, right, rows, sub)
    per_seq = listed.sum((1, 2, 3)).clamp(max=(2**31 - 1) // _TILE_COST_ROOM - 1)
    return cost.sum(-1), per_seq[seq]
