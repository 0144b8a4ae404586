"""References for every semantic of docs/semantics.md, computed in a chosen dtype (fp64 by default).

All are built on ``jagflash.core.reference.attention_reference`` (a plain loop over sequences
with a materialised mask), so dense and broadcast-Q are checked by the same oracle as jagged.
Gradients come from autograd through them (:func:`reference_grads`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from jagflash.core.reference import attention_reference


def jagged_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
    block_mask=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``out [Tq, Hq, D]``, ``lse [Hq, Tq]`` computed in ``dtype`` (under a
    ``jagflash.core.block_mask.BlockMask`` where given)."""
    return attention_reference(
        q, k, v, q_offsets, kv_offsets, causal=causal, window=window, scale=scale,
        compute_dtype=dtype, block_mask=block_mask,
    )


def dense_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, N, H, D]`` inputs: ``out [B, Nq, Hq, D]``, ``lse [B, Hq, Nq]``."""
    b, nq = q.shape[:2]
    nk = k.shape[1]
    ar = torch.arange(b + 1, device=q.device)
    out, lse = jagged_reference(
        q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), ar * nq, ar * nk,
        causal=causal, window=window, scale=scale, dtype=dtype,
    )
    return out.unflatten(0, (b, nq)), lse.unflatten(1, (b, nq)).transpose(0, 1)


def broadcast_q_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    window: tuple[int, int] = (-1, -1),
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One dense ``q [Lq, Hq, D]`` against every K/V sequence: ``out [B, Lq, Hq, D]``,
    ``lse [B, Hq, Lq]``. Q is expanded per sequence, so autograd sums dQ over sequences."""
    b = kv_offsets.numel() - 1
    lq = q.shape[0]
    qx = q.unsqueeze(0).expand(b, *q.shape).flatten(0, 1)
    q_offsets = torch.arange(b + 1, device=q.device) * lq
    out, lse = jagged_reference(
        qx, k, v, q_offsets, kv_offsets, window=window, scale=scale, dtype=dtype
    )
    return out.unflatten(0, (b, lq)), lse.unflatten(1, (b, lq)).transpose(0, 1)


def reference_grads(
    fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
    inputs: Sequence[torch.Tensor],
    dout: torch.Tensor,
    dtype: torch.dtype = torch.float64,
    **kwargs: object,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run reference ``fn`` on ``inputs`` upcast to ``dtype`` (tensors that are not floating
    point, e.g. offsets, pass through) and return ``(out, grads of the floating inputs)``."""
    leaves = [
        t.detach().to(dtype).requires_grad_() if t.is_floating_point() else t for t in inputs
    ]
    out = fn(*leaves, dtype=dtype, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    floats = [t for t in leaves if t.is_floating_point()]
    grads = torch.autograd.grad(out, floats, dout.to(dtype), allow_unused=True)
    return out.detach(), tuple(
        torch.zeros_like(t) if g is None else g for g, t in zip(grads, floats)
    )
