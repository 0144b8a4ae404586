"""Exact attention FLOPs from the real lengths and masks (the FlashAttention convention).

Forward: ``4 * D * Hq`` per visible (query, key) pair: two matmuls (QK^T and PV) of 2 FLOPs per
multiply-add, summed over the pairs the mask lets through, sequence by sequence. Backward:
2.5 x forward (five matmuls instead of two). Softmax and masking are not counted.

Visibility (docs/semantics.md): query ``i`` of a sequence with ``lq`` queries and ``lk`` keys sees key
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
import torch

from jagflash.core.mask import mask_bounds
from jagflash.core.mask import visible_pairs as core_visible_pairs

__all__ = ["BWD_FACTOR", "block_mask_pairs", "bwd_flops", "fwd_flops", "mask_bounds", "visible_pairs"]

BWD_FACTOR = 2.5


def visible_pairs(
    q_lens: object, kv_lens: object, causal: bool = False, window: tuple[int, int] = (-1, -1)
) -> int:
    """Total visible (query, key) pairs over all sequences, exactly (Python int)."""
    lq = torch.as_tensor(np.asarray(q_lens, dtype=np.int64).reshape(-1))
    lk = torch.as_tensor(np.asarray(kv_lens, dtype=np.int64).reshape(-1))
    if lq.shape != lk.shape:
        raise ValueError(f"q_lens has {lq.numel()} sequences but kv_lens has {lk.numel()}")
    if (lq < 0).any() or (lk < 0).any():
        raise ValueError("sequence lengths must be >= 0")
    return int(core_visible_pairs(lq, lk, *mask_bounds(causal, window)).sum())


def block_mask_pairs(block_mask, heads: int, causal: bool = False, window: tuple[int, int] = (-1, -1)) -> int:
    """Visible (query, key) pairs summed over the ``heads`` query heads under a
    ``jagflash.core.block_mask.BlockMask`` (a pair of a listed block that the band lets through),
    exactly: each sequence's element mask is built on the mask's device (``[Hm, lq, lk]``, one
    sequence at a time). ``4 * head_dim * block_mask_pairs(...)`` is the forward's FLOPs."""
    from jagflash.core.reference import visibility_mask

    left, right = mask_bounds(causal, window)
    lq = (block_mask.q_offsets[1:] - block_mask.q_offsets[:-1]).tolist()
    lk = (block_mask.kv_offsets[1:] - block_mask.kv_offsets[:-1]).tolist()
    per_list = heads // block_mask.heads  # query heads that share each list
    total = 0
    for b, (n, m) in enumerate(zip(lq, lk)):
        if n and m:
            seen = block_mask.element_mask(b, n, m) & visibility_mask(n, m, left, right, block_mask.kv_counts.device)
            total += int(seen.sum()) * per_list
    return total


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
