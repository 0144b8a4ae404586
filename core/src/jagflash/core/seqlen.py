"""A tile's sequence, in kernels (``@triton.jit``, portable): a Plan row decoded into its
sequence's starts and lengths, the row a q-tile reads Q from, which sequence owns a position, and
the masked row loads and stores that never cross a sequence's end."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["fwd_tile", "load_rows", "owned_seq", "owns_keys", "plan_row", "q_row", "seq_starts", "store_rows", "upper_bound"]

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
def row_ptrs(base, r0, rows, stride, offs_d):
    """Pointers of a tile's rows ``rows`` (``r0`` plus a tile-local range) of a tensor at
    ``base`` whose rows are ``stride`` elements apart, head dim contiguous. ``r0 * stride`` is
    formed in int64: one sequence can hold more than 2^31 elements (a long sequence, or a
    packed view with a wide row stride); the tile-local part stays int32 (it is below
    ``BLOCK * stride``: ``jagflash.core.ops.for_kernel`` copies wider views)."""
    return base + tl.cast(r0, tl.int64) * stride + (rows - r0)[:, None] * stride + offs_d[None, :]


@triton.jit
def store_zero_rows(base, r0, first, end, stride, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr):
    """Zeros on the rows ``[first, first + ROWS)`` under ``end`` (tile-local indices, row ``j`` at
    :func:`row_ptrs`' ``base + (r0 + j) * stride``, head dim contiguous), a few rows at a time
    (16 bytes a thread and store at 128 threads), so that a producer warpgroup's 24 registers do."""
    CHUNK: tl.constexpr = 1024 // HEAD_DIM
    cols = tl.arange(0, HEAD_DIM)
    # a run-time trip count (the rows under ``end``): a constant one is unrolled, and its hoisted
    # pointers outgrow a producer's registers
    for c0 in range(0, tl.minimum(end - first, ROWS), CHUNK):
        rows = first + c0 + tl.arange(0, CHUNK)
        tl.store(row_ptrs(base, r0 + first + c0, r0 + rows, stride, cols), tl.zeros([CHUNK, HEAD_DIM], DTYPE), mask=(rows < end)[:, None])


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


@triton.jit
def plan_row(i, TILES, count, heads, HEAD_MAJOR: tl.constexpr, GROUP: tl.constexpr = 1):
    """Row ``i`` of a Plan pass's table (walked in the order of ``jagflash.core.tlx.pipeline.walk_first``): (in range,
    sequence, head, first row).

    ``HEAD_MAJOR``: the table holds each tile slot's ``heads`` heads side by side; walk it one
    K/V head at a time instead: the GROUP query heads that share it (GQA; the forward's table
    holds query heads) side by side, slot after slot, then the next K/V head. The tiles that run
    at once then share one K/V head in L2, as the uTLX tutorial's grid order does. It gives up
    the cost order across heads (each head's tiles still come heaviest first), which a static
    deal pays for on masked batches and a dynamic one does not."""
    ok = i < count
    t = i
    if HEAD_MAJOR:
        span = tl.maximum(count // heads, 1) * GROUP  # the tiles of one K/V head
        rem = i % span
        t = (rem // GROUP) * heads + (i // span) * GROUP + rem % GROUP
    row = TILES + tl.where(ok, t, 0).to(tl.int64) * 3
    return ok, tl.load(row, mask=ok, other=0), tl.load(row + 1, mask=ok, other=0), tl.load(row + 2, mask=ok, other=0)


@triton.jit
def seq_starts(q_offsets, kv_offsets, b):
    """(q start, lq, kv start, lk) of sequence ``b``; int32, as TMA coordinates are 32-bit."""
    q_start = tl.load(q_offsets + b).to(tl.int32)
    lq = tl.load(q_offsets + b + 1).to(tl.int32) - q_start
    k_start = tl.load(kv_offsets + b).to(tl.int32)
    lk = tl.load(kv_offsets + b + 1).to(tl.int32) - k_start
    return q_start, lq, k_start, lk


@triton.jit
def fwd_tile(i, TILES, count, q_offsets, kv_offsets, heads, HEAD_MAJOR: tl.constexpr, GROUP: tl.constexpr):
    """The forward q-tile at index ``i`` of the walk: (live, head, first row, q start, lq, kv
    start, lk, sequence)."""
    ok, b, h, m0 = plan_row(i, TILES, count, heads, HEAD_MAJOR, GROUP)
    q_start, lq, k_start, lk = seq_starts(q_offsets, kv_offsets, b)
    return ok & (m0 < lq), h, m0, q_start, lq, k_start, lk, b


@triton.jit
def owns_keys(lk, OWN_SPAN: tl.constexpr):
    """Whether the one-pass backward's dK/dV kernel sums the dQ rows of a sequence of ``lk`` keys
    itself (``jagflash.core.tuning.own_span``): it has 1 to OWN_SPAN keys."""
    return (lk > 0) & (lk <= OWN_SPAN)


@triton.jit
def owned_seq(kv_offsets, b, valid, OWN_SPAN: tl.constexpr):
    """:func:`owns_keys` of sequence ``b`` (``valid``: ``b`` names a sequence; else False)."""
    lk = tl.load(kv_offsets + b + 1, mask=valid, other=0) - tl.load(kv_offsets + b, mask=valid, other=0)
    return valid & owns_keys(lk, OWN_SPAN)


@triton.jit
def q_row(q_start, m0, Q_SHARED: tl.constexpr):
    """Row of Q where a q-tile starting at ``m0`` of a sequence starting at ``q_start`` reads its
    queries: the sequence's own rows, or, broadcast-Q (``Q_SHARED``), the one shared block
    (outputs, LSE and dO still use the sequence's rows ``q_start + m0``)."""
    if Q_SHARED:
        return m0
    else:
        return q_start + m0
