"""A sequential recommender over jagged user histories (SASRec / HSTU-like), with three attentions.

- :func:`make_histories`: synthetic user histories whose lengths follow a log-normal (heavy
  tailed) distribution, with structure to learn: each user draws from a taste cluster
  (Zipf-popular items), and an item is often followed by its fixed successor.
- :class:`Recommender`: item + position embeddings, ``layers`` pre-norm causal transformer
  blocks, a next-item head scored against the item embeddings; the loss is a sampled softmax
  (the true next item against ``negatives`` uniformly sampled items).
- ``attention=`` picks how the blocks attend, everything else being the same code:
  ``"jagflash"`` (``jagged_attention`` over the jagged batch, one load-balancing plan shared by
  every layer), ``"varlen"`` (torch's ``varlen_attn``, FlashAttention 2, jagged too) and
  ``"sdpa"`` (the batch padded to its longest history, ``scaled_dot_product_attention`` with a
  causal mask: the whole model then runs on the padded tokens, as a padded pipeline does).

Rows of a padded batch are right-padded, so under the causal mask a real token never sees a
pad and the real tokens' outputs equal the jagged model's (``test_recsys.py`` checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

ATTENTIONS = ("jagflash", "varlen", "sdpa")


@dataclass(frozen=True)
class Histories:
    """``items [T]`` int64 (ids from 1; 0 is the pad id), ``offsets [B+1]``: user ``b``'s history
    is ``items[offsets[b]:offsets[b+1]]``, oldest first."""

    items: torch.Tensor
    offsets: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def batch(self, users: torch.Tensor) -> Histories:
        """The histories of ``users`` (indices), back to back."""
        starts, lens = self.offsets[users], self.lengths[users]
        offsets = torch.zeros(len(users) + 1, dtype=torch.int64, device=self.items.device)
        offsets[1:] = lens.cumsum(0)
        rows = torch.repeat_interleave(starts - offsets[:-1], lens) + torch.arange(int(offsets[-1]), device=self.items.device)
        return Histories(self.items[rows], offsets)

    def to(self, device: torch.device | str) -> Histories:
        return Histories(self.items.to(device), self.offsets.to(device))


def make_histories(
    users: int,
    items: int,
    *,
    median_len: float,
    sigma: float = 1.2,
    min_len: int = 2,
    max_len: int,
    clusters: int = 16,
    follow: float = 0.5,
    seed: int = 0,
) -> Histories:
    """``users`` histories over ``items`` item ids (1..items), lengths log-normal with the given
    median and ``sigma`` (heavy tailed), clipped to ``[min_len, max_len]``. Each user belongs to
    one of ``clusters`` taste clusters and draws Zipf-popular items of it; with probability
    ``follow`` an item is instead the fixed successor of the previous one."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.exp(math.log(median_len) + sigma * torch.randn(users, generator=gen))
    lens = lens.round().clamp(min_len, max_len).long()
    per_cluster = items // clusters
    ranks = torch.arange(1, per_cluster + 1, dtype=torch.float64)
    zipf = (1.0 / ranks) / (1.0 / ranks).sum()
    cluster = torch.randint(clusters, (users,), generator=gen)
    successor = torch.randperm(items, generator=gen) + 1  # successor[i - 1] follows item i
    longest = int(lens.max())
    draws = torch.multinomial(zipf, users * longest, replacement=True, generator=gen).view(longest, users)
    grid = cluster * per_cluster + draws + 1  # [position, user]
    follows = torch.rand(longest, users, generator=gen) < follow
    for t in range(1, longest):  # the successor chain is sequential in t, vectorised over users
        grid[t] = torch.where(follows[t], successor[grid[t - 1] - 1], grid[t])
    grid = grid.t()
    valid = torch.arange(longest) < lens[:, None]
    offsets = torch.zeros(users + 1, dtype=torch.int64)
    offsets[1:] = lens.cumsum(0)
    return Histories(grid[valid], offsets)


