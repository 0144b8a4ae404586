"""Visibility: the ONE description of which keys a query sees, for every kernel and the plan.

A mask is a band around the bottom-right diagonal: query ``i`` of a sequence with ``lq`` queries
and ``lk`` keys sees key ``j`` iff ``i + d - left <= j <= i + d + right`` with ``d = lk - lq``;
``-1`` leaves a side unbounded, causal is ``right = 0`` (:func:`mask_bounds`). In kernels the two
bounded flags are compile-time (``BOUNDED_LEFT`` / ``BOUNDED_RIGHT``), so an unbounded side costs
nothing.

Block ranges. A q-tile of ``block_m`` rows starting at row ``m0`` visits the kv-blocks
``[lo, hi)`` (steps of ``block_n``): :func:`kv_tile_range` in kernels, :func:`kv_tile_ranges` its
torch twin for the plan's cost model (the tests check the two against each other). The range
splits into a masked head ``[lo, full_lo)``, an unmasked body ``[full_lo, full_hi)`` (every pair
visible, every key in range: no score mask, no bound checks) and a masked tail ``[full_hi, hi)``;
kernels run head and tail in the masked compile-time specialisation of their loop and the body in
the unmasked one. :func:`dkdv_q_range` / :func:`dkdv_q_ranges` are the transposed ranges of the
dK/dV pass (q-blocks a kv-tile visits). Inside an edge block the element mask comes from
:func:`band_bounds` (the per-row key bounds, formed once per row) and :func:`bounds_mask`.

The block iterator. A loop over partner blocks runs ``for t in range(p0, p1, STEP):
n0 = block_at(row, t, ...)`` (``STEP`` 1 with a list, else BLOCK) over the positions :func:`block_walk` makes of a range: without a
block list (``SPARSE`` false) the positions are the rows themselves (``n0 = t``, step BLOCK:
the band's loop as it always was); with one (``jagflash.core.block_mask``: the tile's row of
ascending block indices, :func:`list_row`) they are the slots of the listed blocks that fall in
each part of the band, so listed blocks outside the band are skipped and the edge blocks keep
the band's element mask; a loop whose steps are smaller than the list's blocks (the TLX dK/dV
kernel: 64-query steps, 128-row q-blocks) walks ``SUB`` steps per listed block.
:func:`tile_list` gives a tile its row (or 0 without a list). :func:`listed_blocks` is its
torch twin for the plan's cost model. A tiled 64 x 64 mask (``jagflash.core.block_tiles``) adds
each listed tile's bits, which a step reads with :func:`tile_codes` / :func:`fine_visible` to
mask the 64 x 64 blocks its tile leaves out. Every loop that must stay in step with another (the TLX
producer and its consumers, whose ring counters advance once per position) runs the same walk
of the same range. A new mask changes the iterator's input, never a kernel body.

Every clamp keeps the operands of ``//`` non-negative: Triton divides integers by truncation,
the interpreter by flooring. The ``@triton.jit`` functions take their block sizes either as
compile-time constants (the attention kernels) or at run time (the plan's build kernels).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = [
    "band_bounds",
    "band_mask",
    "block_at",
    "block_walk",
    "bounds_mask",
    "ceil_to",
    "dkdv_q_range",
    "dkdv_q_ranges",
    "fine_visible",
    "floor_to",
    "kv_tile_range",
    "kv_tile_ranges",
    "list_row",
    "listed_blocks",
    "mask_bounds",
    "tile_codes",
    "tile_list",
    "visible_pairs",
]


def mask_bounds(causal: bool, window: tuple[int, int] | None = None) -> tuple[int, int]:
    """``(left, right)`` bounds of the visible band; -1 is unbounded. Causal clips right to 0."""
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return int(left), int(right)


# --- in kernels -------------------------------------------------------------------------


@triton.jit
def floor_to(x, BLOCK):
    """``x`` rounded down to a multiple of BLOCK (compile-time or not), for ``x >= 0``."""
    return (x // BLOCK) * BLOCK


@triton.jit
def ceil_to(x, BLOCK):
    """``x`` rounded up to a multiple of BLOCK (compile-time or not), for ``x >= 0``."""
    return ((x + BLOCK - 1) // BLOCK) * BLOCK


@triton.jit
def kv_tile_range(
    m0,
    lq,
    lk,
    left,
    right,
    BLOCK_M,
    BLOCK_N,
    BOUNDED_LEFT: tl.constexpr,
    BOUNDED_RIGHT: tl.constexpr,
):
    """kv bounds ``(lo, full_lo, full_hi, hi)`` for the q-tile at ``m0`` (forward and dQ).

    Twin of :func:`kv_tile_ranges`; ``BLOCK_M`` and ``BLOCK_N`` compile-time or not.
    """
    d = lk - lq
    hi_key = lk
    hi_full_key = lk
    if BOUNDED_RIGHT:
        hi_key = tl.minimum(lk, m0 + BLOCK_M + d + right)
        hi_full_key = tl.maximum(tl.minimum(lk, m0 + d + right + 1), 0)
    lo_key = lk * 0
    lo_full_key = lk * 0
    if BOUNDED_LEFT:
        lo_key = tl.maximum(m0 + d - left, 0)
        lo_full_key = tl.maximum(m0 + BLOCK_M - 1 + d - left, 0)
    lo = floor_to(lo_key, BLOCK_N)
    hi = tl.where(hi_key > lo_key, hi_key, lo)
    full_lo = tl.minimum(tl.maximum(ceil_to(lo_full_key, BLOCK_N), lo), hi)
    full_hi = tl.maximum(tl.minimum(floor_to(hi_full_key, BLOCK_N), hi), full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def dkdv_q_range(
    n0,
    lq,
    lk,
    left,
    right,
    BLOCK_M,
    BLOCK_N,
    BOUNDED_LEFT: tl.constexpr,
    BOUNDED_RIGHT: tl.constexpr,
):
    """q-tile bounds ``(lo, full_lo, full_hi, hi)`` for the kv-tile at ``n0`` (dK/dV pass).

    Twin of :func:`dkdv_q_ranges`; all four are multiples of BLOCK_M.
    """
    d = lk - lq
    lo_row = lq * 0
    lo_full_row = lq * 0
    if BOUNDED_RIGHT:
        lo_row = tl.maximum(n0 - d - right, 0)
        lo_full_row = tl.maximum(n0 + BLOCK_N - 1 - d - right, 0)
    hi_row = lq
    if BOUNDED_LEFT:
        hi_row = tl.maximum(tl.minimum(lq, n0 + BLOCK_N - d + left), 0)
    lo = floor_to(lo_row, BLOCK_M)
    hi = tl.where(hi_row > lo_row, ceil_to(hi_row, BLOCK_M), lo)
    full_lo = tl.minimum(tl.maximum(ceil_to(lo_full_row, BLOCK_M), lo), hi)
    full_hi = tl.maximum(hi, full_lo)
    if BOUNDED_LEFT:
        hi_full_row = tl.maximum(n0 - d + left + 1, 0)
        full_hi = tl.maximum(tl.minimum(floor_to(hi_full_row, BLOCK_M), hi), full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def band_bounds(qi, lq, lk, left, right, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr):
    """Keys ``[lo, hi)`` visible to each query ``qi`` (any shape), ``hi`` clipped to ``lk``.
    Forming the bounds once per query keeps the per-element mask to one or two compares."""
    d = lk - lq
    hi = qi * 0 + lk
    if BOUNDED_RIGHT:
        hi = tl.minimum(qi + d + right + 1, lk)
    lo = qi * 0
    if BOUNDED_LEFT:
        lo = qi + d - left
    return lo, hi


@triton.jit
def bounds_mask(kj, lo, hi, BOUNDED_LEFT: tl.constexpr):
    """Mask from :func:`band_bounds` (broadcast against the keys ``kj``)."""
    mask = kj < hi
    if BOUNDED_LEFT:
        mask = mask & (kj >= lo)
    return mask


@triton.jit
def band_mask(
    qi,
    kj,
    lq,
    lk,
    left,
    right,
    BOUNDED_LEFT: tl.constexpr,
    BOUNDED_RIGHT: tl.constexpr,
):
    """Visibility of keys ``kj`` to queries ``qi`` (broadcastable index tensors), keys past ``lk``
    hidden. Pass ``offs_m[:, None], offs_n[None, :]`` for an ``[M, N]`` mask and
    ``offs_m[None, :], offs_n[:, None]`` for its transpose."""
    lo, hi = band_bounds(qi, lq, lk, left, right, BOUNDED_LEFT, BOUNDED_RIGHT)
    return bounds_mask(kj, lo, hi, BOUNDED_LEFT)


@triton.jit
def _row_at(lists, b, h, block):
    """Row ``block`` of head ``h`` of sequence ``b`` in ``lists`` (:func:`list_row`'s)."""
    return b.to(tl.int64) * lists[3] + tl.cast(h, tl.int64) * lists[2] + block


@triton.jit
def list_row(lists, b, h, block):
    """A tile's block list ``(count, indices)``: row ``block`` of head ``h`` of sequence ``b``
    in ``lists = (COUNTS, INDICES, head_stride, seq_stride, width)``
    (``jagflash.core.block_mask.BlockMask.kernel_lists``)."""
    at = _row_at(lists, b, h, block)
    return tl.load(lists[0] + at), lists[1] + at * lists[4]


@triton.jit
def tile_codes(lists, b, h, block, FINE: tl.constexpr):
    """With ``FINE`` (a tiled 64 x 64 mask: ``jagflash.core.block_tiles``, whose ``lists`` end
    with its bits) the bits of the row :func:`list_row` gives, slot for slot; else 0."""
    if FINE:
        return lists[5] + _row_at(lists, b, h, block) * lists[4]
    else:
        return 0


@triton.jit
def fine_visible(codes, t, q, k, SUB: tl.constexpr):
    """Whether query row ``q`` sees key ``k`` (indices in their sequence, broadcastable) by the
    bits of the tile at position ``t`` of :func:`block_walk` through a tiled 64 x 64 mask
    (``codes``: :func:`tile_codes`; ``SUB`` steps a listed tile): bit ``2 r + c`` of the tile's
    code, ``r`` and ``c`` the 64-row and 64-key halves of the tile that ``q`` and ``k`` fall in."""
    code = tl.load(codes + t // SUB)
    return ((code >> (2 * ((q // 64) % 2) + (k // 64) % 2)) & 1) != 0


@triton.jit
def tile_list(lists, b, h, block, SPARSE: tl.constexpr):
    """:func:`list_row` of a tile with ``SPARSE``, else 0 (``lists`` may then be None): the
    ``row`` argument of :func:`block_walk` and :func:`block_at`."""
    if SPARSE:
        return list_row(lists, b, h, block)
    else:
        return 0


@triton.jit
def _listed_below(indices, count, limit, ENDS: tl.constexpr):
    """Slots of the ascending ``indices[:count]`` below ``limit`` (binary search). With
    ``ENDS`` the ends of a band cost no search: a limit at or below 0 none at all, one past the
    last listed block one load (unbounded sides, and the sequence's end, are such limits). The
    TLX kernels take it (fewer registers there: bench/NOTES.md, TLX block-sparse session); the
    portable ones do not: Triton 3.8's ptxas dies (SIGSEGV) compiling the portable dQ program
    for sm_90a at 64 x 64 blocks, D 64, with it (2026-12-02, session 13, call 2; reproduced on the
    CPU by ``bench/probes/portable_ptx.py --sparse --block 64 --head-dim 64``)."""
    lo = count * 0
    hi = count
    if ENDS:
        hi = tl.where(limit > 0, count, lo)
        last = tl.load(indices + tl.maximum(hi - 1, 0), mask=hi > 0, other=0)
        lo = tl.where((hi > 0) & (last < limit), hi, lo)
    while lo < hi:
        mid = (lo + hi) // 2
        below = tl.load(indices + mid) < limit
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(below, hi, mid)
    return lo


@triton.jit
def _steps_below(indices, count, x, BLOCK, SUB: tl.constexpr, ENDS: tl.constexpr):
    """Positions of :func:`block_walk` (``SUB`` steps of BLOCK rows per listed block) whose
    first row lies below ``x`` (a multiple of BLOCK, ``>= 0``)."""
    LISTED: tl.constexpr = BLOCK * SUB
    s = _listed_below(indices, count, (x + LISTED - 1) // LISTED, ENDS)
    if SUB == 1:
        return s
    else:
        # the last listed block below x may reach past it: drop its steps at or above x
        last = tl.load(indices + tl.maximum(s - 1, 0), mask=s > 0, other=0)
        over = tl.where(s > 0, tl.maximum((last + 1) * LISTED - x, 0), 0)
        return SUB * s - over // BLOCK


@triton.jit
def block_walk(lo, full_lo, full_hi, hi, row, BLOCK, SPARSE: tl.constexpr, SUB: tl.constexpr = 1, ENDS: tl.constexpr = False):
    """Positions ``(p0, p1, p2, p3)`` of a range ``(lo, full_lo, full_hi, hi)`` (from
    :func:`kv_tile_range` or :func:`dkdv_q_range`, steps of BLOCK rows): masked head ``[p0,
    p1)``, unmasked body ``[p1, p2)``, masked tail ``[p2, p3)``. Without a list, the range
    itself; with one (``row``: :func:`list_row`, blocks of ``SUB * BLOCK`` rows), the steps of
    the listed blocks starting in each part: position ``t`` is step ``t % SUB`` of listed slot
    ``t // SUB`` (:func:`block_at`), so a listed block visits its SUB steps in turn (the TLX
    dK/dV kernel's 64-query steps through 128-row q-blocks: SUB 2). ``ENDS``: see
    :func:`_listed_below` (the TLX kernels pass True)."""
    if SPARSE:
        count, indices = row
        p0 = _steps_below(indices, count, lo, BLOCK, SUB, ENDS)
        p1 = _steps_below(indices, count, full_lo, BLOCK, SUB, ENDS)
        p2 = _steps_below(indices, count, full_hi, BLOCK, SUB, ENDS)
        p3 = _steps_below(indices, count, hi, BLOCK, SUB, ENDS)
        return p0, p1, p2, p3
    else:
        return lo, full_lo, full_hi, hi


@triton.jit
def block_at(row, t, BLOCK: tl.constexpr, SPARSE: tl.constexpr, SUB: tl.constexpr = 1):
    """First row of the step at position ``t`` of :func:`block_walk`."""
    if SPARSE:
        if SUB == 1:
            return tl.load(row[1] + t) * BLOCK
        else:
            return tl.load(row[1] + t // SUB) * (BLOCK * SUB) + (t % SUB) * BLOCK
    else:
        return t


# --- on the host (torch twins, for the plan's cost model and tools) ----------------------


def _floor_to(x: torch.Tensor, block: int) -> torch.Tensor:
    return torch.div(x, block, rounding_mode="floor") * block


def _ceil_to(x: torch.Tensor, block: int) -> torch.Tensor:
    return -torch.div(-x, block, rounding_mode="floor") * block


def kv_tile_ranges(
    m0: torch.Tensor,
    lq: torch.Tensor,
    lk: torch.Tensor,
    block_m: int,
    block_n: int,
    left: int,
    right: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """kv-tile bounds ``(lo, full_lo, full_hi, hi)`` for q-tiles starting at ``m0``.

    Used by the forward and the dQ pass. ``hi`` is not tile-aligned (the last masked tile is
    clipped to it); the others are multiples of ``block_n``.
    """
    m0, lq, lk = (torch.as_tensor(x, dtype=torch.int64) for x in (m0, lq, lk))
    d = lk - lq
    zero = torch.zeros_like(d)
    hi_key = lk if right < 0 else torch.minimum(lk, m0 + block_m + d + right)
    lo_key = zero if left < 0 else torch.clamp(m0 + d - left, min=0)
    lo = _floor_to(lo_key, block_n)
    hi = torch.where(hi_key > lo_key, hi_key, lo)
    hi_full_key = lk if right < 0 else torch.clamp(torch.minimum(lk, m0 + d + right + 1), min=0)
    lo_full_key = zero if left < 0 else torch.clamp(m0 + block_m - 1 + d - left, min=0)
    full_lo = torch.minimum(torch.maximum(_ceil_to(lo_full_key, block_n), lo), hi)
    full_hi = torch.maximum(torch.minimum(_floor_to(hi_full_key, block_n), hi), full_lo)
    return lo, full_lo, full_hi, hi


def dkdv_q_ranges(
    n0: torch.Tensor,
    lq: torch.Tensor,
    lk: torch.Tensor,
    block_m: int,
    block_n: int,
    left: int,
    right: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q-tile bounds ``(lo, full_lo, full_hi, hi)`` for the kv-tiles starting at ``n0``.

    Used by the dK/dV pass; all four are multiples of ``block_m``. Rows past ``lq`` inside the
    last q-tile need no score mask there: the kernel loads their LSE as +inf, so they add zero.
    """
    n0, lq, lk = (torch.as_tensor(x, dtype=torch.int64) for x in (n0, lq, lk))
    d = lk - lq
    zero = torch.zeros_like(d)
    lo_row = zero if right < 0 else torch.clamp(n0 - d - right, min=0)
    hi_row = lq if left < 0 else torch.clamp(torch.minimum(lq, n0 + block_n - d + left), min=0)
    lo = _floor_to(lo_row, block_m)
    hi = torch.where(hi_row > lo_row, _ceil_to(hi_row, block_m), lo)
    lo_full_row = zero if right < 0 else torch.clamp(n0 + block_n - 1 - d - right, min=0)
    full_lo = torch.minimum(torch.maximum(_ceil_to(lo_full_row, block_m), lo), hi)
    if left < 0:
        full_hi = torch.maximum(hi, full_lo)
    else:
        hi_full_row = torch.clamp(n0 - d + left + 1, min=0)
        full_hi = torch.maximum(torch.minimum(_floor_to(hi_full_row, block_m), hi), full_lo)
    return lo, full_lo, full_hi, hi


def visible_pairs(lq: torch.Tensor, lk: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """Number of visible (query, key) pairs per sequence, exactly (int64, no materialised mask).

    Row ``i`` sees keys ``[max(0, i+d-left), min(lk-1, i+d+right)]``; the rows of all sequences
    are counted at once (O(sum lq) work and memory) and summed per sequence.
    """
    lq = torch.as_tensor(lq, dtype=torch.int64).reshape(-1)
    lk = torch.as_tensor(lk, dtype=torch.int64).reshape(-1).to(lq.device)
    seq = torch.repeat_interleave(torch.arange(lq.numel(), device=lq.device), lq)
    starts = torch.cumsum(lq, 0) - lq
    i = torch.arange(seq.numel(), device=lq.device) - starts[seq]  # row within its sequence
    k_len = lk[seq]
    d = k_len - lq[seq]
    hi = k_len - 1 if right < 0 else torch.minimum(k_len - 1, i + d + right)
    lo = torch.zeros_like(i) if left < 0 else torch.clamp(i + d - left, min=0)
    count = torch.clamp(hi - lo + 1, min=0)
    return torch.zeros_like(lq).index_add_(0, seq, count)



def listed_blocks(
    side: str, start: torch.Tensor, lq: torch.Tensor, lk: torch.Tensor, block_m: int, block_n: int,
    left: int, right: int, listed: torch.Tensor, sub: int = 1,
) -> torch.Tensor:
    """Twin of :func:`block_walk`'s ``p3 - p0``: partner steps a tile visits (int64), those of
    its band in the blocks its block list names. ``listed`` ``[..., n]`` bool: the tile's row of
    the mask's grid (``side="q"``: the kv-blocks of a q-tile; ``"kv"``: the q-blocks of a
    kv-tile), broadcast against ``start``; ``sub``: steps per listed block (the partner's
    block of the mask is ``sub`` partner tiles of the pass: 2 for the TLX dK/dV pass's
    64-query steps through 128-row q-blocks)."""
    if side == "q":
        lo, _, _, hi = kv_tile_ranges(start, lq, lk, block_m, block_n, left, right)
        block = block_n
    else:
        lo, _, _, hi = dkdv_q_ranges(start, lq, lk, block_m, block_n, left, right)
        block = block_m
    slot = torch.arange(listed.shape[-1], device=listed.device)
    first = slot * (block * sub)  # [n]: each listed block's first row

    def steps_below(x):  # steps t of a listed block (rows first + t * block) below x, in [0, sub]
        return torch.clamp(torch.div(x[..., None] - first + block - 1, block, rounding_mode="floor"), 0, sub)

    return (listed * (steps_below(hi) - steps_below(lo))).sum(-1)
