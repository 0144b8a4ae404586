"""Dense attention on Hopper with TLX: ``[B, N, H, D]`` seen as a jagged batch of B sequences of
N rows, run by the warp-specialised forward of ``jagflash.core.tlx_attention``.
(Backward: portable kernels.)"""

from __future__ import annotations

import torch

from jagflash.core import tlx_attention

__all__ = ["compile_configs", "forward"]


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, left: int, right: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """O ``[B, Nq, Hq, D]`` and LSE ``[B, Hq, Nq]`` fp32."""
    batch, nq, hq, _ = q.shape
    nk = k.shape[1]
    steps = torch.arange(batch + 1, device=q.device, dtype=torch.int32)
    out, lse = tlx_attention.forward(
        q.reshape(batch * nq, *q.shape[2:]), k.reshape(batch * nk, *k.shape[2:]),
        v.reshape(batch * nk, *v.shape[2:]), steps * nq, steps * nk, nq,
        left=left, right=right, scale=scale,
    )
    return out.view(q.shape), lse.view(hq, batch, nq).transpose(0, 1).contiguous()


def compile_configs():
    return tlx_attention.compile_configs()
