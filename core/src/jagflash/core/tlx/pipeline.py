"""TLX building blocks of the Hopper (sm_90a) kernels, used by the producer and the consumers
alike: buffer rings, record rings, the tile walk over a Plan, the named barriers between the
consumer warpgroups, and the staged dQ reduce-add.

Rings. A ring of ``NUM`` shared-memory buffers is driven by a running counter that producer and
consumer each advance once per buffer they pass: the slot is ``counter % NUM`` and the mbarrier
phase ``(counter // NUM) & 1``. A producer waits on the slot's *empty* barrier with the phase
flipped (the first pass through the ring must not block), the consumer on its *full* barrier
with the phase as is. ``tlx.barrier_arrive`` syncs the calling warpgroup and arrives once (from
its first thread), so every thread's accesses before it are ordered before the arrival.

The walk. Producer and consumers walk the same tiles of a Plan pass (:func:`walk_first`,
:func:`walk_next`): a static deal is computed by every role, a dynamic one is taken by the
producer from the launch's atomic counter and published to the consumers through a record ring.

Named barriers (ids 0-3 are Triton's own, one per partition and the whole block):
:data:`TURN_0` / :data:`TURN_1` hand the turn to issue between the two consumer warpgroups
(:func:`turn_wait`, :func:`turn_pass`); :func:`consumers_sync` joins both warpgroups.

dQ write-back. The one-pass backward adds each kv-tile's share of dQ into an fp32 accumulator
with TMA reduce-adds (:func:`dq_reduce_add`). Tile rows past a sequence's end add exact zeros
(their dS is 0), so they need no mask either; a box's start along the contiguous dimension
must be 16-byte aligned, though (see there). A consumer warpgroup that owns a sequence's dQ
columns (``jagflash.core.tuning.own_span``) zeroes them before its first add
(:func:`own_rows_zero`) and writes dQ from them after its last (:func:`own_rows_cast`): the
exact zeros another sequence's tail adds into them change nothing, before, between or after.
With ``SOLE_DQ`` a step whose dQ cell no other kv-tile adds into stores its dQ (a TMA store from a bf16
stage) instead of adding it (:func:`dq_add_or_store`): those cells never touch the accumulator.

Importing this module needs the TLX plugin (``triton-utlx``); nothing imports it unless the TLX
backend is selected.
"""

from __future__ import annotations

import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jagflash.core.dtypes import output
from jagflash.core.tile_scheduler import sched_first, sched_next

#: Named barriers of the consumer warpgroups' turn to issue (one each) and of their joint sync.
TURN_0 = tl.constexpr(9)
TURN_1 = tl.constexpr(10)
CONSUMERS = tl.constexpr(11)
#: Named barriers of one consumer warpgroup's owned dQ rows (one each: DQ_ROWS + CID).
DQ_ROWS = tl.constexpr(12)
#: Rows of an owned sequence's dQ a consumer warpgroup zeroes or writes at once.
OWN_ROWS = tl.constexpr(64)
#: Depth of a dynamic walk's tile-index ring: the producer claims a tile one ahead of the one it
#: loads for, and the Q / K/V buffers keep it at most one more tile ahead of the consumers.
ID_RING = tl.constexpr(2)


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
def record_read(fields, counter, FIELDS: tl.constexpr, NUM: tl.constexpr, first=0, COUNT: tl.constexpr = None):
    """The int32 values (a tuple) in slot ``counter`` of a record ring of FIELDS fields, read
    without waiting or releasing: all FIELDS, or the COUNT fields from ``first`` on (``first``
    may be a run-time value: a record of a variable part per head, read in a head loop).
    :func:`record_wait`'s read, and the producer's own read-back of a record it published (its
    threads wrote the slot, which is not written again before the producer publishes record
    ``counter + NUM``)."""
    N: tl.constexpr = FIELDS if COUNT is None else COUNT
    at = (counter % NUM) * FIELDS + first
    values = ()
    for j in tl.static_range(N):
        values = values + (tl.sum(tlx.local_load(fields[at + j]), 0),)  # noqa: RUF005 (Triton's frontend concatenates tuples; no unpacking)
    return values


