"""A small pre-norm transformer block over a jagged batch, built on :func:`jagged_attention`:
the example model of the distributed tests (DDP, FSDP2, ``torch.compile``) and of the bench's
training tokens/s.

>>> block = JaggedBlock(dim=256, heads=4, kv_heads=2)
>>> y = block(x, offsets)            # x [T, dim], offsets [B+1]; y [T, dim]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from jagflash.variants.jagged import jagged_attention

__all__ = ["JaggedBlock"]


class JaggedBlock(nn.Module):
    """``x + attn(norm(x))``, then ``+ mlp(norm(.))``, every sequence of the batch on its own.

    Args:
        dim: model width; ``dim % heads == 0``, head dim ``dim // heads``.
        heads, kv_heads: query heads and key/value heads (GQA: ``heads % kv_heads == 0``;
            default ``heads``).
        mlp_ratio: hidden width of the MLP over ``dim``.
        causal: bottom-right causal attention inside each sequence.
        attention: the attention, called as
            ``attention(q, k, v, offsets, offsets, causal=..., max_seqlen_q=..., max_seqlen_kv=...)``
            on ``[T, H, D]`` tensors; default :func:`jagged_attention` (its backend choice).
            Tests pass a reference here to train the same block as an oracle.
        device, dtype: of the parameters.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        kv_heads: int | None = None,
        *,
        mlp_ratio: int = 4,
        causal: bool = True,
        attention: Callable[..., torch.Tensor] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        kv_heads = heads if kv_heads is None else kv_heads
        reasons = []
        if dim % heads:
            reasons.append(f"dim {dim} is not a multiple of heads {heads}")
        if kv_heads < 1 or heads % kv_heads:
            reasons.append(f"heads {heads} is not a multiple of kv_heads {kv_heads}")
        if reasons:
            raise ValueError("JaggedBlock: " + "; ".join(reasons))
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.causal = causal
        self.attention = jagged_attention if attention is None else attention
        kw = {"device": device, "dtype": dtype}
        self.norm1 = nn.LayerNorm(dim, **kw)
        self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, **kw)
        self.proj = nn.Linear(dim, dim, **kw)
        self.norm2 = nn.LayerNorm(dim, **kw)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim, **kw), nn.GELU(), nn.Linear(mlp_ratio * dim, dim, **kw))

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, max_seqlen: int | None = None) -> torch.Tensor:
        """``x [T, dim]``, ``offsets [B+1]`` (as :func:`jagged_attention`'s); ``max_seqlen``: an
        upper bound of the lengths (spares a host sync on a GPU). Returns ``[T, dim]``."""
        t = x.shape[0]
        hd = self.head_dim
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * hd, self.kv_heads * hd, self.kv_heads * hd], dim=-1
        )
        att = self.attention(
            q.reshape(t, self.heads, hd), k.reshape(t, self.kv_heads, hd), v.reshape(t, self.kv_heads, hd),
            offsets, offsets, causal=self.causal, max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen,
        )
        x = x + self.proj(att.reshape(t, self.heads * hd))
        return x + self.mlp(self.norm2(x))
