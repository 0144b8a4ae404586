"""64 x 64 block masks on kernels of 128 x 128 tiles (the TLX kernels): the tiled view.

:func:`tiled` turns a :class:`jagflash.core.block_mask.BlockMask` of 64 x 64 blocks into one of
128 x 128 tiles: a tile is listed where any of its four blocks is, and each listed tile carries
the four blocks' bits in ``kv_codes`` / ``q_codes`` (int32, the same slots as the indices of
each direction): bit ``2 r + c`` is set where the tile's 64-row half ``r`` sees its 64-key half
``c``. The kernels walk a tiled mask as they walk any 128 x 128 one, and each step masks out
what its tile's bits leave out (``jagflash.core.mask.fine_visible``): a step whose half is not
listed computes scores it then drops, the price of keeping the 128 x 128 tiles (a mask whose
listed blocks come in 2 x 2 groups, as sessions and local bands do, pays little of it).

The tiled mask serves the kernels and their plan (tiles costed by listed tiles); its
``to_dense`` and ``element_mask`` are the tiles', not the mask's. Built on the device with torch
ops, no host sync.
"""

from __future__ import annotations

import torch

from jagflash.core.block_mask import BlockMask, _compress
from jagflash.core.memo import TensorMemo

__all__ = ["FINE_BLOCK", "TILE", "kernel_mask", "plan_grid", "tiled"]

#: The block size :func:`tiled` takes, and the tile it makes of four such blocks.
FINE_BLOCK = (64, 64)
TILE = (128, 128)


#: Tiled masks already made, keyed on the mask's lists (a call's plan, forward and backward each
#: ask for the same one): ``jagflash.core.memo``'s rules, so a write into the lists makes a new one.
TILED_MEMO = TensorMemo(8)


def tiled(mask: BlockMask) -> BlockMask:
    """``mask`` (64 x 64 blocks) as 128 x 128 tiles with each tile's four bits (module docstring)."""
    if tuple(mask.block_size) != FINE_BLOCK:
        raise ValueError(f"tiled: a mask of {FINE_BLOCK} blocks, got {tuple(mask.block_size)}")
    lists = (mask.kv_counts, mask.kv_indices)
    key = TILED_MEMO.key(lists, torch.is_inference_mode_enabled())
    hit = TILED_MEMO.get(key)
    if hit is None:
        hit = _tiled(mask)
        TILED_MEMO.put(key, lists, hit)
    return hit  # type: ignore[return-value]


def _tiled(mask: BlockMask) -> BlockMask:
    grid = mask.to_dense()
    b, hm, nq, nk = grid.shape
    nq2, nk2 = (nq + 1) // 2, (nk + 1) // 2
    blocks = torch.zeros((b, hm, 2 * nq2, 2 * nk2), dtype=torch.int32, device=grid.device)
    blocks[:, :, :nq, :nk] = grid
    bit = torch.tensor([[1, 2], [4, 8]], dtype=torch.int32, device=grid.device)  # [r, c]: 1 << (2 r + c)
    codes = (blocks.view(b, hm, nq2, 2, nk2, 2) * bit[:, None, :]).sum((3, 5), dtype=torch.int32)
    listed = codes != 0
    kv_counts, kv_indices = _compress(listed)
    q_counts, q_indices = _compress(listed.transpose(-1, -2))
    kv_codes = codes.gather(-1, kv_indices.long())
    q_codes = codes.transpose(-1, -2).gather(-1, q_indices.long())
    return BlockMask(kv_counts, kv_indices, q_counts, q_indices, mask.q_offsets, mask.kv_offsets, TILE, kv_codes, q_codes)


def kernel_mask(mask: BlockMask | None) -> BlockMask | None:
    """The mask the TLX kernels walk for ``mask``: a 64 x 64 one :func:`tiled`, any other as it is."""
    if mask is not None and tuple(mask.block_size) == FINE_BLOCK:
        return tiled(mask)
    return mask


def plan_grid(mask: BlockMask | None, fwd_blocks: tuple[int, int]) -> torch.Tensor | None:
    """The bool grid a plan whose forward tiles are ``fwd_blocks`` costs its tiles by
    (``jagflash.core.plan.build``): the tiles' (:func:`tiled`) where 128 x 128 tiles walk a
    64 x 64 mask (the TLX kernels), else the mask's own (None without a mask)."""
    if mask is None:
        return None
    if tuple(fwd_blocks) == TILE and tuple(mask.block_size) == FINE_BLOCK:
        return tiled(mask).to_dense()
    return mask.to_dense()
