"""Flash attention over dense batches: ``dense_attention``.

>>> from jagflash.variants.dense import dense_attention
>>> out = dense_attention(q, k, v, causal=True)

Layers of the same shapes can share one load-balancing Plan:

>>> plan = make_plan(q, k, causal=True)
>>> out = dense_attention(q, k, v, causal=True, plan=plan)
"""

from __future__ import annotations

import torch

from jagflash.core.checks import check_dense_call
from jagflash.core.ops import call_plan_layout, call_problem, call_result, op_tail
from jagflash.core.options import MaskedOptions, MaskedPlanOptions, Unpack, resolve, takes
from jagflash.core.plan.build import build_plan_ints
from jagflash.core.plan.model import PTR_DENSE, Plan, PlanInfo
from jagflash.core.registry import Variant
from jagflash.core.tuning import BACKEND_DEFAULT
from jagflash.variants.dense import op
from jagflash.variants.dense.spec import SPEC

__all__ = ["SPEC", "VARIANT", "dense_attention", "make_plan"]


@takes(MaskedOptions)
def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    **options: Unpack[MaskedOptions],
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention over a dense batch.

    Args:
        q: ``[B, Nq, Hq, D]``.
        k, v: ``[B, Nk, Hkv, D]`` with ``Hq % Hkv == 0`` (GQA/MQA: query head ``h`` reads kv
            head ``h // (Hq // Hkv)``). Nq != Nk is legal.
        causal: bottom-right aligned: query ``i`` sees keys ``j <= i + Nk - Nq``::

                Nq=3, Nk=5
                q0  x x x . .
                q1  x x x x .
                q2  x x x x x

            A query that sees no key (Nq > Nk) outputs 0 with LSE -inf and zero gradients.
        return_lse: also return LSE ``[B, Hq, Nq]`` fp32, natural log (no gradient).
        plan: the tile schedule (:func:`make_plan`), built once and shared by every call of
            these shapes, forward and backward; without one the call builds its own. A plan
            built for other shapes, heads, mask or tile sizes is refused. The ``reference``
            backend ignores it.

    Inputs whose last dimension is not contiguous are copied. Invalid inputs raise
    :class:`~jagflash.core.capability.InvalidInput`, unimplemented ones
    :class:`~jagflash.core.capability.UnsupportedProblem`, each listing every reason.
    """
    o = resolve("dense_attention", MaskedOptions, options)
    plan, causal, backend = o["plan"], o["causal"], o["backend"]
    needs_grad = check_dense_call("dense_attention", q, k, v, plan=plan)
    if plan is not None:
        plan_args = plan.op_args()
    elif backend == "reference":
        plan_args = (None, None, None)
    else:
        plan_args = _default_plan(q, k, causal, needs_grad, backend)
    out, lse = op.call_fwd(q, k, v, bool(causal), *op_tail(o, q), *plan_args)
    return call_result(out, lse, o)


_PLANS: dict[tuple, tuple[torch.Tensor, torch.Tensor, list[int]]] = {}
_PLANS_KEPT = 16


def _default_plan(q: torch.Tensor, k: torch.Tensor, causal: bool, backward: bool, backend: str | None):
    """The plan of a call without ``plan=``. A dense plan depends on shapes alone, so it is built
    once per (shapes, mask, tile sizes, device) and kept (the last ``_PLANS_KEPT``): a call then
    launches no plan-building kernels. Not kept while a CUDA graph is being captured (its
    memory belongs to the graph). Traced by ``torch.compile``, a call passes no plan: the backend
    is chosen inside the opaque op, so the forward and backward ops each lay out their own."""
    if torch.compiler.is_compiling():
        return None, None, None
    blocks, schedule, backward_schedule = _layout(q, k, causal, backend, BACKEND_DEFAULT, BACKEND_DEFAULT)
    # (the schedules follow from the backend, which the blocks name, the head dim and the mask)
    key = (q.device, tuple(q.shape), tuple(k.shape), bool(causal), bool(backward), tuple(sorted(blocks.items())))
    hit = _PLANS.get(key)
    if hit is None:
        hit = _build(
            q, k, causal=causal, blocks=blocks, schedule=schedule, backward_schedule=backward_schedule,
            backward=backward,
        )
        if not (q.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            while len(_PLANS) >= _PLANS_KEPT:
                _PLANS.pop(next(iter(_PLANS)))
            _PLANS[key] = hit
    return hit


def _layout(q, k, causal, backend, schedule, backward_schedule):
    """Tile sizes and schedules of a dense plan (``call_plan_layout``): without a mask every
    tile costs the same, which is what the default schedules are chosen on."""
    return call_plan_layout(
        SPEC, "dense", q, k, causal=causal, backend=backend, schedule=schedule,
        backward_schedule=backward_schedule, equal_costs=not causal,
    )


def _build(
    q: torch.Tensor, k: torch.Tensor, *, causal: bool, blocks: dict[str, tuple[int, int]],
    schedule: str, backward_schedule: str | None, workers: int | None = None, backward: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    b, nq, nk = q.shape[0], q.shape[1], k.shape[1]
    return build_plan_ints(
        *op._as_jagged(q, k), batch=b, total_q=b * nq, total_kv=b * nk, heads_q=q.shape[2],
        heads_kv=k.shape[2], causal=causal, blocks=blocks, max_seqlen_q=nq, max_seqlen_kv=nk,
        workers=workers, schedule=schedule, backward_schedule=backward_schedule, backward=backward,
        q_ptr=PTR_DENSE, kv_ptr=PTR_DENSE,
    )


@takes(MaskedPlanOptions)
def make_plan(q: torch.Tensor, k: torch.Tensor, **options: Unpack[MaskedPlanOptions]) -> Plan:
    """The tile schedule (:class:`~jagflash.core.plan.model.Plan`) of :func:`dense_attention` for
    q ``[B, Nq, Hq, D]`` and k ``[B, Nk, Hkv, D]`` (only shapes and device are read): build it
    once and pass ``plan=`` to every call of these shapes."""
    o = resolve("make_plan", MaskedPlanOptions, options)
    check_dense_call("jagflash.variants.dense.make_plan", q, k, k, plan=None, plan_only=True)
    blocks, schedule, backward_schedule = _layout(q, k, o["causal"], o["backend"], o["schedule"], o["backward_schedule"])
    tiles, meta, info = _build(
        q, k, causal=o["causal"], blocks=blocks, schedule=schedule, backward_schedule=backward_schedule,
        workers=o["workers"], backward=o["backward"],
    )
    return Plan(tiles, meta, PlanInfo.from_ints(info))


VARIANT = Variant(spec=SPEC, problem=call_problem("dense"), run=dense_attention, priority=0)
