"""Broadcast-Q on Hopper with TLX: the warp-specialised kernels of ``jagflash.core.tlx``
with ``q_shared``: sequence ``b``'s q-tiles read the one shared Q block and write rows
``b * Lq + m`` of the output (and read those of dO), so the batch is the jagged problem whose
sequence ``b`` has Lq queries, laid out (and cost-sorted by its K/V length) by a Plan like any
jagged batch. LSE ``[B, Hq, Lq]`` is stored in place (``lse_per_sequence``) and the backward
reads it there.
The backward runs the portable dQ pass (dQ summed over the sequences by atomics, or in order
with ``deterministic``; it also computes delta) and then the TLX dK/dV pass (the one-pass
``jagflash.core.tlx.bwd_sm90.backward`` only where ``jagflash.core.tuning.use_one_pass`` says so)."""

from __future__ import annotations

import torch

from jagflash.core.plan.build import make_plan
from jagflash.core.plan.model import Plan
from jagflash.core.tlx import bwd_sm90, fwd_sm90
from jagflash.core.tuning import tlx_sm90_blocks
from jagflash.variants.broadcast_q import kernels_portable
from jagflash.variants.broadcast_q.op import output_offsets

__all__ = ["backward", "forward"]


def _plan(q: torch.Tensor, k: torch.Tensor, kv_offsets: torch.Tensor, left: int, right: int, backward: bool) -> tuple[Plan, torch.Tensor]:
    """The plan of a call that passed none, and the offsets of its output rows."""
    lq = q.shape[0]
    q_offsets = output_offsets(q, kv_offsets)
    blocks = tlx_sm90_blocks(q.shape[-1])
    (bm, bn), dkdv = blocks["fwd"], blocks["dkdv"]
    plan = make_plan(
        q_offsets, kv_offsets, total_q=(kv_offsets.numel() - 1) * lq, total_kv=k.shape[0],
        heads_q=q.shape[1], heads_kv=k.shape[1], window=(left, right), block_m=bm, block_n=bn,
        dkdv_blocks=dkdv, max_seqlen_q=lq, backward=backward,
    )
    return plan, q_offsets


def _given(plan: Plan | None, q, k, kv_offsets, left, right, backward) -> tuple[Plan, torch.Tensor]:
    if plan is None:
        return _plan(q, k, kv_offsets, left, right, backward)
    return plan, plan.q_offsets


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_offsets: torch.Tensor, *, left: int,
    right: int, scale: float, plan: Plan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """O ``[B, Lq, Hq, D]`` and LSE ``[B, Hq, Lq]`` fp32; ``plan``: the call's (checked) Plan,
    or ``None`` to lay one out here."""
    lq, hq, dim = q.shape
    batch = kv_offsets.numel() - 1
    plan, q_offsets = _given(plan, q, k, kv_offsets, left, right, backward=False)
    out, lse = fwd_sm90.forward(
        q, k, v, q_offsets, kv_offsets, lq, left=left, right=right, scale=scale, plan=plan,
        q_shared=True, lse_per_sequence=True,
    )
    return out.view(batch, lq, hq, dim), lse


def backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, kv_offsets: torch.Tensor, *, left: int, right: int, scale: float,
    deterministic: bool, plan: Plan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ ``[Lq, Hq, D]`` (summed over the sequences), dK, dV. dK/dV are deterministic; dQ is
    when ``deterministic``. ``plan`` as for :func:`forward` (its dK/dV pass is used)."""
    plan, q_offsets = _given(plan, q, k, kv_offsets, left, right, backward=True)

    def dq_pass():
        dq, delta = kernels_portable.backward_dq(
            dout, q, k, v, out, lse, kv_offsets, left=left, right=right, scale=scale,
            deterministic=deterministic, backend="portable",
        )
        return dq.to(q.dtype), delta

    return bwd_sm90.dispatch_backward(
        dout, q, k, v, out, lse, q_offsets, kv_offsets, dq_pass, left=left, right=right, scale=scale,
        deterministic=deterministic, plan=plan, q_shared=True,
    )
