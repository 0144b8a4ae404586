"""``@triton.jit`` pieces every attention kernel shares: masks, tile ranges, the softmax step.

Portable: nothing here uses TLX or inline assembly, so the Triton interpreter runs it on the CPU
and both the stock-Triton and the TLX kernels call the same code.

Conventions. Scores are kept in the log2 domain: ``s2 = (q . k) * scale * log2(e)``, so the
softmax uses ``exp2``. The LSE handed to callers is in natural log (``lse = lse2 * ln 2``).
Masks are a band around the bottom-right diagonal (see ``jagflash.core.jagged``): query ``i``
sees key ``j`` iff ``i + d - LEFT <= j <= i + d + RIGHT`` with ``d = lk - lq``; ``BOUNDED_LEFT``
and ``BOUNDED_RIGHT`` are compile-time flags, so an unbounded side costs nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def floor_to(x, BLOCK: tl.constexpr):
    """``x`` rounded down to a multiple of BLOCK, for ``x >= 0``."""
    return (x // BLOCK) * BLOCK


@triton.jit
def ceil_to(x, BLOCK: tl.constexpr):
    """``x`` rounded up to a multiple of BLOCK, for ``x >= 0``."""
    return ((x + BLOCK - 1) // BLOCK) * BLOCK


@triton.jit
def kv_tile_range(
    m0,
    lq,
    lk,
    left,
    right,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr,
    BOUNDED_RIGHT: tl.constexpr,
):
    """kv bounds ``(lo, full_lo, full_hi, hi)`` for the q-tile at ``m0`` (forward and dQ).

    Twin of ``jagflash.core.jagged.kv_tile_ranges``. Every clamp keeps the operands of ``//``
    non-negative: Triton divides integers by truncation, the interpreter by flooring.
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr,
    BOUNDED_RIGHT: tl.constexpr,
):
    """q-tile bounds ``(lo, full_lo, full_hi, hi)`` for the kv-tile at ``n0`` (dK/dV pass).

    Twin of ``jagflash.core.jagged.dkdv_q_ranges``; all four are multiples of BLOCK_M.
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
def online_softmax_step(s2, m_i, l_i):
    """One step of the online softmax over a tile of log2-domain scores ``s2 [M, N]``.

    Returns ``(p, alpha, m_new, l_new)``: the tile's unnormalised probabilities, the factor that
    rescales the running accumulator, and the new running max and sum. A row that has seen only
    masked (-inf) scores keeps ``m = -inf`` and ``l = 0`` without producing NaN.
    """
    return online_softmax_step_scaled(s2, 1.0, m_i, l_i)


@triton.jit
def online_softmax_step_scaled(s, scale2, m_i, l_i):
    """:func:`online_softmax_step` over raw scores ``s`` (masked ones -inf) whose log2-domain
    scale ``scale2`` must be positive: the scale rides in the exponent, one fused multiply-add
    per score instead of a multiply and a subtract, and on the row maxima."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s * scale2 - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new


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
def attn_delta(o, do):
    """delta = rowsum(dO * O) in fp32 over ``[rows, D]`` tiles: the backward's dS = P (dP - delta)."""
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)


@triton.jit
def finish_softmax(acc, m_i, l_i):
    """Normalised output and natural-log LSE; a row with no visible key gives 0 and -inf."""
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
    return out, lse


@triton.jit
def lse_to_log2(lse):
    """Natural-log LSE -> log2 domain for the backward; -inf (no key seen) -> +inf, so that
    ``exp2(s2 - lse2)`` is 0 for that row instead of NaN."""
    return tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)


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