def pad(h: Histories) -> tuple[Histories, torch.Tensor]:
    """The batch right-padded to its longest history (pad id 0): a jagged batch whose every
    length is that maximum, and the mask of its real tokens."""
    b, longest = len(h.lengths), int(h.lengths.max())
    real = torch.arange(longest, device=h.items.device) < h.lengths[:, None]
    grid = torch.zeros(b, longest, dtype=h.items.dtype, device=h.items.device)
    grid[real] = h.items
    offsets = torch.arange(b + 1, device=h.items.device) * longest
    return Histories(grid.flatten(), offsets), real.flatten()


class Attention(nn.Module):
    """Causal self-attention of every history over itself, by one of :data:`ATTENTIONS`."""

    def __init__(self, dim: int, heads: int, attention: str):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"attention {attention!r} not in {ATTENTIONS}")
        self.heads, self.attention = heads, attention
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, max_len: int, shared: dict) -> torch.Tensor:
        t, dim = x.shape
        q, k, v = self.qkv(x).view(t, 3, self.heads, dim // self.heads).unbind(1)
        if self.attention == "jagflash":
            from jagflash.variants.jagged import jagged_attention, make_plan

            if "plan" not in shared:  # one plan per batch, shared by every layer and its backward
                shared["plan"] = make_plan(q, k, offsets, offsets, causal=True, max_seqlen_q=max_len, max_seqlen_kv=max_len)
            o = jagged_attention(q, k, v, offsets, offsets, causal=True, max_seqlen_q=max_len, max_seqlen_kv=max_len, plan=shared["plan"])
        elif self.attention == "varlen":
            o = _varlen_causal(q, k, v, offsets.to(torch.int32), max_len)
        else:  # a padded batch: every history has max_len tokens
            b = offsets.numel() - 1
            q, k, v = (z.view(b, max_len, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(t, self.heads, -1)
        return self.out(o.reshape(t, dim))


def _varlen_causal(q, k, v, cu: torch.Tensor, max_len: int) -> torch.Tensor:
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    if "window_size" in inspect.signature(varlen_attn).parameters:
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, window_size=(-1, 0))
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, is_causal=True)  # torch <= 2.10


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, attention: str):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, attention)
        self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, offsets, max_len, shared):
        x = x + self.attn(self.norm1(x), offsets, max_len, shared)
        return x + self.ffn(self.norm2(x))


class Recommender(nn.Module):
    """Next-item model over jagged histories; :meth:`loss` is the sampled-softmax training loss."""

    def __init__(self, items: int, *, dim: int, heads: int, layers: int, max_len: int, attention: str):
        super().__init__()
        self.attention = attention
        self.item = nn.Embedding(items + 1, dim, padding_idx=0)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, attention) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        nn.init.normal_(self.item.weight, std=dim**-0.5)
        nn.init.normal_(self.pos.weight, std=0.02)

    def hidden(self, h: Histories) -> torch.Tensor:
        """``states [T, dim]``: one per token of ``h`` (the next-item query after it), whatever
        the attention's layout; a padded layout's pad positions are dropped."""
        if self.attention == "sdpa":
            h, real = pad(h)
        else:
            real = None
        max_len = int(h.lengths.max())
        pos = torch.arange(h.items.numel(), device=h.items.device) - torch.repeat_interleave(h.offsets[:-1], h.lengths)
        x = self.item(h.items) + self.pos(pos)
        shared: dict = {}
        for block in self.blocks:
            x = block(x, h.offsets, max_len, shared)
        x = self.norm(x)
        return x if real is None else x[real]

    def loss(self, h: Histories, negatives: int, gen: torch.Generator | None = None) -> torch.Tensor:
        """Mean sampled-softmax loss of predicting each history's next item from every prefix:
        the true next item against ``negatives`` items drawn uniformly (shared by the batch)."""
        states = self.hidden(h)
        last = torch.zeros(h.items.numel(), dtype=torch.bool, device=h.items.device)
        last[h.offsets[1:][h.lengths > 0] - 1] = True  # a history's last item has no next one
        queries, targets = states[:-1][~last[:-1]], h.items[1:][~last[:-1]]
        neg = torch.randint(1, self.item.num_embeddings, (negatives,), device=h.items.device, generator=gen)
        pos_logit = (queries * self.item(targets)).sum(-1, keepdim=True)
        neg_logit = queries @ self.item(neg).t()
        logits = torch.cat([pos_logit, neg_logit], dim=1).float()
        return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))
