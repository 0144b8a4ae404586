"""One dense query block against every sequence of a jagged K/V batch: ``broadcast_q_attention``.

>>> from jagflash.variants.broadcast_q import broadcast_q_attention
>>> out = broadcast_q_attention(q, k, v, kv_offsets)   # q [Lq,Hq,D], k/v [Tk,Hkv,D] -> [B,Lq,Hq,D]
"""

from __future__ import annotations

import torch

from jagflash.core.jagged import check_offsets
from jagflash.core.ops import call_problem, check_qkv, default_scale, raise_if
from jagflash.core.registry import Variant
from jagflash.variants.broadcast_q import op
from jagflash.variants.broadcast_q.spec import SPEC

__all__ = ["SPEC", "VARIANT", "broadcast_q_attention"]


def broadcast_q_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    scale: float | None = None,
    max_seqlen_kv: int | None = None,
    return_lse: bool = False,
    deterministic: bool = False,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of the same queries over every K/V sequence of a jagged batch.

    ``out[b]`` is attention of all of ``q`` over K/V sequence ``b``; no mask::

        q [Lq, Hq, D] --+--> K/V seq 0 (Lk_0 keys) --> out[0]  [Lq, Hq, D]
                        +--> K/V seq 1 (Lk_1 keys) --> out[1]
                        +--> ...                   --> out[B-1]

    Args:
        q: ``[Lq, Hq, D]``, shared by every sequence (``Lq = 0`` is legal).
        k, v: ``[Tk, Hkv, D]``, the K/V sequences back to back, ``Hq % Hkv == 0`` (GQA/MQA:
            query head ``h`` reads kv head ``h // (Hq // Hkv)``).
        kv_offsets: ``[B+1]`` int32/int64 on q's device, non-decreasing, from 0 to Tk; sequence
            ``b`` is rows ``kv_offsets[b]:kv_offsets[b+1]``. A sequence of length 0 is legal: its
            ``out[b]`` is 0 and its LSE -inf for every query, and it adds nothing to dQ.
        scale: softmax scale, default ``1/sqrt(D)``.
        max_seqlen_kv: an upper bound of the K/V lengths. Given, no call on a GPU synchronises
            with the host (the offsets are then checked on the device); without it one
            synchronisation reads it and validates the offsets.
        return_lse: also return LSE ``[B, Hq, Lq]`` fp32, natural log (no gradient).
        deterministic: make the backward bitwise repeatable. dQ = sum over sequences of each
            sequence's dQ; by default the kernels add the terms with fp32 atomics in whatever
            order they finish; with ``deterministic=True`` one program per (head, q-tile) adds
            them in sequence order (fewer programs, so slower when Hq * Lq is small).
        backend: ``"tlx-sm90"``, ``"portable"``, ``"interpreter"``, ``"reference"``, or ``None``
            for the fastest that runs the problem (``JAGFLASH_BACKEND`` overrides ``None``).
            ``jagflash.core.backend.last_choice("broadcast_q")`` tells which ran and why.

    Returns:
        ``out [B, Lq, Hq, D]`` in q's dtype, and LSE if asked. Backward: ``dq [Lq, Hq, D]``
        summed over the sequences, ``dk``, ``dv`` per sequence.

    There is no ``causal`` argument: the queries belong to no K/V sequence, so a causal mask
    has no meaning here (``jagflash.core.attention(..., causal=True)`` is refused). There is no
    ``plan`` argument yet: the grid is plain until ``jagflash.core.schedule`` exists.
    Inputs whose last dimension is not contiguous are copied. Invalid inputs raise
    :class:`~jagflash.core.capability.InvalidInput` and problems no backend implements raise
    :class:`~jagflash.core.capability.UnsupportedProblem`, each listing every reason.
    """
    reasons = check_qkv(q, k, v, rank=3, layout_doc="[rows, H, D]")
    raise_if("broadcast_q_attention", reasons)
    reasons += check_offsets(kv_offsets, k.shape[0], "kv_offsets", q.device, check_values=False)[0]
    if max_seqlen_kv is not None and int(max_seqlen_kv) < 0:
        reasons.append(f"max_seqlen_kv must be >= 0, got {max_seqlen_kv}")
    raise_if("broadcast_q_attention", reasons)
    out, lse = op.broadcast_q_fwd(
        q, k, v, kv_offsets, -1 if max_seqlen_kv is None else int(max_seqlen_kv),
        default_scale(scale, q.shape[-1]), bool(return_lse), bool(deterministic), backend or "",
    )
    return (out, lse) if return_lse else out


VARIANT = Variant(spec=SPEC, problem=call_problem("broadcast_q"), run=broadcast_q_attention, priority=0)
