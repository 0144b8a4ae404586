"""Jagged attention on Hopper with TLX: the warp-specialised kernels of
``jagflash.core.tlx`` on the jagged tensors as they are. The backward runs the
portable dQ pass (which also computes delta) and then the TLX dK/dV pass: deterministic. The
one-pass ``jagflash.core.tlx.bwd_sm90.backward`` (dQ added from every kv-tile) runs instead, without
``deterministic``, where ``jagflash.core.tuning.use_one_pass`` says so (D 64 and 128, causal or not,
no left bound)."""

from __future__ import annotations

import torch

from jagflash.core.plan.model import Plan
from jagflash.core.tlx import bwd_sm90, fwd_sm90
from jagflash.variants.jagged import kernels_portable

__all__ = ["backward", "forward"]

forward = fwd_sm90.forward


def backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor, plan: Plan, *, left: int,
    right: int, scale: float, deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV; bitwise repeatable (two passes without atomics) unless ``deterministic`` is
    False and ``jagflash.core.tuning.use_one_pass`` picks the one-pass backward."""
    return bwd_sm90.dispatch_backward(
        dout, q, k, v, out, lse, q_offsets, kv_offsets,
        lambda: kernels_portable.backward_dq(
            dout, q, k, v, out, lse, q_offsets, kv_offsets, plan, left=left, right=right, scale=scale,
            backend="portable",
        ),
        left=left, right=right, scale=scale, deterministic=deterministic, plan=plan,
    )
