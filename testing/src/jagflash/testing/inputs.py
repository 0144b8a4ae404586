"""Fresh random inputs for tests: jagged batches from lengths, dense batches from shapes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from jagflash.core.jagged import offsets_from_lengths

offsets_of = offsets_from_lengths


def _randn(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


@dataclass(frozen=True)
class JaggedCase:
    """A jagged problem: per-sequence lengths, heads, head dim, dtype, mask, and a seed."""

    q_lens: tuple[int, ...]
    k_lens: tuple[int, ...]
    hq: int = 2
    hkv: int = 2
    head_dim: int = 32
    dtype: torch.dtype = torch.float32
    causal: bool = False
    seed: int = 0
    offsets_dtype: torch.dtype = torch.int32

    def build(self, device: torch.device | str, requires_grad: bool = True) -> dict[str, torch.Tensor]:
        return make_jagged(
            self.q_lens, self.k_lens, self.hq, self.hkv, self.head_dim, self.dtype, device,
            seed=self.seed, requires_grad=requires_grad, offsets_dtype=self.offsets_dtype,
        )


def make_jagged(
    q_lens: Sequence[int],
    k_lens: Sequence[int],
    hq: int,
    hkv: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    seed: int = 0,
    requires_grad: bool = True,
    offsets_dtype: torch.dtype = torch.int32,
) -> dict[str, torch.Tensor]:
    """q ``[sum(q_lens), hq, D]``, k/v ``[sum(k_lens), hkv, D]``, offsets, and a dout like q."""
    gen = torch.Generator().manual_seed(seed)
    tq, tk = sum(q_lens), sum(k_lens)
    q = _randn((tq, hq, head_dim), dtype, device, gen)
    k = _randn((tk, hkv, head_dim), dtype, device, gen)
    v = _randn((tk, hkv, head_dim), dtype, device, gen)
    dout = _randn((tq, hq, head_dim), dtype, device, gen)
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    return {
        "q": q, "k": k, "v": v, "dout": dout,
        "q_offsets": offsets_of(q_lens, device, offsets_dtype),
        "kv_offsets": offsets_of(k_lens, device, offsets_dtype),
    }


def make_dense(
    batch: int,
    nq: int,
    nk: int,
    hq: int,
    hkv: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    seed: int = 0,
    requires_grad: bool = True,
) -> dict[str, torch.Tensor]:
    """q ``[B, Nq, Hq, D]``, k/v ``[B, Nk, Hkv, D]`` and a dout like q."""
    gen = torch.Generator().manual_seed(seed)
    q = _randn((batch, nq, hq, head_dim), dtype, device, gen)
    k = _randn((batch, nk, hkv, head_dim), dtype, device, gen)
    v = _randn((batch, nk, hkv, head_dim), dtype, device, gen)
    dout = _randn((batch, nq, hq, head_dim), dtype, device, gen)
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    return {"q": q, "k": k, "v": v, "dout": dout}
