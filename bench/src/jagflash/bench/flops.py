"""Exact attention FLOPs from the real lengths and masks (the FlashAttention convention).

Forward: ``4 * D * Hq`` per visible (query, key) pair: two matmuls (QK^T and PV) of 2 FLOPs per
multiply-add, summed over the pairs the mask lets through, sequence by sequence. Backward:
2.5 x forward (five matmuls instead of two). Softmax and masking are not counted.

Visibility (DESIGN.md): query ``i`` of a sequence with ``lq`` queries and ``lk`` keys sees key
``j`` iff ``i + d - left <= j <= i + d + right`` with ``d = lk - lq`` (bottom-right aligned),
``-1`` leaving a side unbounded; causal clips ``right`` to 0::

    lq = 3, lk = 5, causal        keys j ->
                                  0 1 2 3 4
                       query 0    x x x . .
                       query 1    x x x x .
                       query 2    x x x x x      -> 12 visible pairs
"""

from __future__ import annotations

import numpy as np

__all__ = ["BWD_FACTOR", "bwd_flops", "fwd_flops", "mask_bounds", "visible_pairs"]

BWD_FACTOR = 2.5


def mask_bounds(causal: bool, window: tuple[int, int] = (-1, -1)) -> tuple[int, int]:
    """``(left, right)`` of the visible band, -1 unbounded; causal clips ``right`` to 0."""
    left, right = (int(window[0]), int(window[1])) if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def visible_pairs(
    q_lens: object, kv_lens: object, causal: bool = False, window: tuple[int, int] = (-1, -1)
) -> int:
    """Total visible (query, key) pairs over all sequences, exactly (Python int).

    Sums over query rows, vectorised over the whole batch: O(sum(q_lens)) work and memory.
    """
    lq = np.asarray(q_lens, dtype=np.int64).reshape(-1)
    lk = np.asarray(kv_lens, dtype=np.int64).reshape(-1)
    if lq.shape != lk.shape:
        raise ValueError(f"q_lens has {lq.size} sequences but kv_lens has {lk.size}")
    if (lq < 0).any() or (lk < 0).any():
        raise ValueError("sequence lengths must be >= 0")
    left, right = mask_bounds(causal, window)
    total_q = int(lq.sum())
    if total_q == 0:
        return 0
    starts = np.cumsum(lq) - lq
    i = np.arange(total_q, dtype=np.int64) - np.repeat(starts, lq)  # row within its sequence
    k_len = np.repeat(lk, lq)
    d = k_len - np.repeat(lq, lq)
    hi = k_len - 1 if right < 0 else np.minimum(k_len - 1, i + d + right)
    lo = np.zeros_like(i) if left < 0 else np.maximum(0, i + d - left)
    return int(np.maximum(hi - lo + 1, 0).sum())


def fwd_flops(
    q_lens: object,
    kv_lens: object,
    *,
    heads: int,
    head_dim: int,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
) -> int:
    """Forward FLOPs: ``4 * head_dim * heads * visible_pairs`` (``heads`` = query heads)."""
    return 4 * head_dim * heads * visible_pairs(q_lens, kv_lens, causal, window)


def bwd_flops(fwd: int) -> int:
    """Backward FLOPs by the FlashAttention convention: 2.5 x forward."""
    return round(BWD_FACTOR * fwd)
