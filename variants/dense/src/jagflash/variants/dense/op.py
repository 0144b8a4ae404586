"""The dense attention ``torch.library`` ops: ``jagflash::dense_fwd`` / ``dense_bwd``.

The Plan (``jagflash.core.plan``) crosses the ops as ``plan_tiles``, ``plan_meta`` and
``plan_info``; the backward runs on the plan the forward saved. Called without one (only code
that calls an op directly does), an op builds one for the passes it runs. ``deterministic`` is
saved the same way and matters to the backward alone: the TLX backward takes it (ordered two
passes instead of dQ reduce-adds); the portable and reference backwards are always
deterministic and do not need it.
"""

from __future__ import annotations

import torch

from jagflash.core.backend import select
from jagflash.core.jagged import lse_by_sequence
from jagflash.core.mask import mask_bounds
from jagflash.core.ops import make_problem, register_autograd, stepped_arange
from jagflash.core.plan.check import resolve_plan
from jagflash.core.plan.model import Plan
from jagflash.core.reference import reference_backward, reference_forward
from jagflash.variants.dense.spec import SPEC


def _as_jagged(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets that view ``[B, N, H, D]`` as jagged ``[B*N, H, D]`` (the plan check of every
    call, the reference): kept per shape in plain eager mode (``core.ops.stepped_arange``)."""
    b, nq, nk = q.shape[0], q.shape[1], k.shape[1]
    return (
        stepped_arange(b + 1, nq, q.device, torch.int64, (q, k)),
        stepped_arange(b + 1, nk, q.device, torch.int64, (q, k)),
    )


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])


def _plan(tiles, meta, info, q, k, left, right, backend, passes) -> Plan:
    from jagflash.core.tuning import plan_blocks

    b, nq, nk = q.shape[0], q.shape[1], k.shape[1]
    q_offsets, kv_offsets = _as_jagged(q, k)
    return resolve_plan(
        "dense_attention", tiles, meta, info, q_offsets=q_offsets,
        kv_offsets=kv_offsets, check_offsets=False, total_q=b * nq, total_kv=b * nk,
        heads_q=q.shape[2], heads_kv=k.shape[2], left=left, right=right,
        blocks=plan_blocks(backend, q.shape[-1]), passes=passes, max_seqlen_q=nq,
        max_seqlen_kv=nk,
    )


@torch.library.custom_op("jagflash::dense_fwd", mutates_args=())
def dense_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    return_lse: bool,
    deterministic: bool,
    backend: str,
    plan_tiles: torch.Tensor | None = None,
    plan_meta: torch.Tensor | None = None,
    plan_info: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    problem = make_problem("dense", q, k, causal=causal, return_lse=return_lse)
    choice = select(SPEC, problem, q.device, backend or None)
    left, right = mask_bounds(causal)
    if choice.name == "reference":
        b = q.shape[0]
        out, lse = reference_forward(
            _flat(q), _flat(k), _flat(v), *_as_jagged(q, k), causal=causal,
            window=(left, right), scale=scale,
        )
        return out.view(q.shape), lse_by_sequence(lse, b)
    plan = _plan(plan_tiles, plan_meta, plan_info, q, k, left, right, choice.name, ("fwd",))
    if choice.name == "tlx-sm90":
        from jagflash.variants.dense import kernels_tlx_sm90

        return kernels_tlx_sm90.forward(q, k, v, plan, left=left, right=right, scale=scale)
    from jagflash.variants.dense import kernels_portable

    return kernels_portable.forward(q, k, v, plan, left=left, right=right, scale=scale, backend=choice.name)


@dense_fwd.register_fake
def _(q, k, v, causal, scale, return_lse, deterministic, backend, plan_tiles=None, plan_meta=None, plan_info=None):
    b, nq, hq, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, hq, nq), dtype=torch.float32)


@torch.library.custom_op("jagflash::dense_bwd", mutates_args=())
def dense_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
    return_lse: bool,
    deterministic: bool,
    backend: str,
    plan_tiles: torch.Tensor | None = None,
    plan_meta: torch.Tensor | None = None,
    plan_info: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    problem = make_problem("dense", q, k, causal=causal, backward=True, deterministic=deterministic)
    choice = select(SPEC, problem, q.device, backend or None)
    left, right = mask_bounds(causal)
    if choice.name == "reference":
        dq, dk, dv = reference_backward(
            _flat(dout), _flat(q), _flat(k), _flat(v), *_as_jagged(q, k), causal=causal,
            window=(left, right), scale=scale,
        )
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)
    plan = _plan(plan_tiles, plan_meta, plan_info, q, k, left, right, choice.name, ("dq", "dkdv"))
    if choice.name == "tlx-sm90":
        from jagflash.variants.dense import kernels_tlx_sm90

        return kernels_tlx_sm90.backward(
            dout, q, k, v, out, lse, plan, left=left, right=right, scale=scale,
            deterministic=deterministic,
        )
    from jagflash.variants.dense import kernels_portable

    # Always deterministic (no atomics): ``deterministic`` asks nothing more of it.
    return kernels_portable.backward(
        dout, q, k, v, out, lse, plan, left=left, right=right, scale=scale, backend=choice.name
    )


@dense_bwd.register_fake
def _(dout, q, k, v, out, lse, causal, scale, return_lse, deterministic, backend, plan_tiles=None, plan_meta=None, plan_info=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# what the public function calls: the op, or its body in plain eager mode (core.ops)
call_fwd = register_autograd(dense_fwd, dense_bwd)
