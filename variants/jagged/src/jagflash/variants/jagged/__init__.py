"""Flash attention over jagged batches: ``jagged_attention``.

>>> from jagflash.variants.jagged import jagged_attention
>>> out = jagged_attention(q, k, v, q_offsets, kv_offsets, causal=True)

Several layers over one batch share a load-balancing Plan, built once:

>>> plan = make_plan(q, k, q_offsets, kv_offsets, causal=True, schedule="dynamic")
>>> out = jagged_attention(q, k, v, q_offsets, kv_offsets, causal=True, plan=plan)
"""

from __future__ import annotations

import torch

from jagflash.core.checks import check_jagged_call, check_qkv, raise_if
from jagflash.core.jagged_call import op_lengths, op_plan, renest, unnest
from jagflash.core.ops import call_problem, call_result, default_scale, op_tail, plan_maker
from jagflash.core.options import JaggedOptions, JaggedPlanOptions, Unpack, resolve, takes
from jagflash.core.plan.model import Plan
from jagflash.core.registry import Variant
from jagflash.variants.jagged import op
from jagflash.variants.jagged.spec import SPEC

__all__ = ["SPEC", "VARIANT", "jagged_attention", "jagged_attention_backward", "make_plan"]


@takes(JaggedOptions)
def jagged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor | None = None,
    kv_offsets: torch.Tensor | None = None,
    *,
    decode: bool | None = None,
    **options: Unpack[JaggedOptions],
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of every query sequence over its own key/value sequence.

    Args:
        q: ``[Tq, Hq, D]`` queries of all sequences back to back, or a nested tensor
            ``[B, j, Hq, D]`` with ``layout=torch.jagged`` (then the offsets come from it and
            must not be passed; the output is a nested tensor too).
        k, v: ``[Tk, Hkv, D]``, ``Hq % Hkv == 0`` (GQA/MQA: query head ``h`` reads kv head
            ``h // (Hq // Hkv)``); or nested tensors like q.
        q_offsets, kv_offsets: ``[B+1]`` int32/int64 on q's device, non-decreasing, starting at
            0 and ending at Tq / Tk. Sequence ``b`` is rows ``offsets[b]:offsets[b+1]``;
            zero-length sequences are legal and produce no rows. Lq != Lk is legal.
        causal: bottom-right aligned: query ``i`` of a sequence with Lq queries and Lk keys sees
            keys ``j <= i + Lk - Lq``::

                Lq=3, Lk=5          Lq=5, Lk=3
                q0  x x x . .       q0  . . .    <- sees no key: output 0, LSE -inf
                q1  x x x x .       q1  . . .
                q2  x x x x x       q2  x . .
                                    q3  x x .
                                    q4  x x x

        return_lse: also return LSE ``[Hq, Tq]`` fp32, natural log, for merging partial
            attentions. It carries no gradient.
        plan: the load-balancing schedule of this batch (:func:`make_plan`), built once and
            passed to every layer that shares the offsets; its backward reuses it. Without one
            the call builds its own (a few small device ops, no host sync), or takes the one an
            earlier call built on the same offsets tensor, unwritten since (kept per
            storage and version counter: ``jagflash.core.jagged_call.PLAN_MEMO``). A plan built for
            other shapes, heads, mask, tile sizes or offsets is refused. The ``reference``
            backend ignores it.
        decode: the kernels of the forward and of the backward on the ``tlx-sm90`` and
            ``portable`` backends (and the interpreter). ``None`` (default): the decode kernels
            (``jagflash.core.portable.decode``: every query of a (sequence, kv head) in one
            program, sequences packed, long keys split and merged by LSE; the backward writes
            each key's dK, dV once, deterministic) where ``jagflash.core.tuning.use_decode``
            says so (``max_seqlen_q <= 16``), else the tile kernels; ``True``: the decode
            kernels (``UnsupportedProblem`` where they cannot run the problem: more than 128
            query rows per sequence and kv head, ``max_seqlen_q * Hq / Hkv``); ``False``: the
            tile kernels. ``last_choice("jagged").explain()`` says which ran and why ("forward
            path", "backward path"). A decode call with ``max_seqlen_q`` given builds no plan.
            The ``reference`` backend ignores it.

    Returns:
        ``out [Tq, Hq, D]`` in q's dtype (a nested tensor if q was one), and LSE if asked.

    Inputs whose last dimension is not contiguous are copied; all other strides are taken as
    they are. Invalid inputs raise :class:`~jagflash.core.capability.InvalidInput` and problems
    no backend implements raise :class:`~jagflash.core.capability.UnsupportedProblem`, each
    listing every reason, before any kernel runs.
    """
    o = resolve("jagged_attention", JaggedOptions, options)
    q, k, v, q_offsets, kv_offsets, nested_offsets = unnest("jagged_attention", q, k, v, q_offsets, kv_offsets)
    needs_grad = check_jagged_call(
        "jagged_attention", q, k, v, q_offsets, kv_offsets, max_seqlen_q=o["max_seqlen_q"],
        max_seqlen_kv=o["max_seqlen_kv"], plan=o["plan"],
    )
    plan_args = op_plan(
        SPEC, o["plan"], q, k, q_offsets, kv_offsets, causal=o["causal"], window=(-1, -1),
        max_seqlen_q=o["max_seqlen_q"], max_seqlen_kv=o["max_seqlen_kv"], backward=needs_grad,
        backend=o["backend"], decode=decode,
    )
    out, lse = op.call_fwd(
        q, k, v, q_offsets, kv_offsets, *op_lengths(o["max_seqlen_q"], o["max_seqlen_kv"]), bool(o["causal"]),
        *op_tail(o, q), *plan_args, None if decode is None else bool(decode),
    )
    return call_result(renest(out, nested_offsets), lse, o)


@takes(JaggedPlanOptions)
def make_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    **options: Unpack[JaggedPlanOptions],
) -> Plan:
    """The load-balancing :class:`~jagflash.core.plan.model.Plan` of a jagged batch for
    :func:`jagged_attention`, with this variant's tile sizes; no host sync.

    Build it once per batch and pass ``plan=`` to every call on these offsets (every layer, any
    q/k/v of the same shapes); the backward reuses it.

    Args:
        q, k: tensors shaped like the calls' q ``[Tq, Hq, D]`` and k ``[Tk, Hkv, D]`` (only
            shapes and device are read).
        q_offsets, kv_offsets: as for :func:`jagged_attention`.
    """
    return _make_plan(q, k, q_offsets, kv_offsets, options)


_make_plan = plan_maker(SPEC, layout="jagged", who="jagflash.variants.jagged.make_plan", options=JaggedPlanOptions)


def jagged_attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    deterministic: bool = False,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of :func:`jagged_attention` at a given ``out`` and ``lse``: ``(dq, dk, dv)``.

    With the ``out``/``lse`` this call's forward returns, the gradients autograd gives. With
    those of a larger attention of the same queries (more keys, partials merged by their LSE,
    as in context parallelism), the gradients of that attention restricted to this call: dQ
    this call's keys contribute, and dK/dV of its keys. ``dout``, ``out`` ``[Tq, Hq, D]`` in
    q's dtype; ``lse`` ``[Hq, Tq]`` fp32, natural log (-inf: the row sees no key anywhere);
    the other arguments as for :func:`jagged_attention`. A row that sees no key of this call
    gets dQ 0 from it. The call lays out its own Plan.
    """
    raise_if("jagged_attention_backward", check_qkv(q, k, v, rank=3, layout_doc="[T, H, D]"))
    reasons = []
    for name, t in (("dout", dout), ("out", out)):
        if not isinstance(t, torch.Tensor) or t.shape != q.shape:
            reasons.append(f"{name} must be shaped like q {tuple(q.shape)}, got {getattr(t, 'shape', type(t).__name__)}")
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (q.shape[1], q.shape[0]) or lse.dtype != torch.float32:
        reasons.append(f"lse must be fp32 [Hq, Tq] = {[q.shape[1], q.shape[0]]}, got {getattr(lse, 'dtype', None)} {getattr(lse, 'shape', None)}")
    raise_if("jagged_attention_backward", reasons)
    return op.jagged_bwd(
        dout.contiguous(), q, k, v, out.contiguous(), lse.contiguous(), q_offsets, kv_offsets,
        -1 if max_seqlen_q is None else int(max_seqlen_q),
        -1 if max_seqlen_kv is None else int(max_seqlen_kv),
        bool(causal), default_scale(scale, q.shape[-1]), False, bool(deterministic), backend or "",
    )


VARIANT = Variant(
    spec=SPEC, problem=call_problem("jagged"), run=jagged_attention, priority=0,
    backward=jagged_attention_backward,
)