@triton.jit
def record_wait(fields, fulls, counter, FIELDS: tl.constexpr, NUM: tl.constexpr, COUNT: tl.constexpr = None):
    """Consumer side of a record ring: the int32 values (a tuple: all FIELDS, or the first
    COUNT) of slot ``counter`` once the producer published them (:func:`record_publish`), the
    slot kept: the consumer may read more of it (:func:`record_read`) and hands it back with
    ``ring_release(empties, counter % NUM)`` (the empty barrier counts one arrival per consumer
    warpgroup)."""
    slot, phase = ring_slot(counter, NUM)
    tlx.barrier_wait(fulls[slot], phase)
    return record_read(fields, counter, FIELDS, NUM, 0, COUNT)


@triton.jit
def record_take(fields, fulls, empties, counter, FIELDS: tl.constexpr, NUM: tl.constexpr):
    """:func:`record_wait`, the slot released as soon as its values are read."""
    values = record_wait(fields, fulls, counter, FIELDS, NUM)
    ring_release(empties, counter % NUM)
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
    dq_stage_add(desc, dq_stage_fill(stages, first, NUM, counter, value), row, col)


@triton.jit
def dq_stage_fill(stages, first, NUM: tl.constexpr, counter, value):
    """:func:`dq_reduce_add`'s first half: the stage ``counter`` takes (:func:`dq_stage_take`),
    holding ``value``."""
    stage = dq_stage_take(stages, first, NUM, counter)
    tlx.local_store(stage, value)
    return stage


@triton.jit
def dq_stage_take(stages, first, NUM: tl.constexpr, counter):
    """The stage ``counter`` takes of ``stages[first]`` to ``stages[first + NUM - 1]``, once the
    TMA store that last read it has read it (with ``NUM`` 1 that wait covers every store this
    warpgroup issued before: :func:`dq_add_or_store`'s bf16 stage too)."""
    stage = stages[first + counter % NUM]
    tlx.async_descriptor_store_wait(NUM - 1)
    return stage


@triton.jit
def dq_stage_add(desc, stage, row, col):
    """:func:`dq_reduce_add`'s second half: the filled ``stage`` fenced for the async proxy, then
    reduce-added at ``(row, col)`` of ``desc`` by one TMA store."""
    tlx.fence("async_shared")
    tlx.async_descriptor_store(desc, stage, [row, col], store_reduce="add")


