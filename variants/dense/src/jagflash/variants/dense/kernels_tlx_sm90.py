"""Dense attention on Hopper with TLX: ``[B, N, H, D]`` seen as a jagged batch of B sequences of
N rows, run by the warp-specialised kernels of ``jagflash.core.tlx`` (LSE ``[B, H,
N]`` stored in place: ``lse_per_sequence``). The backward runs
the portable dQ pass (which also computes delta) and then the TLX dK/dV pass: deterministic (the
one-pass backward only where ``jagflash.core.tuning.use_one_pass`` says so, as in the jagged variant)."""

from __future__ import annotations

import torch

from jagflash.core.tlx import bwd_sm90, fwd_sm90
from jagflash.core.tuning import use_one_pass

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

    batch, nq = q.shape[:2]
    nk = k.shape[1]
    if use_one_pass(deterministic, left, right, q.shape[-1]):
        dq, dk, dv = bwd_sm90.backward(
            dout.reshape(batch * nq, *dout.shape[2:]), q.reshape(batch * nq, *q.shape[2:]),
            k.reshape(batch * nk, *k.shape[2:]), v.reshape(batch * nk, *v.shape[2:]),
            out.reshape(batch * nq, *out.shape[2:]), lse, plan.q_offsets,
            plan.kv_offsets, left=left, right=right, scale=scale, plan=plan,
        )
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)
    dq, delta = kernels_portable.backward_dq(
        dout, q, k, v, out, lse, plan, left=left, right=right, scale=scale, backend="portable"
    )
    dk, dv = bwd_sm90.backward_dkdv(
        dout.reshape(batch * nq, *dout.shape[2:]), q.reshape(batch * nq, *q.shape[2:]),
        k.reshape(batch * nk, *k.shape[2:]), v.reshape(batch * nk, *v.shape[2:]),
        lse, delta, plan.q_offsets, plan.kv_offsets,
        left=left, right=right, scale=scale, plan=plan,
    )
    return dq, dk.view(k.shape), dv.view(v.shape)

