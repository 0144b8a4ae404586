"""The broadcast-Q ``torch.library`` ops: ``jagflash::broadcast_q_fwd`` / ``broadcast_q_bwd``.

The ops are opaque to ``torch.compile``: backend selection and the checks that read the
offsets' values happen inside them, at run time. ``max_seqlen_kv = -1`` means "not given": the
op reads it from the offsets (one host synchronisation on a GPU, which also validates them).
Only the backward's dK/dV grid needs it; the forward grid depends on Lq alone.
"""

from __future__ import annotations

import torch

from jagflash.core.backend import select
from jagflash.core.capability import InvalidInput
from jagflash.core.jagged import lse_by_sequence, resolve_max_seqlen
from jagflash.core.mask import mask_bounds
from jagflash.core.ops import make_problem, register_autograd, stepped_arange
from jagflash.core.reference import reference_backward, reference_forward
from jagflash.variants.broadcast_q.spec import SPEC

WHO = "broadcast_q_attention"


def _max_seqlen_kv(kv_offsets: torch.Tensor, tk: int, max_seqlen_kv: int) -> int:
    """Validate the offsets' values where that costs no extra sync; fill in an unknown maximum."""
    reasons, longest = resolve_max_seqlen(kv_offsets, tk, "kv_offsets", max_seqlen_kv, "kv")
    if reasons:
        raise InvalidInput(WHO, reasons)
    return longest


def output_offsets(q: torch.Tensor, kv_offsets: torch.Tensor) -> torch.Tensor:
    """Offsets of the output rows ``[B*Lq]``: sequence ``b`` owns rows ``b*Lq`` to ``(b+1)*Lq``
    (as do its expanded queries, its LSE row block and its dO).

    Every call with a plan needs them (the TLX kernels read a sequence's first output row
    there), and they depend on (B, Lq, device, dtype) alone: in plain eager mode they are kept
    (``core.ops.stepped_arange``), so a call does not launch kernels to make them again."""
    return stepped_arange(kv_offsets.numel(), q.shape[0], q.device, kv_offsets.dtype, (q, kv_offsets))


