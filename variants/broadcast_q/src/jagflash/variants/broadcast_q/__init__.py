"""One dense query block against every sequence of a jagged K/V batch: ``broadcast_q_attention``.

>>> from jagflash.variants.broadcast_q import broadcast_q_attention
>>> out = broadcast_q_attention(q, k, v, kv_offsets)   # q [Lq,Hq,D], k/v [Tk,Hkv,D] -> [B,Lq,Hq,D]

Calls that share the K/V offsets and Lq (every layer of a model) can share one tile schedule:

>>> plan = make_plan(q, k, kv_offsets)
>>> out = broadcast_q_attention(q, k, v, kv_offsets, plan=plan)
"""

from __future__ import annotations

import torch

from jagflash.core.checks import check_broadcast_q_call, check_qkv
from jagflash.core.ops import call_problem, call_result, op_tail, plan_maker
from jagflash.core.options import BroadcastQOptions, BroadcastQPlanOptions, Unpack, resolve, takes
from jagflash.core.plan.model import Plan
from jagflash.core.registry import Variant
from jagflash.variants.broadcast_q import op
from jagflash.variants.broadcast_q.spec import SPEC

__all__ = ["SPEC", "VARIANT", "broadcast_q_attention", "make_plan"]


@takes(BroadcastQOptions, order="scale max_seqlen_kv return_lse deterministic plan backend")
def broadcast_q_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_offsets: torch.Tensor,
    **options: Unpack[BroadcastQOptions],
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

    Returns:
        ``out [B, Lq, Hq, D]`` in q's dtype, and LSE if asked. Backward: ``dq [Lq, Hq, D]``
        summed over the sequences, ``dk``, ``dv`` per sequence.

    There is no ``causal`` argument: the queries belong to no K/V sequence, so a causal mask
    has no meaning here (``jagflash.core.attention(..., causal=True)`` is refused).
    Inputs whose last dimension is not contiguous are copied. Invalid inputs raise
    :class:`~jagflash.core.capability.InvalidInput` and problems no backend implements raise
    :class:`~jagflash.core.capability.UnsupportedProblem`, each listing every reason.
    """
    o = resolve("broadcast_q_attention", BroadcastQOptions, options)
    plan, max_seqlen_kv = o["plan"], o["max_seqlen_kv"]
    check_broadcast_q_call(
        "broadcast_q_attention", q, k, v, kv_offsets, max_seqlen_kv=max_seqlen_kv, plan=plan
    )
    out, lse = op.call_fwd(
        q, k, v, kv_offsets, -1 if max_seqlen_kv is None else int(max_seqlen_kv), *op_tail(o, q),
        *(plan.op_args() if plan is not None and o["backend"] != "reference" else (None, None, None)),
    )
    return call_result(out, lse, o)


@takes(BroadcastQPlanOptions)
def make_plan(
    q: torch.Tensor, k: torch.Tensor, kv_offsets: torch.Tensor, **options: Unpack[BroadcastQPlanOptions]
) -> Plan:
    """The load-balancing :class:`~jagflash.core.plan.model.Plan` of a broadcast-Q batch: the
    jagged problem whose sequence ``b`` has Lq queries (output rows ``b*Lq`` on) and the K/V of
    sequence ``b``; no host sync. ``q`` ``[Lq, Hq, D]`` and ``k`` ``[Tk, Hkv, D]`` give only
    shapes and device; ``kv_offsets`` as for :func:`broadcast_q_attention`."""
    return _make_plan(q, k, None, kv_offsets, options)


def _rows(q, k, _q_offsets, kv_offsets, o: dict) -> tuple[list[str], dict]:
    """The rows a broadcast-Q plan lays out: sequence ``b``'s Lq output rows and its K/V."""
    reasons = check_qkv(q, k, k, rank=3, layout_doc="[rows, H, D]")
    if reasons:
        return reasons, {}
    return [], {
        "q": q, "k": k, "q_offsets": op.output_offsets(q, kv_offsets), "kv_offsets": kv_offsets,
        "total_q": (kv_offsets.numel() - 1) * q.shape[0], "causal": False, "max_seqlen_q": q.shape[0],
    }


_make_plan = plan_maker(
    SPEC, layout="broadcast_q", who="jagflash.variants.broadcast_q.make_plan", options=BroadcastQPlanOptions,
    rows=_rows,
)


VARIANT = Variant(spec=SPEC, problem=call_problem("broadcast_q"), run=broadcast_q_attention, priority=0)
