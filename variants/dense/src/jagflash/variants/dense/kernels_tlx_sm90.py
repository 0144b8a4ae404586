"""Dense attention on Hopper with TLX: ``[B, N, H, D]`` seen as a jagged batch of B sequences of
N rows, run by the warp-specialised kernels of ``jagflash.core.tlx`` (LSE ``[B, H,
N]`` stored in place: ``lse_per_sequence``). The backward runs
the portable dQ pass (which also computes delta) and then the TLX dK/dV pass: deterministic (the
one-pass backward only where ``jagflash.core.tuning.use_one_pass`` says so, as in the jagged variant)."""

from __future__ import annotations

import torch

from jagflash.core.tlx import bwd_sm90, fwd_sm90

__all__ = ["backward", "forward"]


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan, *, left: int, right: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """O ``[B, Nq, Hq, D]`` and LSE ``[B, Hq, Nq]`` fp32; ``plan``: the call's Plan (its forward
    pass sets the tile order)."""
    batch, nq = q.shape[:2]
    nk = k.shape[1]
    out, lse = fwd_sm90.forward(
        q.reshape(batch * nq, *q.shape[2:]), k.reshape(batch * nk, *k.shape[2:]),
        v.reshape(batch * nk, *v.shape[2:]), plan.q_offsets, plan.kv_offsets, nq,
        left=left, right=right, scale=scale, plan=plan, lse_per_sequence=True,
    )
    return out.view(q.shape), lse


def backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, plan, *, left: int, right: int, scale: float, deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (``lse`` ``[B, Hq, Nq]``). Bitwise repeatable (two passes without atomics)
    unless ``deterministic`` is False and ``jagflash.core.tuning.use_one_pass`` picks the one-pass backward."""
    from jagflash.variants.dense import kernels_portable

    return bwd_sm90.dispatch_backward(
        dout, q, k, v, out, lse, plan.q_offsets, plan.kv_offsets,
        lambda: kernels_portable.backward_dq(
            dout, q, k, v, out, lse, plan, left=left, right=right, scale=scale, backend="portable"
        ),
        left=left, right=right, scale=scale, deterministic=deterministic, plan=plan,
    )
