"""Input tensors of a workload, deterministic given (workload, set index, device).

Every process that benchmarks a workload (the main worker and the host-Triton worker) builds the
same tensors from the same seeds, so peers timed in different processes see identical inputs.
Values are standard normal (never zeros: they hide unwritten outputs and can run faster), drawn in
float32 with a ``torch.Generator`` on the target device, then cast.

Layouts (the canonical ones every provider's output and gradients are compared in):

==============  =============================  ==========================
kind            q                              out / dout
==============  =============================  ==========================
dense, jagged   ``[Tq, Hq, D]`` + q_offsets     ``[Tq, Hq, D]``
broadcast_q     ``[Lq, Hq, D]`` (one block)     ``[B, Lq, Hq, D]``
==============  =============================  ==========================

k and v are ``[Tk, Hkv, D]`` with kv_offsets. A dense batch is jagged with equal lengths, so
``q.view(B, N, Hq, D)`` is its ``[B, N, H, D]`` tensor without a copy. For broadcast_q,
``q_offsets`` describe the query block repeated once per sequence (what the expand-Q baseline and
the reference run).

A block-sparse workload's batch carries its ``block_mask`` (a ``jagflash.core.block_mask.BlockMask``
built from the pattern's seeded grid with ``from_dense``, the same for every input set): the mask
the providers run and the reference applies.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from jagflash.bench.workloads import Workload

__all__ = ["Batch", "make_batch", "torch_dtype"]


def torch_dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def _offsets(lengths: np.ndarray, device: torch.device) -> torch.Tensor:
    o = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=o[1:])
    return torch.tensor(o, dtype=torch.int32, device=device)


@dataclass
class Batch:
    """One input set of a workload (see the module docstring for layouts)."""

    workload: Workload
    q_lens: list[int]
    kv_lens: list[int]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    q_offsets: torch.Tensor  # int32 [B+1]
    kv_offsets: torch.Tensor  # int32 [B+1]
    block_mask: object | None = None  # jagflash.core.block_mask.BlockMask of a bs-* workload

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def num_seqs(self) -> int:
        return len(self.kv_lens)

    @property
    def max_q(self) -> int:
        return max(self.q_lens, default=0)

    @property
    def max_kv(self) -> int:
        return max(self.kv_lens, default=0)

    @property
    def total_q(self) -> int:
        return sum(self.q_lens)

    @property
    def total_kv(self) -> int:
        return sum(self.kv_lens)

    @functools.cached_property
    def q_offsets64(self) -> torch.Tensor:
        return self.q_offsets.to(torch.int64)

    @functools.cached_property
    def kv_offsets64(self) -> torch.Tensor:
        return self.kv_offsets.to(torch.int64)

    def dense_shape(self) -> tuple[int, int]:
        """``(B, N)`` of a dense batch."""
        n = self.q_lens[0] if self.q_lens else 0
        return self.num_seqs, n

    def out_shape(self) -> tuple[int, ...]:
        w = self.workload
        if w.kind == "broadcast_q":
            return (self.num_seqs, w.q_len, w.heads, w.head_dim)
        return (self.total_q, w.heads, w.head_dim)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.k, self.v, self.dout))


def make_batch(
    w: Workload,
    device: torch.device | str,
    index: int = 0,
    lengths: tuple[np.ndarray, np.ndarray] | None = None,
) -> Batch:
    """Input set ``index`` of ``w`` on ``device`` (set 0 is the one peers are checked on)."""
    device = torch.device(device)
    q_lens, kv_lens = lengths if lengths is not None else w.sample_lengths()
    dtype = torch_dtype(w.dtype)
    gen = torch.Generator(device=device)
    gen.manual_seed(1_000_003 * (w.seed + 1) + 7919 * index + 17)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    tq, tk = int(q_lens.sum()), int(kv_lens.sum())
    q_rows = w.q_len if w.kind == "broadcast_q" else tq
    q = randn(q_rows, w.heads, w.head_dim)
    k = randn(tk, w.hkv, w.head_dim)
    v = randn(tk, w.hkv, w.head_dim)
    if w.kind == "broadcast_q":
        dout = randn(len(kv_lens), w.q_len, w.heads, w.head_dim)
    else:
        dout = randn(tq, w.heads, w.head_dim)
    q_offsets, kv_offsets = _offsets(q_lens, device), _offsets(kv_lens, device)
    block_mask = None
    if w.blocks is not None:
        from jagflash.bench.sparsity import make_block_mask

        block_mask = make_block_mask(w.blocks, q_lens, kv_lens, w.causal, q_offsets, kv_offsets)
    return Batch(
        workload=w,
        q_lens=[int(x) for x in q_lens],
        kv_lens=[int(x) for x in kv_lens],
        q=q,
        k=k,
        v=v,
        dout=dout,
        q_offsets=q_offsets,
        kv_offsets=kv_offsets,
        block_mask=block_mask,
    )
