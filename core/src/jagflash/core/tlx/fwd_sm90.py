"""The TLX forward for Hopper (sm_90a) over jagged batches: the kernel and its launch.

The dense, jagged and broadcast-Q variants all launch it (dense is jagged with equal lengths;
broadcast-Q is jagged with one shared Q block, ``Q_SHARED``). One persistent program per SM walks
the forward section of a :class:`jagflash.core.plan.model.Plan` (``jagflash.core.tlx.pipeline.
walk_first``) and splits the work over three warp roles:

- the producer (the default warpgroup, 24 registers) loads Q once per tile and K/V through a
  ring of ``NUM_KV`` shared-memory slots with TMA, each slot guarded by a full/empty mbarrier
  pair; ``Q_BUFS`` tiles of Q are in flight;
- two consumer warpgroups (``replicate=2``, 240 registers each) take 64 rows each and run the
  main loop of ``jagflash.core.tlx.fwd_mainloop``; a warpgroup whose 64 rows all lie past the
  sequence's end issues no matmul there;
- with ``SOLO`` (the policy's on batches of short K/V sequences: ``jagflash.core.tuning.default_solo``)
  one consumer warpgroup takes both halves of each tile in turn, in steps of half a kv-block, and
  two programs share each SM (``_fwd_kernel``'s docstring);
- the epilogue (in the consumers, ``store_half``) normalises, and writes O and the LSE with masked stores that
  never cross the sequence boundary; with ``STAGE_O`` O goes through the warpgroup's own Q slot
  (free once its last QK^T completes) instead of a layout conversion's 16 KB of scratch, the
  room a third K/V slot needs at D 128 (``jagflash.core.tuning.default_fwd_depths``).

Every q-tile visits the kv-blocks of ``jagflash.core.mask.kv_tile_range`` through the mask's
block iterator (``block_walk`` / ``block_at``; with ``SPARSE`` the listed blocks of the tile's
row of a block mask's lists, ``lists``); producer and consumers walk the same positions. With ``RING_TILES`` the producer alone walks the table and
hands each decoded tile to the consumers through a record ring (with ``SPARSE`` also the tile's
sequence and its four walk positions, so that the consumers run none of the list's dependent
loads), one tile ahead: it decodes and publishes the next tile right after it has loaded this
tile's Q and first kv-block, so that the decode does not wait behind this tile's K/V slots; a
tile that visits no kv-block (an empty list row, a window that misses the keys) loads no Q and
its rows get O 0 and LSE -inf (from the consumers, or with ``ZERO_EMPTY`` from the producer,
which then does not hand them the tile). With ``HOLD_RECORD`` (the policy's with the ring) the
consumers keep each tile's record until the tile's end and read the fields the epilogue needs
again from it, rather than carrying them across the main loop in registers it needs (they
spilled); the record ring is then three deep. Otherwise, on a dynamic plan, the producer hands the
consumers the table index. TMA reads past a sequence's end are harmless (``jagflash.core.tlx.descriptors``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jagflash.core.block_tiles import FINE_BLOCK, kernel_mask
from jagflash.core.mask import band_bounds, block_walk, kv_tile_range, tile_codes, tile_list
from jagflash.core.ops import alloc
from jagflash.core.plan.build import make_plan
from jagflash.core.plan.model import PASSES
from jagflash.core.seqlen import fwd_tile, q_row
from jagflash.core.softmax import LOG2E
from jagflash.core.tile_scheduler import deal_flags, tile_counter
from jagflash.core.tlx.descriptors import num_workers, rows_descriptor
from jagflash.core.tlx.fwd_mainloop import attend, pass_kv_blocks, store_half
from jagflash.core.tlx.fwd_tiles import (
    SOLO_SPARSE_FIELDS,
    SPARSE_TILE_FIELDS,
    TILE_FIELDS,
    half_blocks,
    load_kv_blocks,
    publish_walk,
    tile_record,
)
from jagflash.core.tlx.pipeline import (
    ID_RING,
    TURN_0,
    alloc_walk_ring,
    record_read,
    ring_release,
    ring_slot,
    tma_load,
    walk_first,
    walk_next,
    walk_on,
    walk_start,
)
from jagflash.core.tuning import (
    SOLO_PER_SM,
    TLX_BLOCK_SIZES,
    FwdConfig,
    config_reasons,
    default_schedules,
    fwd_config,
    tlx_sm90_blocks,
)


@triton.jit
def _fwd_kernel(
    desc_q, desc_k, desc_v, desc_o, O, LSE, q_offsets, kv_offsets, TILES, COUNT, COUNTER,
    stride_ot, stride_oh, stride_lh, stride_ls, scale, left, right, heads, lists,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    Q_SHARED: tl.constexpr, FOLD_SCALE: tl.constexpr, HEAD_MAJOR: tl.constexpr, DYNAMIC: tl.constexpr,
    ZIGZAG: tl.constexpr, RING_TILES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_KV: tl.constexpr, Q_BUFS: tl.constexpr, SPARSE: tl.constexpr, STAGE_O: tl.constexpr, TMA_O: tl.constexpr,
    ZERO_EMPTY: tl.constexpr, HOLD_RECORD: tl.constexpr, SOLO: tl.constexpr = False, FINE: tl.constexpr = False,
):
    """O and LSE of the q-tiles of a Plan's forward pass; the constexprs are a
    :class:`jagflash.core.tuning.FwdConfig`'s. ``desc_o``: a TMA descriptor over O's rows in
    blocks of a consumer's half tile (``TMA_O``'s stores). ``lists``: with ``SPARSE``, the forward lists
    of ``jagflash.core.block_mask.BlockMask.kernel_lists`` (blocks of BLOCK_M x BLOCK_N), else
    None.

    ``SOLO`` (with the tile ring and ``HOLD_RECORD``): one consumer warpgroup (232 registers)
    takes both halves of each tile in turn, each half over its own kv range in steps of BLOCK_N / 2
    keys (a listed block two steps), through K/V slots of BLOCK_N / 2 rows; no turns. Its shared
    memory (~99 KB at D 128 with one Q tile and two slots) and registers (launched with 128 a
    thread) leave room for a second program on the SM, whose tile boundaries then fall between
    this one's block steps."""
    NCONS: tl.constexpr = 1 if SOLO else 2  # consumer warpgroups
    SLOT_N: tl.constexpr = BLOCK_N // 2 if SOLO else BLOCK_N  # keys a K/V slot holds
    SUB: tl.constexpr = BLOCK_N // SLOT_N  # steps a listed block takes
    STEP: tl.constexpr = 1 if SPARSE else SLOT_N
    HALF: tl.constexpr = BLOCK_M // 2
    CONS_REGS: tl.constexpr = 232 if SOLO else 240
    dtype: tl.constexpr = tlx.dtype_of(desc_q)
    ELEM: tl.constexpr = tlx.size_of(dtype)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)

    # Q, a half per consumer, Q_BUFS tiles deep (2: the next tile's Q loads during this one)
    q_tiles = tlx.local_alloc((HALF, HEAD_DIM), dtype, 2 * Q_BUFS)
    k_tiles = tlx.local_alloc((SLOT_N, HEAD_DIM), dtype, NUM_KV)
    v_tiles = tlx.local_alloc((SLOT_N, HEAD_DIM), dtype, NUM_KV)
    q_fulls = tlx.alloc_barriers(num_barriers=2 * Q_BUFS, arrive_count=1)
    q_empties = tlx.alloc_barriers(num_barriers=2 * Q_BUFS, arrive_count=1)
    k_fulls = tlx.alloc_barriers(num_barriers=NUM_KV, arrive_count=1)
    k_empties = tlx.alloc_barriers(num_barriers=NUM_KV, arrive_count=NCONS)
    v_fulls = tlx.alloc_barriers(num_barriers=NUM_KV, arrive_count=1)
    v_empties = tlx.alloc_barriers(num_barriers=NUM_KV, arrive_count=NCONS)
    # The tile ring: with RING_TILES the producer walks the table alone and passes each decoded
    # tile (TILE_FIELDS ints, SPARSE_TILE_FIELDS with a block list) to the consumers; otherwise,
    # on a dynamic plan, the table index.
    # With HOLD_RECORD the consumers keep a tile's record until its end, so the producer, which
    # publishes the next tile while loading this one, needs a third slot.
    RECS: tl.constexpr = 3 if HOLD_RECORD else ID_RING
    REC_FIELDS: tl.constexpr = (SOLO_SPARSE_FIELDS if SOLO else SPARSE_TILE_FIELDS) if SPARSE else TILE_FIELDS
    if RING_TILES:
        ring = alloc_walk_ring(REC_FIELDS, RECS, NCONS)
    else:
        ring = alloc_walk_ring(1)

    with tlx.async_tasks():
        with tlx.async_task("default", registers=24):  # producer: TMA loads
            count = tl.load(COUNT).to(tl.int32)
            kv = (k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties)
            kv_cnt = 0
            tile_cnt = 0
            if SOLO:
                # The ring's order (below), each half its own steps: the first half's Q and first
                # step, the next tile published, the first half's other steps, then the second
                # half's Q and steps. Both halves' Q load for a tile with any step (a half past
                # the sequence's end reads rows past it, harmlessly), so one count keeps the
                # Q slots' phases.
                i, r = walk_first(pid, COUNTER, ring, True, DYNAMIC, False)
                i, r = publish_walk(ring, 0, i, r, pid, nprog, COUNTER, count, TILES, q_offsets, kv_offsets, heads, lists, left, right, O, LSE, stride_ot, stride_oh, stride_lh, stride_ls,
                                    HEAD_MAJOR, GROUP, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, ZERO_EMPTY, HEAD_DIM, dtype, DYNAMIC, ZIGZAG, RECS, SOLO)
                pub_cnt = 1
                while i < count:
                    state, h, m0, q_start, lq, k_start, lk, b, _ = tile_record(ring, pub_cnt - 1, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, False, RECS, False, SOLO)
                    b0 = half_blocks(ring, pub_cnt - 1, 0, m0, lq, lk, left, right, HALF, SLOT_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, RECS)
                    b1 = half_blocks(ring, pub_cnt - 1, 1, m0, lq, lk, left, right, HALF, SLOT_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, RECS)
                    loads = (state > 0) & ((b0[3] > b0[0]) | (b1[3] > b1[0]))
                    if loads:
                        qb, q_phase = ring_slot(tile_cnt, Q_BUFS)
                        tma_load(desc_q, q_tiles[2 * qb], q_fulls[2 * qb], q_empties[2 * qb], q_phase, q_row(q_start, m0, Q_SHARED), h * HEAD_DIM, ELEM * HALF * HEAD_DIM)
                        listed = tile_list(lists, b, h, m0 // BLOCK_M, SPARSE)
                        col = (h // GROUP) * HEAD_DIM
                        kv_cnt = load_kv_blocks(desc_k, desc_v, kv, kv_cnt, listed, b0[0], tl.minimum(b0[0] + STEP, b0[3]), k_start, col, SLOT_N, HEAD_DIM, ELEM, NUM_KV, SPARSE, SUB)
                    i_next, r = walk_next(i, r, pid, nprog, COUNTER, ring, True, DYNAMIC, ZIGZAG, False)
                    i_next, r = publish_walk(ring, pub_cnt, i_next, r, pid, nprog, COUNTER, count, TILES, q_offsets, kv_offsets, heads, lists, left, right, O, LSE, stride_ot, stride_oh, stride_lh, stride_ls,
                                             HEAD_MAJOR, GROUP, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, ZERO_EMPTY, HEAD_DIM, dtype, DYNAMIC, ZIGZAG, RECS, SOLO)
                    pub_cnt += 1
                    if loads:
                        state, h, m0, q_start, lq, k_start, lk, b, _ = tile_record(ring, pub_cnt - 2, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, False, RECS, False, SOLO)
                        listed = tile_list(lists, b, h, m0 // BLOCK_M, SPARSE)
                        col = (h // GROUP) * HEAD_DIM
                        b0 = half_blocks(ring, pub_cnt - 2, 0, m0, lq, lk, left, right, HALF, SLOT_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, RECS)
                        kv_cnt = load_kv_blocks(desc_k, desc_v, kv, kv_cnt, listed, tl.minimum(b0[0] + STEP, b0[3]), b0[3], k_start, col, SLOT_N, HEAD_DIM, ELEM, NUM_KV, SPARSE, SUB)
                        qb, q_phase = ring_slot(tile_cnt, Q_BUFS)
                        tma_load(desc_q, q_tiles[2 * qb + 1], q_fulls[2 * qb + 1], q_empties[2 * qb + 1], q_phase, q_row(q_start, m0, Q_SHARED) + HALF, h * HEAD_DIM, ELEM * HALF * HEAD_DIM)
                        b1 = half_blocks(ring, pub_cnt - 2, 1, m0, lq, lk, left, right, HALF, SLOT_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, RECS)
                        kv_cnt = load_kv_blocks(desc_k, desc_v, kv, kv_cnt, listed, b1[0], b1[3], k_start, col, SLOT_N, HEAD_DIM, ELEM, NUM_KV, SPARSE, SUB)
                        tile_cnt += 1
                    i = i_next
            elif RING_TILES:
                # One tile ahead: tile i was decoded and published in the round before; this round
                # loads its Q and first block, then claims, decodes and publishes the next tile
                # (the claim's and the decode's latencies overlap the consumers' work on tile
                # i - 1 and i, rather than delaying tile i's loads or waiting behind its K/V
                # slots), then loads tile i's other blocks.
                i, r = walk_first(pid, COUNTER, ring, True, DYNAMIC, False)
                i, r = publish_walk(ring, 0, i, r, pid, nprog, COUNTER, count, TILES, q_offsets, kv_offsets, heads, lists, left, right, O, LSE, stride_ot, stride_oh, stride_lh, stride_ls,
                                    HEAD_MAJOR, GROUP, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, ZERO_EMPTY, HEAD_DIM, dtype, DYNAMIC, ZIGZAG, RECS)
                pub_cnt = 1  # records published
                while i < count:
                    state, h, m0, q_start, lq, k_start, lk, b, blocks = tile_record(ring, pub_cnt - 1, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, False, RECS)
                    loads = (state > 0) & (blocks[3] > blocks[0])  # a tile that visits no block loads no Q
                    if loads:
                        qb, q_phase = ring_slot(tile_cnt, Q_BUFS)
                        for c in tl.static_range(2):
                            tma_load(desc_q, q_tiles[2 * qb + c], q_fulls[2 * qb + c], q_empties[2 * qb + c], q_phase, q_row(q_start, m0, Q_SHARED) + c * HALF, h * HEAD_DIM, ELEM * HALF * HEAD_DIM)
                        listed = tile_list(lists, b, h, m0 // BLOCK_M, SPARSE)  # (its indices: the count is not read again)
                        kv_cnt = load_kv_blocks(desc_k, desc_v, kv, kv_cnt, listed, blocks[0], blocks[0] + STEP, k_start, (h // GROUP) * HEAD_DIM, BLOCK_N, HEAD_DIM, ELEM, NUM_KV, SPARSE)
                    i_next, r = walk_next(i, r, pid, nprog, COUNTER, ring, True, DYNAMIC, ZIGZAG, False)
                    i_next, r = publish_walk(ring, pub_cnt, i_next, r, pid, nprog, COUNTER, count, TILES, q_offsets, kv_offsets, heads, lists, left, right, O, LSE, stride_ot, stride_oh, stride_lh, stride_ls,
                                             HEAD_MAJOR, GROUP, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, ZERO_EMPTY, HEAD_DIM, dtype, DYNAMIC, ZIGZAG, RECS)
                    pub_cnt += 1
                    if loads:
                        # tile i's fields again from its record (still in its slot), not carried
                        # across the decode in the producer's 24 registers
                        state, h, m0, q_start, lq, k_start, lk, b, blocks = tile_record(ring, pub_cnt - 2, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, False, RECS)
                        listed = tile_list(lists, b, h, m0 // BLOCK_M, SPARSE)
                        kv_cnt = load_kv_blocks(desc_k, desc_v, kv, kv_cnt, listed, blocks[0] + STEP, blocks[3], k_start, (h // GROUP) * HEAD_DIM, BLOCK_N, HEAD_DIM, ELEM, NUM_KV, SPARSE)
                        tile_cnt += 1
                    i = i_next
            else:
                i, r = walk_first(pid, COUNTER, ring, True, DYNAMIC, True)
                while i < count:
                    i_next, r = walk_next(i, r, pid, nprog, COUNTER, ring, True, DYNAMIC, ZIGZAG, True)
                    live, h, m0, q_start, lq, k_start, lk, b = fwd_tile(i, TILES, count, q_offsets, kv_offsets, heads, HEAD_MAJOR, GROUP)
                    if live:
                        lo, full_lo, full_hi, hi = kv_tile_range(m0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
                        listed = tile_list(lists, b, h, m0 // BLOCK_M, SPARSE)
                        p0, _, _, p3 = block_walk(lo, full_lo, full_hi, hi, listed, BLOCK_N, SPARSE, 1, True)
                        qb, q_phase = ring_slot(tile_cnt, Q_BUFS)
                        for c in tl.static_range(2):
                            tma_load(desc_q, q_tiles[2 * qb + c], q_fulls[2 * qb + c], q_empties[2 * qb + c], q_phase, q_row(q_start, m0, Q_SHARED) + c * HALF, h * HEAD_DIM, ELEM * HALF * HEAD_DIM)
                        kv_cnt = load_kv_blocks(desc_k, desc_v, kv, kv_cnt, listed, p0, p3, k_start, (h // GROUP) * HEAD_DIM, BLOCK_N, HEAD_DIM, ELEM, NUM_KV, SPARSE)
                        tile_cnt += 1
                    i = i_next

        with tlx.async_task(num_warps=4, registers=CONS_REGS, replicate=NCONS):  # consumers
            cid: tl.constexpr = tlx.async_task_replica_id()
            if cid == 1:
                tlx.named_barrier_arrive(TURN_0, 256)  # let warpgroup 0 issue first
            qk_scale2 = scale * LOG2E
            count = tl.load(COUNT).to(tl.int32)
            kv = (k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties)
            kv_cnt = 0
            tile_cnt = 0
            i, r, more = walk_start(pid, COUNTER, ring, count, DYNAMIC, RING_TILES)  # (RING_TILES: i counts records)
            while more:
                if RING_TILES:
                    # taken at the top of the round, so the record is not carried round the loop
                    # (12 more live registers beside the main loop's: spills at D 128)
                    state, h, m0, q_start, lq, k_start, lk, b, sent = tile_record(ring, i, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, True, RECS, HOLD_RECORD, SOLO)
                    more = state >= 0
                    live = state > 0
                else:
                    live, h, m0, q_start, lq, k_start, lk, b = fwd_tile(i, TILES, count, q_offsets, kv_offsets, heads, HEAD_MAJOR, GROUP)
                if SOLO:
                    if live:
                        b0 = half_blocks(ring, i, 0, m0, lq, lk, left, right, HALF, SLOT_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, RECS)
                        b1 = half_blocks(ring, i, 1, m0, lq, lk, left, right, HALF, SLOT_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, RECS)
                        busy = (b0[3] > b0[0]) | (b1[3] > b1[0])  # else the producer loaded no Q
                        for c in range(2):  # (one copy of the half's code, not two)
                            # the tile's fields from its held record (HOLD_RECORD), each half and
                            # again after the main loop, rather than carried across it
                            state, h, m0, q_start, lq, k_start, lk, b, _ = tile_record(ring, i, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, False, RECS, False, SOLO)
                            qb, q_phase = ring_slot(tile_cnt, Q_BUFS)
                            if busy:
                                tlx.barrier_wait(q_fulls[2 * qb + c], q_phase)
                            if m0 + c * HALF < lq:
                                blocks = half_blocks(ring, i, c, m0, lq, lk, left, right, HALF, SLOT_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, RECS)
                                rows = m0 + c * HALF + tl.arange(0, HALF)
                                bounds = band_bounds(rows, lq, lk, left, right, BOUNDED_LEFT, BOUNDED_RIGHT)
                                acc, m_i, l_i, kv_cnt = attend(kv_cnt, q_tiles[2 * qb + c], kv, bounds, tile_list(lists, b, h, m0 // BLOCK_M, SPARSE), blocks, qk_scale2, cid, dtype, HALF,
                                                               HEAD_DIM, SLOT_N, NUM_KV, BOUNDED_LEFT, FOLD_SCALE, SPARSE, SUB, False,
                                                               (tile_codes(lists, b, h, m0 // BLOCK_M, FINE), m0 + c * HALF), FINE)
                                state, h, m0, q_start, lq, k_start, lk, b, _ = tile_record(ring, i, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, False, RECS, False, SOLO)
                                qb, q_phase = ring_slot(tile_cnt, Q_BUFS)
                                store_half(acc, m_i, l_i, O, LSE, desc_o, q_tiles[2 * qb + c], q_empties[2 * qb + c], busy, m0 + c * HALF, lq, q_start, h,
                                           stride_ot, stride_oh, stride_lh, stride_ls, HALF, HEAD_DIM, dtype, STAGE_O, TMA_O)
                            elif busy:  # (past the sequence's end: its Q slot handed back as it landed)
                                tlx.barrier_arrive(q_empties[2 * qb + c], 1)
                        if busy:
                            tile_cnt += 1
                elif live:
                    listed = tile_list(lists, b, h, m0 // BLOCK_M, SPARSE)
                    if RING_TILES:
                        blocks = sent  # the producer's walk of the list row (SPARSE), else the range
                        busy = blocks[3] > blocks[0]  # else the producer loaded no Q (O 0, LSE -inf)
                    else:
                        lo, full_lo, full_hi, hi = kv_tile_range(m0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
                        blocks = block_walk(lo, full_lo, full_hi, hi, listed, BLOCK_N, SPARSE, 1, True)
                        busy = True  # the per-consumer walk: Q always loads (its kernels as they were measured)
                    rows = m0 + cid * HALF + tl.arange(0, HALF)
                    bounds = band_bounds(rows, lq, lk, left, right, BOUNDED_LEFT, BOUNDED_RIGHT)
                    qb, q_phase = ring_slot(tile_cnt, Q_BUFS)
                    if busy:
                        tlx.barrier_wait(q_fulls[2 * qb + cid], q_phase)
                    q_buf = q_tiles[2 * qb + cid]
                    if m0 + cid * HALF >= lq:  # an idle half (only the second can be)
                        kv_cnt = pass_kv_blocks(kv_cnt, blocks[0], blocks[3], kv, cid, STEP, NUM_KV)
                        if busy:
                            tlx.barrier_arrive(q_empties[2 * qb + cid], 1)
                    else:
                        fine = (tile_codes(lists, b, h, m0 // BLOCK_M, FINE), m0 + cid * HALF)  # (FINE: a tiled 64 x 64 mask's bits)
                        acc, m_i, l_i, kv_cnt = attend(kv_cnt, q_buf, kv, bounds, listed, blocks, qk_scale2, cid, dtype, HALF, HEAD_DIM, BLOCK_N, NUM_KV, BOUNDED_LEFT, FOLD_SCALE, SPARSE,
                                                       1, True, fine, FINE)
                        if HOLD_RECORD:
                            # the tile's fields again from its record, still in its slot: carried
                            # across attend's loop in registers they spilled, and their reloads
                            # (local memory, beside 210 KB of shared memory) missed L1 at each
                            # tile's end (bench/NOTES.md, session 33)
                            state, h, m0, q_start, lq, k_start, lk, b, sent = tile_record(ring, i, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, False, RECS)
                            busy = sent[3] > sent[0]
                            qb, q_phase = ring_slot(tile_cnt, Q_BUFS)
                        store_half(acc, m_i, l_i, O, LSE, desc_o, q_tiles[2 * qb + cid], q_empties[2 * qb + cid], busy, m0 + cid * HALF, lq, q_start, h,
                                   stride_ot, stride_oh, stride_lh, stride_ls, HALF, HEAD_DIM, dtype, STAGE_O, TMA_O)
                    if busy:
                        tile_cnt += 1
                if HOLD_RECORD:
                    more = record_read(ring[0], i, REC_FIELDS, RECS, 0, 1)[0] >= 0  # (its state)
                    ring_release(ring[2], i % RECS)
                i, r, more = walk_on(i, r, more, pid, nprog, COUNTER, ring, count, DYNAMIC, ZIGZAG, RING_TILES)


def plan_and_config(q, k, q_offsets, kv_offsets, max_seqlen_q, *, left, right, scale, plan=None, q_shared=False,
                    blocks=None, block_sizes=None, total_q=None):
    """The plan a :func:`forward` call runs (``plan``, or one built with the default schedule
    over ``block_sizes``' tiles, the policy's when ``None``) and the :class:`FwdConfig` the
    policy picks for the call on that plan (``fwd_config``): ``(plan, config)``. Tests and
    probes that force one of the config's choices start from this one. ``total_q``: the output
    rows (``forward``'s ``Tq``), derived from ``q`` when not given."""
    tq = total_q if total_q is not None else ((q_offsets.numel() - 1) * q.shape[0] if q_shared else q.shape[0])
    hq, dim, hkv = q.shape[1], q.shape[2], k.shape[1]
    blocks = kernel_mask(blocks)  # (a 64 x 64 mask's tiles: the plan costs them)
    block_m, block_n = block_sizes or tlx_sm90_blocks(dim)["fwd"]
    if plan is None:
        schedule, _ = default_schedules("tlx-sm90", dim, window=(left, right))
        plan = make_plan(
            q_offsets, kv_offsets, total_q=tq, total_kv=k.shape[0], heads_q=hq, heads_kv=hkv,
            window=(left, right), block_m=block_m, block_n=block_n, max_seqlen_q=max_seqlen_q,
            backward=False, schedule=schedule, block_mask=blocks,
        )
    dynamic, zigzag = deal_flags(plan.info, "fwd")
    config = fwd_config(
        head_dim=dim, group=hq // hkv, left=left, right=right, q_shared=q_shared, scale=scale,
        dynamic=dynamic, zigzag=zigzag, total_kv=plan.info.total_kv, batch=plan.info.batch,
        sparse=blocks is not None, crowded=plan.info.layout("fwd").rows >= SOLO_PER_SM * num_workers(q.device),
        fine=blocks is not None and blocks.kv_codes is not None,
    )
    return plan, config


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seqlen_q: int,
    *,
    left: int,
    right: int,
    scale: float,
    plan=None,
    q_shared: bool = False,
    lse_per_sequence: bool = False,
    config: FwdConfig | None = None,
    blocks=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """O ``[Tq, Hq, D]`` and LSE ``[Hq, Tq]`` fp32 (inputs are made contiguous: TMA needs it).
    ``lse_per_sequence``: LSE ``[B, Hq, L]`` instead, stored so by the kernel, for batches whose
    B sequences all have L = Tq / B queries (dense, broadcast-Q; ``q_offsets`` = ``arange(B + 1)
    * L``, which is the caller's to guarantee).

    ``q_shared`` (broadcast-Q): ``q`` is one block ``[Lq, Hq, D]`` that every sequence reads,
    ``q_offsets`` must then be ``arange(B + 1) * Lq`` and ``Tq = B * Lq`` (the output rows).

    ``plan``: a :class:`jagflash.core.plan.model.Plan` whose forward pass has 128-row q-tiles
    (built here, with the default schedule, when not given): its table sets the tile order,
    dealt zigzag for a grouped or static plan, taken from an atomic counter for a dynamic one.

    ``config``: the launch's compile-time choices; ``None`` (every caller but the tests and the
    probes, which force each one): :func:`jagflash.core.tuning.fwd_config`'s for the call. A
    given config must agree with the call's shapes, mask and plan (checked).

    ``blocks``: a ``jagflash.core.block_mask.BlockMask`` (block size in
    :data:`jagflash.core.tuning.TLX_BLOCK_SIZES`, or 64 x 64, walked as 128 x 128 tiles with
    their blocks' bits: ``jagflash.core.block_tiles``; not with ``q_shared``): each q-tile visits
    only the listed kv-blocks of its band (the plan must tile by the mask's, or the tiles', blocks)."""
    blocks = kernel_mask(blocks)
    if blocks is not None and (q_shared or tuple(blocks.block_size) not in TLX_BLOCK_SIZES):
        raise ValueError(
            f"tlx forward: block masks of {TLX_BLOCK_SIZES} or {FINE_BLOCK} (walked as tiles) blocks without broadcast-Q, got {tuple(blocks.block_size)}"
            f"{' with broadcast-Q' if q_shared else ''}"
        )
    n_seqs = q_offsets.numel() - 1
    tq = n_seqs * q.shape[0] if q_shared else q.shape[0]
    if lse_per_sequence and n_seqs and tq % n_seqs:
        raise ValueError(f"tlx forward: lse_per_sequence needs sequences of one length: {tq} query rows in {n_seqs} sequences")
    q, k, v = (t.contiguous() for t in (q, k, v))
    _, hq, dim = q.shape
    out = alloc((tq, hq, dim), q.dtype, q.device)
    if lse_per_sequence:
        rows = tq // n_seqs if n_seqs else 0
        lse = alloc((n_seqs, hq, rows), torch.float32, q.device)
        lse_strides = (rows, hq)  # q_start = b L: b Hq L + h L + row
    else:
        lse = alloc((hq, tq), torch.float32, q.device)
        lse_strides = (tq, 1)
    plan, want = plan_and_config(
        q, k, q_offsets, kv_offsets, max_seqlen_q, left=left, right=right, scale=scale, plan=plan,
        q_shared=q_shared, blocks=blocks, block_sizes=(config.BLOCK_M, config.BLOCK_N) if config else None, total_q=tq,
    )
    lay = plan.info.layout("fwd")
    config = config or want
    reasons = config_reasons(config, want, (lay.block_m, lay.block_n))
    if reasons:
        raise ValueError("tlx forward: the config does not fit this call: " + "; ".join(reasons))
    if tq == 0 or lay.rows == 0:
        return out, lse
    if k.shape[0] == 0:  # no keys anywhere: every row sees nothing (no descriptor over 0 rows)
        return out.zero_(), lse.fill_(float("-inf"))
    # SOLO: two programs an SM, each launched with 128 registers a thread (its producer gives
    # 104 of its 128 to the consumer warpgroup: 24 + 232), and K/V slots of half a kv-block
    programs = min(num_workers(q.device) * (SOLO_PER_SM if config.SOLO else 1), lay.rows)
    slot_n = config.BLOCK_N // 2 if config.SOLO else config.BLOCK_N
    _fwd_kernel[(programs,)](
        rows_descriptor(q, config.BLOCK_M // 2, dim), rows_descriptor(k, slot_n, dim),
        rows_descriptor(v, slot_n, dim), rows_descriptor(out, config.BLOCK_M // 2, dim), out, lse, q_offsets, kv_offsets,
        plan.section("fwd"), plan.meta[PASSES.index("fwd"):], tile_counter(plan, "fwd"),
        out.stride(0), out.stride(1), *lse_strides, scale, left, right, lay.heads,
        None if blocks is None else blocks.kernel_lists()[0], **config.constexprs(), num_warps=4, num_stages=1,
        **({"maxnreg": 128} if config.SOLO else {}),
    )
    return out, lse

