"""The jagged attention ``torch.library`` ops: ``jagflash::jagged_fwd`` / ``jagged_bwd``.

The ops are opaque to ``torch.compile``: backend selection and the checks that read offsets'
values happen inside them, at run time, so a compiled graph has no break and no host sync of
its own. ``max_seqlen_* = -1`` means "not given": the op reads it from the offsets (one host
synchronisation on a GPU, which also validates the offsets' values).

The Plan (``jagflash.core.plan``) crosses the ops as ``plan_tiles``, ``plan_meta`` and
``plan_info``; the forward's autograd context saves them, so the backward runs on the plan the
forward ran on. Called without a plan (only code that calls an op directly does), an op builds
one for the passes it runs. ``deterministic`` is saved the same way and matters to the backward
alone: the TLX backward takes it (ordered two passes instead of dQ reduce-adds); the portable
and reference backwards are always deterministic and do not need it.
"""

from __future__ import annotations

import torch

from jagflash.core.backend import select
from jagflash.core.capability import InvalidInput
from jagflash.core.jagged import resolve_max_seqlen
from jagflash.core.mask import mask_bounds
from jagflash.core.ops import make_problem, register_autograd
from jagflash.core.plan.check import resolve_plan
from jagflash.core.plan.model import Plan
from jagflash.core.reference import reference_backward, reference_forward
from jagflash.variants.jagged.spec import SPEC


def _lengths(
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    tq: int,
    tk: int,
    max_seqlen_q: int,
    max_seqlen_kv: int,
) -> tuple[int, int]:
    """Validate the offsets' values where that costs no extra sync, and fill in unknown maxima."""
    reasons: list[str] = []
    if q_offsets.shape != kv_offsets.shape:
        reasons.append(
            f"q_offsets and kv_offsets must both have B+1 entries, got {q_offsets.numel()} and "
            f"{kv_offsets.numel()}"
        )
    rq, max_q = resolve_max_seqlen(q_offsets, tq, "q_offsets", max_seqlen_q, "q")
    rk, max_k = resolve_max_seqlen(kv_offsets, tk, "kv_offsets", max_seqlen_kv, "kv")
    reasons += rq + rk
    if reasons:
        raise InvalidInput("jagged_attention", reasons)
    return max_q, max_k


@torch.library.custom_op("jagflash::jagged_fwd", mutates_args=())
def jagged_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    causal: bool,
    scale: float,
    return_lse: bool,
    deterministic: bool,
    backend: str,
    plan_tiles: torch.Tensor | None = None,
    plan_meta: torch.Tensor | None = None,
    plan_info: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # Invalid offsets are the caller's error whatever backend would run: check them first.
    max_q, max_k = _lengths(q_offsets, kv_offsets, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_kv)
    problem = make_problem("jagged", q, k, causal=causal, return_lse=return_lse)
    choice = select(SPEC, problem, q.device, backend or None)
    left, right = mask_bounds(causal)
    if choice.name == "reference":
        return reference_forward(
            q, k, v, q_offsets, kv_offsets, causal=causal, window=(left, right), scale=scale
        )
    if choice.name == "tlx-sm90":
        from jagflash.variants.jagged import kernels_tlx_sm90

        plan = _plan(plan_tiles, plan_meta, plan_info, q, k, q_offsets, kv_offsets, max_q, max_k, left, right, choice.name, ("fwd",))
        return kernels_tlx_sm90.forward(
            q, k, v, q_offsets, kv_offsets, max_q, left=left, right=right, scale=scale, plan=plan
        )
    from jagflash.variants.jagged import kernels_portable

    plan = _plan(plan_tiles, plan_meta, plan_info, q, k, q_offsets, kv_offsets, max_q, max_k, left, right, choice.name, ("fwd",))
    return kernels_portable.forward(
        q, k, v, q_offsets, kv_offsets, plan, left=left, right=right, scale=scale,
        backend=choice.name,
    )


def _plan(tiles, meta, info, q, k, q_offsets, kv_offsets, max_q, max_k, left, right, backend, passes) -> Plan:
    from jagflash.core.tuning import plan_blocks

    return resolve_plan(
        "jagged_attention", tiles, meta, info, q_offsets=q_offsets, kv_offsets=kv_offsets,
        check_offsets=True, total_q=q.shape[0], total_kv=k.shape[0], heads_q=q.shape[1],
        heads_kv=k.shape[1], left=left, right=right, blocks=plan_blocks(backend, q.shape[-1]),
        passes=passes, max_seqlen_q=max_q, max_seqlen_kv=max_k,
    )


@jagged_fwd.register_fake
def _(q, k, v, q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv, causal, scale, return_lse, deterministic, backend, plan_tiles=None, plan_meta=None, plan_info=None):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("jagflash::jagged_bwd", mutates_args=())
def jagged_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    causal: bool,
    scale: float,
    return_lse: bool,
    deterministic: bool,
    backend: str,
    plan_tiles: torch.Tensor | None = None,
    plan_meta: torch.Tensor | None = None,
    plan_info: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    max_q, max_k = _lengths(q_offsets, kv_offsets, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_kv)
    problem = make_problem("jagged", q, k, causal=causal, backward=True, deterministic=deterministic)
    choice = select(SPEC, problem, q.device, backend or None)
    left, right = mask_bounds(causal)
    if choice.name == "reference":
        return reference_backward(
            dout, q, k, v, q_offsets, kv_offsets, causal=causal, window=(left, right), scale=scale
        )
    plan = _plan(plan_tiles, plan_meta, plan_info, q, k, q_offsets, kv_offsets, max_q, max_k, left, right, choice.name, ("dq", "dkdv"))
    if choice.name == "tlx-sm90":
        from jagflash.variants.jagged import kernels_tlx_sm90

        return kernels_tlx_sm90.backward(
            dout, q, k, v, out, lse, q_offsets, kv_offsets, plan, left=left, right=right, scale=scale,
            deterministic=deterministic,
        )
    from jagflash.variants.jagged import kernels_portable

    # Always deterministic (no atomics): ``deterministic`` asks nothing more of it.
    return kernels_portable.backward(
        dout, q, k, v, out, lse, q_offsets, kv_offsets, plan,
        left=left, right=right, scale=scale, backend=choice.name,
    )


@jagged_bwd.register_fake
def _(dout, q, k, v, out, lse, q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv, causal, scale, return_lse, deterministic, backend, plan_tiles=None, plan_meta=None, plan_info=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# what the public function calls: the op, or its body in plain eager mode (core.ops)
call_fwd = register_autograd(jagged_fwd, jagged_bwd)
