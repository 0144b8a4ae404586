"""Host side of the TLX kernels: TMA descriptors over jagged tensors, the scratch allocator,
the persistent grid's size.

A descriptor covers the whole ``[T, H * D]`` tensor, so a tile that runs past its sequence reads
the next sequence's rows (or zeros past ``T``). The kernels make that harmless instead of
building a descriptor per sequence: scores of keys past the sequence are masked to -inf (their
probabilities are exactly 0), query rows past it are computed and dropped, and every store into a
jagged output is a masked store that never crosses the sequence boundary (per-sequence device
descriptors would cost a descriptor write and a fence per tile).
"""

from __future__ import annotations

import torch
import triton

__all__ = ["num_workers", "rows_descriptor", "set_tma_allocator", "vectors_descriptor"]


def rows_descriptor(t: torch.Tensor, block_rows: int, head_dim: int):
    """A TMA descriptor over ``t [T, H, D]`` (contiguous) seen as ``[T, H * D]``, with blocks of
    ``block_rows`` rows of one head: the tile of head ``h`` at row ``r`` is at ``[r, h * D]``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows = t.shape[0]
    width = t.shape[1] * t.shape[2]
    return TensorDescriptor(t, shape=[rows, width], strides=[width, 1], block_shape=[block_rows, head_dim])


def vectors_descriptor(t: torch.Tensor, block: int):
    """A TMA descriptor over per-query vectors ``t [H, rows]`` fp32 (contiguous, ``rows`` a
    multiple of 4: 16-byte aligned head rows), with blocks of ``block`` values of one head: the
    block of head ``h`` from row ``r`` is at ``[h, r]``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, shape=list(t.shape), strides=[t.stride(0), 1], block_shape=[1, block])


def set_tma_allocator() -> None:
    """Triton needs a scratch allocator for kernels that build descriptors on the device."""

    def alloc(size: int, align: int, stream):
        return torch.empty(size, dtype=torch.int8, device="cuda")

    triton.set_allocator(alloc)


def num_workers(device: torch.device) -> int:
    """Persistent grid size: one program per streaming multiprocessor
    (``jagflash.core.tile_scheduler.default_workers``: the SM count, read once per device)."""
    from jagflash.core.tile_scheduler import default_workers

    return default_workers(device)
