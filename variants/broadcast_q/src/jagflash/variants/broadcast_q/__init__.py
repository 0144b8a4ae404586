"""One dense query block against every sequence of a jagged K/V batch: ``broadcast_q_attention``.

>>> from jagflash.variants.broadcast_q import broadcast_q_attention
>>> out = broadcast_q_attention(q, k, v, kv_offsets)   # q [Lq,Hq,D], k/v [Tk,Hkv,D] -> [B,Lq,Hq,D]

Calls that share the K/V offsets and Lq (every layer of a model) can share one tile schedule:

>>> plan = make_plan(q, k, kv_offsets)
>>> out = broadcast_q_attention(q, k, v, kv_offsets, plan=plan)
"""

from __future__ import annotations

import torch

from jagflash.core.checks import check_broadcast_q_call, check_qkv, raise_if
from jagflash.core.ops import call_problem, default_scale, layout_plan
from jagflash.core.plan.model import Plan
from jagflash.core.registry import Variant
from jagflash.core.tuning import BACKEND_DEFAULT
from jagflash.variants.broadcast_q import op
from jagflash.variants.broadcast_q.spec import SPEC

__all__ = ["SPEC", "VARIANT", "broadcast_q_attention", "make_plan"]


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
    plan: Plan | None = None,
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
        plan: the tile schedule of these K/V offsets and this Lq (:func:`make_plan`), built
            once and passed to every call that shares them; its backward reuses it. The TLX
            kernels walk it (tiles ordered by K/V length); without one a TLX call lays out its
            own, every call. The portable kernels take a plain grid: they check a plan given
            to them and ignore it. A plan for other offsets, shapes or tile sizes is refused.
        backend: ``"tlx-sm90"``, ``"portable"``, ``"interpreter"``, ``"reference"``, or ``None``
            for the fastest that runs the problem (``JAGFLASH_BACKEND`` overrides ``None``).
            ``jagflash.core.backend.last_choice("broadcast_q")`` tells which ran and why.

    Returns:
        ``out [B, Lq, Hq, D]`` in q's dtype, and LSE if asked. Backward: ``dq [Lq, Hq, D]``
        summed over the sequences, ``dk``, ``dv`` per sequence.

    There is no ``causal`` argument: the queries belong to no K/V sequence, so a causal mask
    has no meaning here (``jagflash.core.attention(..., causal=True)`` is refused).
    Inputs whose last dimension is not contiguous are copied. Invalid inputs raise
    :class:`~jagflash.core.capability.InvalidInput` and problems no backend implements raise
    :class:`~jagflash.core.capability.UnsupportedProblem`, each listing every reason.
    """
    check_broadcast_q_call(
        "broadcast_q_attention", q, k, v, kv_offsets, max_seqlen_kv=max_seqlen_kv, plan=plan
    )
    out, lse = op.call_fwd(
        q, k, v, kv_offsets, -1 if max_seqlen_kv is None else int(max_seqlen_kv),
        default_scale(scale, q.shape[-1]), bool(return_lse), bool(deterministic), backend or "",
        *(plan.op_args() if plan is not None and backend != "reference" else (None, None, None)),
    )
    return (out, lse) if return_lse else out


def make_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    schedule: str = BACKEND_DEFAULT,
    backward_schedule: str | None = BACKEND_DEFAULT,
    workers: int | None = None,
    max_seqlen_kv: int | None = None,
    backward: bool = True,
    backend: str | None = None,
) -> Plan:
    """The load-balancing :class:`~jagflash.core.plan.model.Plan` of a broadcast-Q batch: the
    jagged problem whose sequence ``b`` has Lq queries (output rows ``b*Lq`` on) and the K/V of
    sequence ``b``; no host sync. ``q`` ``[Lq, Hq, D]`` and ``k`` ``[Tk, Hkv, D]`` give only
    shapes and device. The other arguments as for ``jagflash.variants.jagged.make_plan``
    (``backend``: default the one a call with these shapes picks)."""
    raise_if("jagflash.variants.broadcast_q.make_plan", check_qkv(q, k, k, rank=3, layout_doc="[rows, H, D]"))
    return layout_plan(
        SPEC, "broadcast_q", q, k, op.output_offsets(q, kv_offsets), kv_offsets,
        total_q=(kv_offsets.numel() - 1) * q.shape[0], causal=False, backend=backend, schedule=schedule,
        backward_schedule=backward_schedule, workers=workers, max_seqlen_q=q.shape[0],
        max_seqlen_kv=max_seqlen_kv, backward=backward,
    )


VARIANT = Variant(spec=SPEC, problem=call_problem("broadcast_q"), run=broadcast_q_attention, priority=0)