@triton.jit
def dq_add_or_store(desc, stages, first, NUM: tl.constexpr, counter, value, row, col, alone, sole, DTYPE: tl.constexpr):
    """:func:`dq_reduce_add` (with ``NUM`` 1, so that its wait also frees the consumer's bf16
    stage), or with ``SOLE_DQ`` where ``alone`` (no other kv-tile adds into this step's dQ cell:
    ``jagflash.core.tlx.bwd_preprocess.dq_cell_counts``) the tile's dQ itself: ``value`` x
    ``scale`` in DTYPE written to the consumer's bf16 stage and stored at ``(row, col)`` of dQ
    by one plain TMA store (``sole``: ``(desc_dqo, bf16 stages, scale)``). A cell that crosses
    its sequence's end is never alone (its count is one higher), as a whole-box store would
    overwrite the next sequence's rows."""
    stage = dq_stage_take(stages, first, NUM, counter)
    if alone:
        out = sole[1][first // NUM]
        tlx.local_store(out, output(value * sole[2], DTYPE))
        tlx.fence("async_shared")
        tlx.async_descriptor_store(sole[0], out, [row, col])
    else:
        tlx.local_store(stage, value)
        dq_stage_add(desc, stage, row, col)


@triton.jit
def own_rows_zero(ACC, stride_acc, q_start, lq, col, CID: tl.constexpr, COLS: tl.constexpr):
    """Consumer warpgroup CID: zero the fp32 accumulator's columns ``[col, col + COLS)`` of the
    rows ``[q_start, q_start + lq)`` with plain stores, then order them before its later TMA
    reduce-adds (``fence.proxy.async.global`` by every thread, then the warpgroup meets at named
    barrier DQ_ROWS + CID, so the elected thread issues its adds after every thread's zeros)."""
    col = tl.multiple_of(col, COLS)
    for m in range(0, lq, OWN_ROWS):
        zero = opaque_zero(m)  # (the offsets made here, not hoisted and held across the kernel)
        offs = m + tl.arange(0, OWN_ROWS) + zero
        at = ACC + ((q_start + offs).to(tl.int64)[:, None] * stride_acc + col + tl.arange(0, COLS)[None, :])
        tl.store(at, tl.zeros([OWN_ROWS, COLS], tl.float32), mask=(offs < lq)[:, None])
    tl.inline_asm_elementwise("fence.proxy.async.global;\n\tmov.b32 $0, 0;", "=r,r", [lq], dtype=tl.int32, is_pure=False, pack=1)
    tlx.named_barrier_wait(DQ_ROWS + CID, 128)


@triton.jit
def own_rows_cast(ACC, stride_acc, DQ, stride_dqt, q_start, lq, col, scale, CID: tl.constexpr,
                  COLS: tl.constexpr, DTYPE: tl.constexpr):
    """Consumer warpgroup CID, after its last reduce-add into the rows it owns: dQ's columns
    ``[col, col + COLS)`` of rows ``[q_start, q_start + lq)`` (dQ ``[Tq, Hq, D]`` seen as rows of
    ``Hq * D``, ``stride_dqt`` apart, as the accumulator's) = ``scale`` x the accumulator's, in
    DTYPE. First every add is complete:
    ``cp.async.bulk.wait_group 0`` (only the elected thread that issued them waits for
    anything; the ring's waits only wait until a store has read its stage), the async proxy's
    writes ordered before the generic proxy's reads (``fence.proxy.async.global``), the
    warpgroup met at named barrier DQ_ROWS + CID; the reads go to L2 (``.cg``: no line this SM
    cached before the adds)."""
    dq_adds_wait(lq, CID)
    col = tl.multiple_of(col, COLS)
    for m in range(0, lq, OWN_ROWS):
        zero = opaque_zero(m)
        offs = m + tl.arange(0, OWN_ROWS) + zero
        rows = (q_start + offs).to(tl.int64)[:, None]
        cols = tl.arange(0, COLS)[None, :]
        keep = (offs < lq)[:, None]
        x = tl.load(ACC + (rows * stride_acc + col + cols), mask=keep, other=0.0, cache_modifier=".cg")
        tl.store(DQ + (rows * stride_dqt + col + cols), output(x * scale, DTYPE), mask=keep)


@triton.jit
def dq_adds_wait(x, CID: tl.constexpr):
    """Consumer warpgroup CID: every dQ reduce-add it issued is complete in L2
    (``cp.async.bulk.wait_group 0``: the elected thread that issued them waits; then
    ``fence.proxy.async.global``, the async proxy's writes before the generic proxy's reads)
    before any of its threads goes on (named barrier DQ_ROWS + CID); ``x``: any int32 scalar."""
    tl.inline_asm_elementwise(
        "cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;\n\tmov.b32 $0, 0;", "=r,r", [x], dtype=tl.int32,
        is_pure=False, pack=1,
    )
    tlx.named_barrier_wait(DQ_ROWS + CID, 128)


@triton.jit
def alloc_walk_ring(FIELDS: tl.constexpr, NUM: tl.constexpr = ID_RING, READERS: tl.constexpr = 2):
    """The record ring of a kernel's walk (:func:`walk_first`): NUM slots (ID_RING unless a
    kernel's consumers hold their record longer) of FIELDS one-int buffers each and their full /
    empty barriers (one producer arrival fills a slot, one arrival of each of the READERS
    consumer warpgroups empties it): ``(fields, fulls, empties)``."""
    fields = tlx.local_alloc((1,), tl.int32, NUM * FIELDS)
    fulls = tlx.alloc_barriers(num_barriers=NUM, arrive_count=1)
    empties = tlx.alloc_barriers(num_barriers=NUM, arrive_count=READERS)
    return fields, fulls, empties


@triton.jit
def turn_wait(CID: tl.constexpr):
    """Wait for consumer warpgroup CID's turn to issue (named barrier TURN_0 + CID)."""
    tlx.named_barrier_wait(TURN_0 + CID, 256)


@triton.jit
def turn_pass(CID: tl.constexpr):
    """Hand the turn to issue to the other consumer warpgroup (named barrier TURN_1 - CID)."""
    tlx.named_barrier_arrive(TURN_1 - CID, 256)


@triton.jit
def consumers_sync(x):
    """Both consumer warpgroups (256 threads) meet at named barrier CONSUMERS; ``x``: any scalar
    (the instruction needs an operand). The unaligned ``barrier.sync``: each warpgroup runs its
    own copy of the consumer code (``replicate=2``), so the two halves of one barrier generation
    execute different instructions, which the aligned ``bar.sync`` of ``tlx.named_barrier_wait``
    does not allow (compute-sanitizer's synccheck reports it as divergence)."""
    tl.inline_asm_elementwise("barrier.sync 11, 256;\n\tmov.b32 $0, 0;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def walk_first(pid, COUNTER, ring, PRODUCER: tl.constexpr, DYNAMIC: tl.constexpr, PUBLISH: tl.constexpr = True):
    """The first table index ``i`` of this program's walk over a Plan pass and its round ``r``.

    Static (``DYNAMIC`` off): every role computes the indices itself (``sched_first`` /
    ``sched_next``: program ``pid``'s slot of each round, mirrored on odd rounds of a zigzag
    deal), so producer and consumers walk the same tiles without talking. Dynamic: only the
    producer takes indices from the launch's atomic counter, one tile ahead of the one it loads
    for, and publishes each in the tile-index ring ``ring`` (``(ids, fulls, empties)``:
    :func:`tile_publish`); the consumers take them from there in the same
    order. The walk ends at the first index past the pass's tile count. ``PUBLISH`` off: the
    producer walks alone (the forward's ``RING_TILES`` hands the consumers decoded tiles
    instead of indices)."""
    if DYNAMIC:
        if PRODUCER:
            i, r = sched_first(pid, COUNTER, True)
            if PUBLISH:
                tile_publish(ring[0], ring[1], ring[2], r, i, ID_RING)
        else:
            r = pid * 0
            i = tile_take(ring[0], ring[1], ring[2], r, ID_RING)
    else:
        i, r = sched_first(pid, COUNTER, False)
    return i, r


@triton.jit
def walk_next(i, r, pid, nprog, COUNTER, ring, PRODUCER: tl.constexpr, DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr,
              PUBLISH: tl.constexpr = True):
    """The index after ``i`` (round ``r``) of this program's walk, and its round: see
    :func:`walk_first`. The producer calls it before it loads for tile ``i`` (so a dynamic
    claim's latency hides behind that tile), the consumers after they finish it."""
    if DYNAMIC:
        if PRODUCER:
            i, r = sched_next(i, r, pid, nprog, COUNTER, True, ZIGZAG)
            if PUBLISH:
                tile_publish(ring[0], ring[1], ring[2], r, i, ID_RING)
        else:
            r = r + 1
            i = tile_take(ring[0], ring[1], ring[2], r, ID_RING)
    else:
        i, r = sched_next(i, r, pid, nprog, COUNTER, False, ZIGZAG)
    return i, r


@triton.jit
def walk_start(pid, COUNTER, ring, count, DYNAMIC: tl.constexpr, RECORDS: tl.constexpr):
    """The consumers' start of a walk: ``(i, r, more)``, ``more`` whether the loop runs. With
    ``RECORDS`` the producer walks alone and hands the consumers decoded tiles through a record
    ring: ``i`` counts the records taken (the loop ends at the record that marks the walk's
    end: the consumer sets ``more`` when it reads it); else :func:`walk_first`'s table index and
    round."""
    if RECORDS:
        return pid * 0, pid * 0, count >= 0
    else:
        i, r = walk_first(pid, COUNTER, ring, False, DYNAMIC)
        return i, r, i < count


@triton.jit
def walk_on(i, r, more, pid, nprog, COUNTER, ring, count, DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr,
            RECORDS: tl.constexpr):
    """The consumers' step to the next tile of a walk begun by :func:`walk_start`: ``(i, r,
    more)`` (with ``RECORDS`` the next record, ``more`` as the consumer set it; else
    :func:`walk_next`)."""
    if RECORDS:
        return i + 1, r, more
    else:
        i, r = walk_next(i, r, pid, nprog, COUNTER, ring, False, DYNAMIC, ZIGZAG)
        return i, r, i < count