def _expanded(q: torch.Tensor, kv_offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q repeated once per K/V sequence as a jagged ``[B*Lq, Hq, D]`` and its offsets: the
    problem the reference backend solves (dQ is then the sum over the copies)."""
    b, lq = kv_offsets.numel() - 1, q.shape[0]
    qx = q.unsqueeze(0).expand(b, *q.shape).reshape(b * lq, *q.shape[1:])
    return qx, output_offsets(q, kv_offsets)


@torch.library.custom_op("jagflash::broadcast_q_fwd", mutates_args=())
def broadcast_q_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seqlen_kv: int,
    scale: float,
    return_lse: bool,
    deterministic: bool,
    backend: str,
    plan_tiles: torch.Tensor | None = None,
    plan_meta: torch.Tensor | None = None,
    plan_info: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    _max_seqlen_kv(kv_offsets, k.shape[0], max_seqlen_kv)  # invalid input first, then backends
    problem = make_problem("broadcast_q", q, k, causal=False, return_lse=return_lse)
    choice = select(SPEC, problem, q.device, backend or None)
    left, right = mask_bounds(False)
    b, (lq, hq, dim) = kv_offsets.numel() - 1, q.shape
    if choice.name == "reference":
        qx, q_offsets = _expanded(q, kv_offsets)
        out, lse = reference_forward(
            qx, k, v, q_offsets, kv_offsets, causal=False, window=(left, right), scale=scale
        )
        return out.view(b, lq, hq, dim), lse_by_sequence(lse, b)
    plan = _plan(plan_tiles, plan_meta, plan_info, q, k, kv_offsets, max_seqlen_kv, choice.name, ("fwd",))
    if choice.name == "tlx-sm90":
        from jagflash.variants.broadcast_q import kernels_tlx_sm90

        return kernels_tlx_sm90.forward(q, k, v, kv_offsets, left=left, right=right, scale=scale, plan=plan)
    from jagflash.variants.broadcast_q import kernels_portable

    return kernels_portable.forward(
        q, k, v, kv_offsets, left=left, right=right, scale=scale, backend=choice.name
    )


def _plan(tiles, meta, info, q, k, kv_offsets, max_seqlen_kv, backend, passes):
    """The Plan a call passed, checked against it (``None`` if it passed none: the TLX kernels
    then lay out their own; the portable broadcast-Q kernels take a plain grid and no plan)."""
    if tiles is None or meta is None or info is None:
        return None
    from jagflash.core.plan.check import resolve_plan
    from jagflash.core.tuning import plan_blocks

    left, right = mask_bounds(False)
    return resolve_plan(
        WHO, tiles, meta, info, q_offsets=output_offsets(q, kv_offsets), kv_offsets=kv_offsets,
        check_offsets=True, derived_q=True, total_q=(kv_offsets.numel() - 1) * q.shape[0], total_kv=k.shape[0],
        heads_q=q.shape[1], heads_kv=k.shape[1], left=left, right=right,
        blocks=plan_blocks(backend, q.shape[-1]), passes=passes, max_seqlen_q=q.shape[0],
        max_seqlen_kv=None if max_seqlen_kv < 0 else max_seqlen_kv,
    )


@broadcast_q_fwd.register_fake
def _(q, k, v, kv_offsets, max_seqlen_kv, scale, return_lse, deterministic, backend, plan_tiles=None, plan_meta=None, plan_info=None):
    b, (lq, hq, dim) = kv_offsets.shape[0] - 1, q.shape
    return q.new_empty((b, lq, hq, dim)), q.new_empty((b, hq, lq), dtype=torch.float32)


@torch.library.custom_op("jagflash::broadcast_q_bwd", mutates_args=())
def broadcast_q_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seqlen_kv: int,
    scale: float,
    return_lse: bool,
    deterministic: bool,
    backend: str,
    plan_tiles: torch.Tensor | None = None,
    plan_meta: torch.Tensor | None = None,
    plan_info: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    problem = make_problem(
        "broadcast_q", q, k, causal=False, backward=True, deterministic=deterministic
    )
    max_k = _max_seqlen_kv(kv_offsets, k.shape[0], max_seqlen_kv)
    choice = select(SPEC, problem, q.device, backend or None)
    left, right = mask_bounds(False)
    if choice.name == "reference":
        b, (lq, hq, dim) = kv_offsets.numel() - 1, q.shape
        qx, q_offsets = _expanded(q.float(), kv_offsets)  # dQ summed in fp32 below
        dqx, dk, dv = reference_backward(
            dout.reshape(b * lq, hq, dim), qx, k, v, q_offsets, kv_offsets,
            causal=False, window=(left, right), scale=scale,
        )
        return dqx.view(b, lq, hq, dim).sum(0).to(q.dtype), dk, dv
    if choice.name == "tlx-sm90":
        from jagflash.variants.broadcast_q import kernels_tlx_sm90

        plan = _plan(plan_tiles, plan_meta, plan_info, q, k, kv_offsets, max_k, choice.name, ("dkdv",))
        return kernels_tlx_sm90.backward(
            dout, q, k, v, out, lse, kv_offsets, left=left, right=right, scale=scale,
            deterministic=deterministic, plan=plan,
        )
    from jagflash.variants.broadcast_q import kernels_portable

    return kernels_portable.backward(
        dout, q, k, v, out, lse, kv_offsets, max_k, left=left, right=right, scale=scale,
        deterministic=deterministic, backend=choice.name,
    )


@broadcast_q_bwd.register_fake
def _(dout, q, k, v, out, lse, kv_offsets, max_seqlen_kv, scale, return_lse, deterministic, backend, plan_tiles=None, plan_meta=None, plan_info=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# what the public function calls: the op, or its body in plain eager mode (core.ops)
call_fwd = register_autograd(broadcast_q_fwd, broadcast_q_bwd)
