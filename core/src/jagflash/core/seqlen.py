"""A tile's sequence, in kernels (``@triton.jit``): which sequence owns a position, and the
masked row loads and stores that never cross a sequence's end."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["load_rows", "store_rows", "upper_bound"]

@triton.jit
def upper_bound(ends, n, x, steps):
    """For each ``x``, the first ``i`` in ``[0, n)`` with ``ends[i] > x`` (``n`` if none): a
    binary search over the non-decreasing ``ends`` in ``steps`` rounds (``n.bit_length()``
    rounds suffice). With ``ends`` a batch's cumulative ends (``offsets[1:]``, a tile prefix
    sum) ``i`` is the sequence that owns position ``x``, zero-length sequences skipped."""
    lo = tl.zeros(x.shape, dtype=tl.int32)
    hi = lo + n
    for _ in range(steps):
        mid = (lo + hi) // 2
        v = tl.load(ends + mid, mask=mid < n, other=0)
        go = (v <= x) & (lo < hi)
        lo = tl.where(go, mid + 1, lo)
        hi = tl.where(go | (lo >= hi), hi, mid)
    return lo


@triton.jit
def load_rows(ptrs, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, CHECK_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
    """Load a ``[rows, BLOCK_D]`` tile, zero past ``n_rows`` (if CHECK_ROWS) and past HEAD_DIM."""
    if CHECK_ROWS:
        if EVEN_D:
            x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    else:
        if EVEN_D:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return x


@triton.jit
def store_rows(ptrs, x, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, EVEN_D: tl.constexpr):
    """Store a ``[rows, BLOCK_D]`` tile, skipping rows past ``n_rows`` and columns past HEAD_DIM."""
    if EVEN_D:
        tl.store(ptrs, x, mask=rows[:, None] < n_rows)
    else:
        tl.store(ptrs, x, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))

