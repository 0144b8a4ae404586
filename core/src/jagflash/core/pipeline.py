"""TLX building blocks for the Hopper (sm_90a) kernels: buffer rings, TMA loads into a ring,
and the host-side pieces (TMA descriptors over jagged tensors, the worker count).

Rings. A ring of ``NUM`` shared-memory buffers is driven by a running counter that producer and
consumer each advance once per buffer they pass: the slot is ``counter % NUM`` and the mbarrier
phase ``(counter // NUM) & 1``. A producer waits on the slot's *empty* barrier with the phase
flipped (the first pass through the ring must not block), the consumer on its *full* barrier
with the phase as is.

Jagged tensors and TMA. A descriptor covers the whole ``[T, H * D]`` tensor, so a tile that
runs past its sequence reads the next sequence's rows (or zeros past ``T``). The kernels make
that harmless instead of building a descriptor per sequence: scores of keys past the sequence
are masked to -inf (their probabilities are exactly 0), query rows past it are computed and
dropped, and every store into a jagged output is a masked store that never crosses the
sequence boundary. Per-sequence device descriptors would cost a descriptor write and a fence
per tile; the masked epilogue costs a predicated store, once per tile.

dQ write-back. The one-pass backward adds each kv-tile's share of dQ into an fp32 accumulator
with TMA reduce-adds (:func:`dq_reduce_add`). Tile rows past a sequence's end add exact zeros
(their dS is 0), so they need no mask either; a box's start along the contiguous dimension
must be 16-byte aligned, though (see there).

Importing this module needs the TLX plugin (``triton-utlx``); nothing imports it unless the TLX
backend is selected.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx


@triton.jit
def ring_slot(counter, NUM: tl.constexpr):
    """``(slot, phase)`` of the ``counter``-th pass through a ring of NUM buffers."""
    return counter % NUM, (counter // NUM) & 1


@triton.jit
def tma_load(desc, buffer, full, empty, phase, row, col, NBYTES: tl.constexpr):
    """Producer side: wait until ``buffer`` is free (its ``empty`` barrier passed ``phase``), then
    start a TMA load of the tile at ``(row, col)``; ``full`` completes when the bytes land."""
    tlx.barrier_wait(empty, phase ^ 1)
    tlx.barrier_expect_bytes(full, NBYTES)
    tlx.async_descriptor_load(desc, buffer, [row, col], full)


@triton.jit
def ring_load(desc, buffers, fulls, empties, counter, row, col, NUM: tl.constexpr, NBYTES: tl.constexpr):
    """:func:`tma_load` into slot ``counter`` of a ring."""
    slot, phase = ring_slot(counter, NUM)
    tma_load(desc, buffers[slot], fulls[slot], empties[slot], phase, row, col, NBYTES)


@triton.jit
def ring_acquire(buffers, fulls, counter, NUM: tl.constexpr):
    """Consumer side: wait for slot ``counter`` to be full; returns ``(buffer, slot)``."""
    slot, phase = ring_slot(counter, NUM)
    tlx.barrier_wait(fulls[slot], phase)
    return buffers[slot], slot


@triton.jit
def ring_release(empties, slot):
    """Consumer side: hand slot ``slot`` back to the producer."""
    tlx.barrier_arrive(empties[slot], 1)


@triton.jit
def record_publish(fields, fulls, empties, counter, values, NUM: tl.constexpr):
    """Producer side of a record ring: wait until slot ``counter`` of a ring of NUM records is
    free, write the tuple of int32 ``values`` there and mark it full. A record of F fields is F
    one-int buffers, ``fields[slot * F + j]`` (``fields``: ``NUM * F`` buffers of shape (1,)).
    Every thread of the producer writes the same values; Triton's warpgroup barrier orders the
    writes before the one thread that arrives."""
    slot, phase = ring_slot(counter, NUM)
    tlx.barrier_wait(empties[slot], phase ^ 1)
    for j in tl.static_range(len(values)):
        tlx.local_store(fields[slot * len(values) + j], tl.full([1], values[j], tl.int32))
    tlx.barrier_arrive(fulls[slot], 1)


@triton.jit
def record_take(fields, fulls, empties, counter, FIELDS: tl.constexpr, NUM: tl.constexpr):
    """Consumer side of a record ring: the FIELDS int32 values (a tuple) of slot ``counter``
    once the producer published them (:func:`record_publish`); the slot is released as soon as
    they are read (the empty barrier counts one arrival per consumer warpgroup)."""
    slot, phase = ring_slot(counter, NUM)
    tlx.barrier_wait(fulls[slot], phase)
    values = ()
    for j in tl.static_range(FIELDS):
        values = values + (tl.sum(tlx.local_load(fields[slot * FIELDS + j]), 0),)  # noqa: RUF005 (Triton's frontend concatenates tuples; no unpacking)
    ring_release(empties, slot)
    return values


@triton.jit
def tile_publish(ids, fulls, empties, counter, index, NUM: tl.constexpr):
    """Producer side of a tile-index ring (a dynamic schedule's persistent kernels): the record
    ring of one field, the table index ``index`` (:func:`record_publish`). Only the producer
    takes tiles from the schedule's atomic counter; the consumers learn each index from the ring
    (:func:`tile_take`), so all roles walk the same tiles."""
    record_publish(ids, fulls, empties, counter, (index,), NUM)


@triton.jit
def tile_take(ids, fulls, empties, counter, NUM: tl.constexpr):
    """Consumer side of a tile-index ring: the index in slot ``counter`` (:func:`record_take`)."""
    return record_take(ids, fulls, empties, counter, 1, NUM)[0]


@triton.jit
def opaque_zero(x):
    """An int32 zero computed from ``x`` (a scalar that changes every iteration) by inline PTX
    the compiler cannot see through. Indexing a buffer with ``i + opaque_zero(counter)`` inside
    a loop keeps its wgmma shared-memory descriptors in the loop: otherwise Triton hoists them
    (8 k-steps x 64 bits per operand) and, where registers are short, ptxas spills them and
    reloads them before every wgmma (bench/NOTES.md, 2026-12-01 session 4)."""
    return tl.inline_asm_elementwise("and.b32 $0, $1, 0;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def dq_reduce_add(desc, stages, first, NUM: tl.constexpr, counter, value, row, col):
    """Reduce-add the fp32 register tile ``value`` into global memory at ``(row, col)`` of
    ``desc`` through a ring of ``NUM`` shared-memory stages (``stages[first]`` to
    ``stages[first + NUM - 1]``, taken in turn with ``counter``): wait until the TMA store that
    last read this stage has read it, write the tile there, fence it for the async proxy, then
    one TMA ``cp.reduce.async.bulk`` add. The store runs while the warpgroup goes on; the next
    wait on the same stage is ``NUM`` tiles later (one stage: the next tile waits for this
    store; two: double-buffered).

    Called by all 128 threads of one warpgroup. One elected thread issues the stores, so only it
    can wait for them; Triton's shared-memory barrier pass puts a warpgroup barrier after the
    wait and after the fence (checked in the PTX: ``bar.sync <partition>, 128``), so no thread
    writes a stage still being read, nor does the store start before every thread has written.
    Before the kernel ends the caller waits for the last stores
    (``tlx.async_descriptor_store_wait(0)``).

    ``col`` (the coordinate along the descriptor's contiguous dimension) must be a multiple of
    16 bytes' worth of elements: an unaligned box start stops the kernel with an illegal
    instruction on the H200 (loads only ever offset the outer dimension, so they never meet
    this)."""
    stage = stages[first + counter % NUM]
    tlx.async_descriptor_store_wait(NUM - 1)
    tlx.local_store(stage, value)
    tlx.fence("async_shared")
    tlx.async_descriptor_store(desc, stage, [row, col], store_reduce="add")


# --- host side --------------------------------------------------------------------------------


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
    """Persistent grid size: one program per streaming multiprocessor."""
    return torch.cuda.get_device_properties(device).multi_processor_count
