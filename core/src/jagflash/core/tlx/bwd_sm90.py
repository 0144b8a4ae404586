"""The TLX backward for Hopper (sm_90a) over jagged batches: the dK/dV kernel and its launches,
as the one-pass backward (:func:`backward`: dQ reduce-added from every kv-tile) and as the dK/dV
pass of the two-pass one (:func:`backward_dkdv`, after the portable dQ pass: deterministic).

The dK/dV kernel keeps a 128-row kv-tile's dK and dV in the two consumer warpgroups' registers
(64 rows each) and streams Q / dO of every q-step that sees it, 64 queries a step; both read
log2 LSE and delta packed per sequence by ``jagflash.core.tlx.bwd_preprocess`` (no masks: the
producer loads each step's by TMA with its Q and dO). The kv-blocks' q-ranges are
``jagflash.core.mask.dkdv_q_range``'s, walked through the mask's block iterator (``block_walk``
/ ``block_at``; with ``SPARSE`` the steps of the q-blocks that the kv-tile's row of a block
mask's transposed lists names, two 64-query steps per 128-row q-block); producer and consumers
walk the same positions, so the Q/dO ring's counters stay in step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jagflash.core.block_tiles import FINE_BLOCK, kernel_mask
from jagflash.core.dtypes import ACC, output
from jagflash.core.mask import block_at, block_walk, dkdv_q_range, tile_codes, tile_list
from jagflash.core.ops import alloc_like
from jagflash.core.plan.build import make_plan
from jagflash.core.plan.model import PASSES
from jagflash.core.portable.persistent import jagged_backward_dq, sparse_backward_dq
from jagflash.core.seqlen import plan_row, seq_starts
from jagflash.core.softmax import LOG2E
from jagflash.core.tile_scheduler import deal_flags, tile_counter
from jagflash.core.tlx.bwd_mainloop import dkdv_steps
from jagflash.core.tlx.bwd_preprocess import (
    CELL_INTS,
    backward_vectors,
    dq_cell_counts,
    scaled_cast,
)
from jagflash.core.tlx.bwd_tiles import (
    ALL_STEPS,
    DKDV_TILE_FIELDS,
    OWN_FIRST,
    OWN_LAST,
    dkdv_tile,
    dkdv_tile_range,
    load_kv_tile,
    load_q_step,
    load_q_steps,
    next_dkdv_tile,
    own_walk,
    publish_dkdv_walk,
    tile_own,
    tile_walk,
)
from jagflash.core.tlx.descriptors import num_workers, rows_descriptor, vectors_descriptor
from jagflash.core.tlx.pipeline import (
    ID_RING,
    alloc_walk_ring,
    own_rows_cast,
    own_rows_zero,
    ring_release,
    walk_first,
    walk_next,
    walk_on,
    walk_start,
)
from jagflash.core.tuning import (
    TLX_BLOCK_SIZES,
    TLX_ONE_PASS_HEAD_DIMS,
    BwdConfig,
    bwd_config,
    config_reasons,
    default_schedules,
    dq_cols,
    grouped_backward,
    plan_blocks,
    use_one_pass,
)


@triton.jit
def _dkdv_kernel(
    desc_q, desc_k, desc_v, desc_do, DK, DV, desc_lse2, desc_delta, VEC_TILE, q_offsets, kv_offsets, TILES, COUNT,
    COUNTER, stride_dkt, stride_dkh, stride_dvt, stride_dvh, scale, left, right, desc_dq, heads, lists,
    DQ_ACC, DQ, stride_acc, stride_dqt, desc_adds, desc_dqo, HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    Q_SHARED: tl.constexpr, FUSED_DQ: tl.constexpr, HEAD_MAJOR: tl.constexpr, DYNAMIC: tl.constexpr,
    ZIGZAG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DQ_COLS: tl.constexpr,
    NUM_Q: tl.constexpr, DQ_STAGES: tl.constexpr, PAD: tl.constexpr, SPARSE: tl.constexpr, RING_TILES: tl.constexpr,
    OWN_SPAN: tl.constexpr, ZERO_EMPTY: tl.constexpr, SOLE_DQ: tl.constexpr, FINE: tl.constexpr = False,
):
    """dK and dV of kv-tiles of BLOCK_N rows (one per Plan row of the dK/dV pass), summed over
    the GQA group, and with ``FUSED_DQ`` each tile's share of dQ, reduce-added into an fp32
    accumulator through ``desc_dq`` (without it dQ and delta come from the portable dQ pass,
    which runs first). A producer streams K/V once per tile and Q/dO through a ring of NUM_Q
    slots; two consumer warpgroups take 64 kv rows each and share every Q/dO slot
    (``jagflash.core.tlx.bwd_mainloop``). ``desc_lse2``, ``desc_delta`` (TMA descriptors over
    ``[Hq, vec_rows]``, blocks of ``[1, BLOCK_M]``) and ``VEC_TILE``: the packed per-query vectors
    of ``jagflash.core.tlx.bwd_preprocess`` (``PAD`` rows a sequence), which the producer loads
    with each step's Q and dO. ``lists``: with ``SPARSE``, the transposed lists of
    ``jagflash.core.block_mask.BlockMask.kernel_lists`` (square blocks of BLOCK_N rows: each
    listed q-block is ``SUB`` steps), else None. With ``RING_TILES`` the producer alone walks
    the table and hands the consumers each decoded kv-tile through a record ring
    (``jagflash.core.tlx.bwd_tiles``: with ``SPARSE`` also each head's walk positions), one tile
    ahead; a kv-tile that no step visits loads nothing and gets zeros (with ``ZERO_EMPTY`` written
    by the producer, which then does not hand it on, unless an owner waits for it). With ``OWN_SPAN``
    (``jagflash.core.tuning.own_span``) a program takes all kv-tiles of a sequence of at most
    OWN_SPAN keys (a K/V head's, from the table row of its first) and sums its dQ rows itself:
    ``DQ_ACC`` (the accumulator behind ``desc_dq``, rows ``stride_acc`` apart) zeroed there
    before the first, ``DQ`` (dQ ``[Tq, Hq, D]``, rows ``stride_dqt`` apart) written from it
    after the last (``jagflash.core.tlx.pipeline.own_rows_zero`` / ``own_rows_cast``). With
    ``SOLE_DQ`` a step whose dQ cell no other kv-tile adds into (its count,
    ``jagflash.core.tlx.bwd_preprocess.dq_cell_counts``', loaded by the producer with the step's
    vectors through ``desc_adds``) stores its dQ by TMA through ``desc_dqo`` (dQ as ``[Tq, Hq D]``)
    instead of adding it (``jagflash.core.tlx.pipeline.dq_add_or_store``), but in the sequences a
    program owns. The constexprs are a :class:`jagflash.core.tuning.BwdConfig`'s."""
    HALF: tl.constexpr = BLOCK_N // 2
    STEP: tl.constexpr = 1 if SPARSE else BLOCK_M
    SUB: tl.constexpr = BLOCK_N // BLOCK_M
    dtype: tl.constexpr = tlx.dtype_of(desc_q)
    ELEM: tl.constexpr = tlx.size_of(dtype)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)

    k_tiles = tlx.local_alloc((HALF, HEAD_DIM), dtype, 2)
    v_tiles = tlx.local_alloc((HALF, HEAD_DIM), dtype, 2)
    q_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), dtype, NUM_Q)
    do_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), dtype, NUM_Q)
    lse_tiles = tlx.local_alloc((1, BLOCK_M), tl.float32, NUM_Q)
    delta_tiles = tlx.local_alloc((1, BLOCK_M), tl.float32, NUM_Q)
    if FUSED_DQ:
        # dS^T, one per consumer, double-buffered by step (the dQ product reads both)
        ds_tiles = tlx.local_alloc((HALF, BLOCK_M), dtype, 4)
        dq_stages = tlx.local_alloc((BLOCK_M, DQ_COLS), tl.float32, 2 * DQ_STAGES)  # per consumer
        if SOLE_DQ:
            dq_outs = tlx.local_alloc((BLOCK_M, DQ_COLS), dtype, 2)  # per consumer: a single cell's dQ, for its TMA store
        else:
            dq_outs = dq_stages  # unused
    else:
        ds_tiles = tlx.local_alloc((HALF, BLOCK_M), dtype, 2)  # dS^T, one per consumer
        dq_stages = k_tiles  # unused
        dq_outs = k_tiles  # unused
    kv_fulls = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    kv_empties = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    q_fulls = tlx.alloc_barriers(num_barriers=NUM_Q, arrive_count=1)
    q_empties = tlx.alloc_barriers(num_barriers=NUM_Q, arrive_count=2)
    # The tile ring: with RING_TILES the producer walks the table alone and passes each decoded
    # kv-tile to the consumers (jagflash.core.tlx.bwd_tiles); otherwise, on a dynamic plan, the
    # table index.
    FIELDS: tl.constexpr = DKDV_TILE_FIELDS + (4 * GROUP if SPARSE else 0) + (1 if OWN_SPAN > 0 else 0)
    ring = alloc_walk_ring(FIELDS if RING_TILES else 1)
    if SOLE_DQ:  # (each step's dQ cell count comes with its vectors)
        adds_tiles = tlx.local_alloc((1, CELL_INTS), tl.int32, NUM_Q)
        descs = (desc_q, desc_do, desc_lse2, desc_delta, desc_adds)
        qring = (q_tiles, do_tiles, lse_tiles, delta_tiles, q_fulls, q_empties, adds_tiles)
    else:
        descs = (desc_q, desc_do, desc_lse2, desc_delta)
        qring = (q_tiles, do_tiles, lse_tiles, delta_tiles, q_fulls, q_empties)

    with tlx.async_tasks():
        with tlx.async_task("default", registers=24):  # producer: TMA loads
            count = tl.load(COUNT).to(tl.int32)
            q_cnt = 0
            tile_cnt = 0
            if RING_TILES:
                # Round i: tile i's first NUM_Q steps (into the slots tile i - 1's last steps
                # free), its K/V once tile i - 1 is done, then the next tile claimed, decoded and
                # published (the claim's and the decode's latencies overlap tile i's first
                # steps, not its loads), then tile i's other steps.
                # (With OWN_SPAN an owned sequence's kv-tiles come one after the other from the
                # row of its first: next_dkdv_tile; ``i`` stays the walk's index meanwhile.)
                i, r = walk_first(pid, COUNTER, ring, True, DYNAMIC, False)
                outs = (DK, DV, stride_dkt, stride_dkh, stride_dvt, stride_dvh)  # (ZERO_EMPTY's zeros)
                i, r, ok, b, hk, n0 = own_walk(i, r, pid, nprog, COUNTER, ring, TILES, count, heads, kv_offsets, HEAD_MAJOR, DYNAMIC, ZIGZAG, OWN_SPAN)
                i, r = publish_dkdv_walk(ring, 0, i, r, ok, b, hk, n0, pid, nprog, COUNTER, TILES, count, heads, q_offsets, kv_offsets, VEC_TILE, lists, left, right, outs,
                                         HEAD_MAJOR, DYNAMIC, ZIGZAG, GROUP, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, FUSED_DQ, SPARSE, PAD, OWN_SPAN, ZERO_EMPTY, HEAD_DIM, dtype)
                pub = 1  # records published
                while i < count:
                    state, b, hk, n0, _, _, k_start, _, _ = dkdv_tile(ring, pub - 1, FIELDS, False)
                    own = tile_own(ring, pub - 1, FIELDS, OWN_SPAN)
                    if state > 1:
                        q_cnt = load_q_steps(descs, qring, q_cnt, ring, pub - 1, lists, 0, NUM_Q, left, right, FIELDS, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_Q, ELEM, BOUNDED_LEFT, BOUNDED_RIGHT, FUSED_DQ, Q_SHARED, SPARSE)
                        load_kv_tile(desc_k, desc_v, k_tiles, v_tiles, kv_fulls, kv_empties, tile_cnt, k_start + n0, hk * HEAD_DIM, HALF, HEAD_DIM, ELEM)
                    i, r, ok, b, hk, n0 = next_dkdv_tile(i, r, own, b, hk, n0, pid, nprog, COUNTER, ring, TILES, count, heads, kv_offsets, HEAD_MAJOR, DYNAMIC, ZIGZAG, BLOCK_N, OWN_SPAN)
                    i, r = publish_dkdv_walk(ring, pub, i, r, ok, b, hk, n0, pid, nprog, COUNTER, TILES, count, heads, q_offsets, kv_offsets, VEC_TILE, lists, left, right, outs,
                                             HEAD_MAJOR, DYNAMIC, ZIGZAG, GROUP, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, FUSED_DQ, SPARSE, PAD, OWN_SPAN, ZERO_EMPTY, HEAD_DIM, dtype)
                    pub += 1
                    if state > 1:
                        q_cnt = load_q_steps(descs, qring, q_cnt, ring, pub - 2, lists, NUM_Q, ALL_STEPS, left, right, FIELDS, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_Q, ELEM, BOUNDED_LEFT, BOUNDED_RIGHT, FUSED_DQ, Q_SHARED, SPARSE)
                        tile_cnt += 1
            else:
                i, r = walk_first(pid, COUNTER, ring, True, DYNAMIC)
                while i < count:
                    i_next, r = walk_next(i, r, pid, nprog, COUNTER, ring, True, DYNAMIC, ZIGZAG)
                    ok, b, hk, n0 = plan_row(i, TILES, count, heads, HEAD_MAJOR)
                    q_start, lq, k_start, lk = seq_starts(q_offsets, kv_offsets, b)
                    if ok & (n0 < lk):
                        lo, full_lo, full_hi, hi = dkdv_q_range(n0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
                        load_kv_tile(desc_k, desc_v, k_tiles, v_tiles, kv_fulls, kv_empties, tile_cnt, k_start + n0, hk * HEAD_DIM, HALF, HEAD_DIM, ELEM)
                        vec0 = tl.load(VEC_TILE + b) * PAD
                        for g in range(GROUP):
                            head = hk * GROUP + g
                            listed = tile_list(lists, b, head, n0 // BLOCK_N, SPARSE)
                            p0, _, _, p3 = block_walk(lo, full_lo, full_hi, hi, listed, BLOCK_M, SPARSE, SUB, True)
                            for t in range(p0, p3, STEP):  # the positions the consumers walk (dkdv_steps)
                                m0 = block_at(listed, t, BLOCK_M, SPARSE, SUB)
                                load_q_step(descs, qring, q_cnt, q_start, m0, head, vec0, HEAD_DIM, BLOCK_M, NUM_Q, ELEM, Q_SHARED)
                                q_cnt += 1
                        tile_cnt += 1
                    i = i_next

        with tlx.async_task(num_warps=4, registers=240, replicate=2):  # consumers
            cid: tl.constexpr = tlx.async_task_replica_id()
            qk_scale2 = scale * LOG2E
            count = tl.load(COUNT).to(tl.int32)
            kv = (k_tiles, v_tiles)
            band = (left, right)
            q_cnt = 0
            tile_cnt = 0
            i, r, more = walk_start(pid, COUNTER, ring, count, DYNAMIC, RING_TILES)  # (RING_TILES: i counts records)
            while more:
                own = 0
                if RING_TILES:
                    state, b, hk, n0, q_start, lq, k_start, lk, vec0 = dkdv_tile(ring, i, FIELDS, True)
                    own = tile_own(ring, i, FIELDS, OWN_SPAN)
                    more = state >= 0
                    live = state > 0
                    busy = state > 1  # else no step visits the tile: no K/V loaded, dK = dV = 0
                else:
                    ok, b, hk, n0 = plan_row(i, TILES, count, heads, HEAD_MAJOR)
                    q_start, lq, k_start, lk = seq_starts(q_offsets, kv_offsets, b)
                    live = ok & (n0 < lk)
                    busy = True  # (K/V always loads: the per-consumer walk as it was measured)
                if live:
                    own_col = hk * (GROUP * HEAD_DIM) + cid * DQ_COLS  # (OWN_SPAN: D 128, a column half a head)
                    if OWN_SPAN > 0:  # noqa: SIM102 (a compile-time branch around a run-time one)
                        if (own & OWN_FIRST) != 0:
                            for g in range(GROUP):
                                own_rows_zero(DQ_ACC, stride_acc, q_start, lq, own_col + g * HEAD_DIM, cid, DQ_COLS)
                    kv_rows = n0 + cid * HALF + tl.arange(0, HALF)
                    if busy:
                        tlx.barrier_wait(kv_fulls[cid], tile_cnt & 1)
                    dk = tl.zeros([HALF, HEAD_DIM], ACC)
                    dv = tl.zeros([HALF, HEAD_DIM], ACC)
                    if not RING_TILES:
                        lo, full_lo, full_hi, hi = dkdv_tile_range(n0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, FUSED_DQ)
                    for g in range(GROUP):
                        head = hk * GROUP + g
                        dq_col = head * HEAD_DIM
                        if SOLE_DQ:
                            sole = (desc_dqo, dq_outs, scale)
                        else:
                            sole = 0  # (unused)
                        dq = (desc_dq, ds_tiles, dq_stages, dq_col, sole)
                        listed = tile_list(lists, b, head, n0 // BLOCK_N, SPARSE)
                        if RING_TILES:
                            p0, p1, p2, p3 = tile_walk(ring, i, g, n0, lq, lk, left, right, FIELDS, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, FUSED_DQ, SPARSE)
                        else:
                            p0, p1, p2, p3 = block_walk(lo, full_lo, full_hi, hi, listed, BLOCK_M, SPARSE, SUB, True)
                        seq = (lq, lk, q_start, listed)
                        fine = tile_codes(lists, b, head, n0 // BLOCK_N, FINE)  # (FINE: a tiled 64 x 64 mask's bits)
                        dk, dv, q_cnt = dkdv_steps(dk, dv, kv, qring, kv_rows, q_cnt, p0, p1, seq, band, qk_scale2, dq, cid, dtype, BLOCK_M, NUM_Q, BOUNDED_LEFT, BOUNDED_RIGHT, True, FUSED_DQ, Q_SHARED, HEAD_DIM, HALF, DQ_STAGES, DQ_COLS, SPARSE, SUB, SOLE_DQ, fine, FINE)
                        dk, dv, q_cnt = dkdv_steps(dk, dv, kv, qring, kv_rows, q_cnt, p1, p2, seq, band, qk_scale2, dq, cid, dtype, BLOCK_M, NUM_Q, BOUNDED_LEFT, BOUNDED_RIGHT, False, FUSED_DQ, Q_SHARED, HEAD_DIM, HALF, DQ_STAGES, DQ_COLS, SPARSE, SUB, SOLE_DQ, fine, FINE)
                        dk, dv, q_cnt = dkdv_steps(dk, dv, kv, qring, kv_rows, q_cnt, p2, p3, seq, band, qk_scale2, dq, cid, dtype, BLOCK_M, NUM_Q, BOUNDED_LEFT, BOUNDED_RIGHT, True, FUSED_DQ, Q_SHARED, HEAD_DIM, HALF, DQ_STAGES, DQ_COLS, SPARSE, SUB, SOLE_DQ, fine, FINE)
                    if busy:
                        tlx.barrier_arrive(kv_empties[cid], 1)
                        tile_cnt += 1
                    if RING_TILES:
                        ring_release(ring[2], i % ID_RING)  # every head's positions read
                    valid = kv_rows < lk
                    offs_d = tl.arange(0, HEAD_DIM)
                    out_rows = (k_start + kv_rows).to(tl.int64)
                    tl.store(DK + out_rows[:, None] * stride_dkt + hk * stride_dkh + offs_d[None, :], output(dk * scale, dtype), mask=valid[:, None])
                    tl.store(DV + out_rows[:, None] * stride_dvt + hk * stride_dvh + offs_d[None, :], output(dv, dtype), mask=valid[:, None])
                    if OWN_SPAN > 0:  # noqa: SIM102
                        if (own & OWN_LAST) != 0:
                            for g in range(GROUP):
                                own_rows_cast(DQ_ACC, stride_acc, DQ, stride_dqt, q_start, lq, own_col + g * HEAD_DIM, scale, cid, DQ_COLS, dtype)
                elif RING_TILES:
                    ring_release(ring[2], i % ID_RING)
                i, r, more = walk_on(i, r, more, pid, nprog, COUNTER, ring, count, DYNAMIC, ZIGZAG, RING_TILES)
            if FUSED_DQ:
                tlx.async_descriptor_store_wait(0)  # the stages must outlive their last stores



def _dkdv_plan(plan, q_offsets, kv_offsets, tq, tk, hq, hkv, dim, left, right, deterministic, mask):
    """The plan (made with the TLX kernels' default schedules for this backward if none was
    given; with a block mask ``mask``, tiles of its blocks costed by its lists but the dK/dV
    pass's: ``jagflash.core.tuning.plan_blocks``) and its dK/dV layout."""
    if mask is not None and tuple(mask.block_size) not in TLX_BLOCK_SIZES:
        raise ValueError(f"tlx backward: block masks of {TLX_BLOCK_SIZES} or {FINE_BLOCK} (walked as tiles) blocks, got {tuple(mask.block_size)}")
    if plan is None:
        blocks = plan_blocks("tlx-sm90", dim, None if mask is None else mask.block_size)
        batch = q_offsets.numel() - 1
        grouped = grouped_backward(tk, batch, hkv, blocks["dkdv"][1], num_workers(q_offsets.device))
        schedule, backward_schedule = default_schedules(
            "tlx-sm90", dim, window=(left, right), deterministic=deterministic, grouped=grouped
        )
        plan = make_plan(
            q_offsets, kv_offsets, total_q=tq, total_kv=tk, heads_q=hq, heads_kv=hkv,
            window=(left, right), block_m=blocks["fwd"][0], block_n=blocks["fwd"][1], dkdv_blocks=blocks["dkdv"],
            backward=True, schedule=schedule, backward_schedule=backward_schedule,
            block_mask=mask,
        )
    return plan, plan.info.layout("dkdv")


def dkdv_config(plan, q, k, *, left: int, right: int, q_shared: bool, fused_dq: bool, blocks=None) -> BwdConfig:
    """The policy's :class:`BwdConfig` (``jagflash.core.tuning.bwd_config``) of a dK/dV kernel
    launch on ``plan``'s dK/dV pass for ``q`` ``[T, Hq, D]`` and ``k`` ``[T, Hkv, D]``:
    ``fused_dq`` the one pass, ``blocks`` a block mask or None. Tests and probes that force one
    of its free choices start from it."""
    dynamic, zigzag = deal_flags(plan.info, "dkdv")
    return bwd_config(
        head_dim=q.shape[-1], group=q.shape[1] // k.shape[1], left=left, right=right, q_shared=q_shared,
        fused_dq=fused_dq, dynamic=dynamic, zigzag=zigzag, total_kv=plan.info.total_kv, batch=plan.info.batch,
        sparse=blocks is not None, grouped=plan.info.schedule_of("dkdv") == "dynamic-grouped",
        fine=blocks is not None and blocks.q_codes is not None,
    )


def plan_and_config(q, k, q_offsets, kv_offsets, *, left: int, right: int, deterministic: bool = False,
                    total_q: int | None = None, q_shared: bool = False, blocks=None, plan=None):
    """The plan a :func:`backward` (``deterministic`` False) or :func:`backward_dkdv` call runs
    on (``plan``, or the one it builds) and the config the policy picks for its launch:
    ``(plan, config)``. ``total_q``: the rows of dO (``q``'s by default)."""
    tq = q.shape[0] if total_q is None else total_q
    blocks = kernel_mask(blocks)
    plan, _ = _dkdv_plan(plan, q_offsets, kv_offsets, tq, k.shape[0], q.shape[1], k.shape[1], q.shape[-1], left, right,
                         deterministic, blocks)
    return plan, dkdv_config(plan, q, k, left=left, right=right, q_shared=q_shared, fused_dq=not deterministic, blocks=blocks)


def _checked_config(plan, q, k, left, right, q_shared, fused_dq, config, who, mask) -> BwdConfig:
    """``config`` (a :class:`BwdConfig` the caller forces), or ``None`` for the policy's
    (:func:`dkdv_config`), checked against the call: a ``ValueError`` lists every misfit."""
    lay = plan.info.layout("dkdv")
    want = dkdv_config(plan, q, k, left=left, right=right, q_shared=q_shared, fused_dq=fused_dq, blocks=mask)
    config = config or want
    reasons = config_reasons(config, want, (lay.block_m, lay.block_n))
    if reasons:
        raise ValueError(f"tlx {who}: the config does not fit this call: " + "; ".join(reasons))
    return config


#: A ``[1, CELL_INTS]`` int32 tensor a device: the dK/dV kernel's ``desc_adds`` without ``SOLE_DQ`` (never read).
_NO_ADDS: dict = {}


def _adds_descriptor(counts, device):
    """``desc_adds`` of a launch: over ``bwd_preprocess.dq_cell_counts``' counts (``[steps, W]``,
    a ``[1, CELL_INTS]`` box a step and head), or, without them, over a never-read stand-in."""
    if counts is None:
        counts = _NO_ADDS.get(device)
        if counts is None:
            counts = _NO_ADDS.setdefault(device, torch.zeros((1, CELL_INTS.value), dtype=torch.int32, device=device))
    return vectors_descriptor(counts, CELL_INTS.value)


def _launch(dout, q, k, v, vectors, q_offsets, kv_offsets, dk, dv, plan, dq_acc, dq, left, right, scale, q_shared, config, mask,
            cells=None):
    """One launch of :func:`_dkdv_kernel`; ``vectors``: ``backward_vectors``'s; ``dq_acc`` (fp32
    ``[rows, Hq * D]``) fuses dQ in, ``dq`` (``[rows, Hq, D]``, contiguous) the dQ that owned
    sequences' rows (``config.OWN_SPAN``) and, with ``config.SOLE_DQ``, the cells one kv-tile adds
    into are written to (``cells``: ``bwd_preprocess.dq_cell_counts``'s counts). ``config``: :func:`_checked_config`'s.
    ``mask``: a ``jagflash.core.block_mask.BlockMask`` or None."""
    dim = q.shape[-1]
    lay = plan.info.layout("dkdv")
    if dq_acc is None:
        desc_dq = rows_descriptor(q, config.BLOCK_M, dim)  # unused
    else:  # (the fp32 accumulator [rows, Hq * D] in boxes of BLOCK_M x DQ_COLS)
        desc_dq = rows_descriptor(dq_acc.view(dq_acc.shape[0], -1, dim), config.BLOCK_M, config.DQ_COLS)
    programs = min(num_workers(q.device), lay.rows)
    _dkdv_kernel[(programs,)](
        rows_descriptor(q, config.BLOCK_M, dim), rows_descriptor(k, config.BLOCK_N // 2, dim),
        rows_descriptor(v, config.BLOCK_N // 2, dim), rows_descriptor(dout, config.BLOCK_M, dim),
        dk, dv, *(vectors_descriptor(x, config.BLOCK_M) for x in vectors[:2]), vectors[2], q_offsets, kv_offsets,
        plan.section("dkdv"), plan.meta[PASSES.index("dkdv"):], tile_counter(plan, "dkdv"),
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), scale, left, right, desc_dq, lay.heads,
        None if mask is None else mask.kernel_lists()[1], dk if dq_acc is None else dq_acc, dk if dq is None else dq,
        0 if dq_acc is None else dq_acc.stride(0), 0 if dq is None else dq.stride(0), _adds_descriptor(cells, q.device),
        rows_descriptor(q if cells is None else dq, config.BLOCK_M, config.DQ_COLS),  # (desc_dqo: single cells' dQ halves)
        **config.constexprs(), num_warps=4,
        num_stages=1,
    )


def backward_dkdv(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    left: int,
    right: int,
    scale: float,
    plan=None,
    q_shared: bool = False,
    config: BwdConfig | None = None,
    blocks=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dK ``[Tk, Hkv, D]`` and dV of jagged attention, given LSE and delta = rowsum(dO * O)
    (both ``[Hq, Tq]`` fp32, or both ``[B, Hq, L]``: ``bwd_preprocess.backward_vectors``; the
    portable dQ pass computes delta): the second pass of the deterministic backward (no atomics,
    no reduce-adds). ``q_shared``: broadcast-Q, as for the forward (``dout`` then has the
    ``B * Lq`` rows). ``config``: as for the forward (``FUSED_DQ`` off). ``blocks``: a
    ``jagflash.core.block_mask.BlockMask`` (as for the forward): each kv-tile visits the q-steps
    of the q-blocks its transposed list names (a 64 x 64 mask as 128 x 128 tiles with their blocks'
    bits: ``jagflash.core.block_tiles``)."""
    blocks = kernel_mask(blocks)
    q, k, v, dout = (t.contiguous() for t in (q, k, v, dout))
    tq = dout.shape[0]  # the rows of dO, LSE and delta (B * Lq for broadcast-Q: see forward)
    dk, dv = alloc_like(k), alloc_like(v)
    dim = q.shape[-1]
    plan, lay = _dkdv_plan(plan, q_offsets, kv_offsets, tq, k.shape[0], q.shape[1], k.shape[1], dim, left, right, True, blocks)
    if k.shape[0] == 0 or lay.rows == 0:
        return dk, dv
    if tq == 0:  # no queries anywhere: no gradient (and no descriptor over 0 rows)
        return dk.zero_(), dv.zero_()
    config = _checked_config(plan, q, k, left, right, q_shared, False, config, "dK/dV pass", blocks)
    vectors = backward_vectors(lse, q_offsets, delta=delta)
    _launch(dout, q, k, v, vectors, q_offsets, kv_offsets, dk, dv, plan, None, None, left, right, scale, q_shared, config, blocks)
    return dk, dv


def backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    left: int,
    right: int,
    scale: float,
    plan=None,
    q_shared: bool = False,
    config: BwdConfig | None = None,
    blocks=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of jagged attention in one pass over the kv-tiles (after the delta
    preprocess): dK/dV stay in registers and each tile adds its share of dQ into an fp32
    accumulator with staged TMA reduce-adds (``jagflash.core.tlx.pipeline.dq_reduce_add``), so
    dQ's summation order varies from run to run. ``out``, ``dout``: ``[Tq, Hq, D]``; ``lse``
    ``[Hq, Tq]`` (or ``[B, Hq, L]``: ``bwd_preprocess.backward_vectors``). ``q_shared``
    (broadcast-Q, as for the forward): dQ ``[Lq, Hq, D]`` is summed over the sequences by the same
    adds. ``config``: as for the forward (``FUSED_DQ`` on). ``blocks``: as for
    :func:`backward_dkdv`."""
    if q.shape[-1] not in TLX_ONE_PASS_HEAD_DIMS:
        raise ValueError(
            f"tlx backward: the one-pass backward takes head dims {TLX_ONE_PASS_HEAD_DIMS} (its dQ tiles are "
            f"{dq_cols(128)} columns wide, the 128-byte swizzle of 16-bit K), got {q.shape[-1]}: run the two passes"
        )
    blocks = kernel_mask(blocks)
    q, k, v, dout = (t.contiguous() for t in (q, k, v, dout))
    lq, hq, dim = q.shape
    tq = dout.shape[0]
    dk, dv = alloc_like(k), alloc_like(v)
    plan, lay = _dkdv_plan(plan, q_offsets, kv_offsets, tq, k.shape[0], hq, k.shape[1], dim, left, right, False, blocks)
    # The accumulator has dQ's layout in fp32 (queries as rows; broadcast-Q: the Lq shared rows,
    # which every sequence adds into). A q-tile that runs past its sequence's end adds exact
    # zeros into the next sequence's rows (TMA clips the rows past the last). Zeroed, so rows
    # that no tile reaches get dQ = 0: by the preprocess, which reads every query row's O and dO
    # anyway (backward_vectors' dq_acc), so no separate fill pass.
    # With config.OWN_SPAN the kernel zeroes, sums and writes the rows of the sequences it owns
    # (tuning.own_span): the preprocess and the cast skip them. With config.SOLE_DQ a step whose
    # dQ cell no other kv-tile adds into writes its dQ (counted first: bwd_preprocess.dq_cell_counts),
    # the preprocess the cells none adds into; the accumulator and the cast hold only the others.
    dq = torch.empty_like(q)
    owned = cells = None
    if k.shape[0] and lay.rows and tq:
        config = _checked_config(plan, q, k, left, right, q_shared, True, config, "one-pass backward", blocks)
        acc = torch.empty((lq, hq * dim), dtype=torch.float32, device=q.device)
        owned = (kv_offsets, config.OWN_SPAN) if config.OWN_SPAN else None
        counts = None
        if config.SOLE_DQ:
            lists = None if blocks is None else blocks.kernel_lists()[1]
            counts = dq_cell_counts(plan, lse, q_offsets, kv_offsets, heads_q=hq, left=left, right=right, config=config, lists=lists)
        vectors = backward_vectors(lse, q_offsets, out=out, dout=dout, dq_acc=acc, acc_shared=q_shared, owned=owned,
                                   cells=None if counts is None else (counts, dq))
        _launch(dout, q, k, v, vectors, q_offsets, kv_offsets, dk, dv, plan, acc, dq, left, right, scale, q_shared, config, blocks,
                counts)
        if counts is not None:
            cells = (counts, vectors[2], q_offsets)
    else:
        acc = torch.zeros((lq, hq * dim), dtype=torch.float32, device=q.device)
        dk.zero_()
        dv.zero_()
    return scaled_cast(acc, scale, dq, None if owned is None else (q_offsets, *owned), cells), dk, dv


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` ``[..., H, D]`` as rows ``[prod(...), H, D]`` (a view where the strides allow)."""
    return t.reshape(math.prod(t.shape[:-2]), *t.shape[-2:])


def dispatch_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    dq_pass: Callable[[], tuple[torch.Tensor, torch.Tensor]], *, left: int, right: int,
    scale: float, deterministic: bool, plan, q_shared: bool = False, blocks=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The TLX backward of a variant: dQ, dK, dV in the shapes of ``q``, ``k``, ``v``.

    :func:`backward` (one pass) where ``jagflash.core.tuning.use_one_pass`` says so, else the
    variant's portable dQ pass ``dq_pass()`` (returning dQ in ``q``'s shape and dtype, and delta)
    then :func:`backward_dkdv`: bitwise repeatable. ``dout``, ``q``, ``k``, ``v``, ``out`` are in
    the variant's layout ``[..., H, D]``; the TLX kernels see them as rows ``[T, H, D]`` (the
    leading dims merged). ``q_offsets``, ``kv_offsets``, ``plan``, ``q_shared``: the rows' jagged
    batch, as for :func:`backward`; ``blocks``: a block mask, as there (``dq_pass`` then honours it)."""
    kw = dict(left=left, right=right, scale=scale, plan=plan, q_shared=q_shared, blocks=blocks)
    if use_one_pass(deterministic, left, right, q.shape[-1]):
        dq, dk, dv = backward(
            _rows(dout), _rows(q), _rows(k), _rows(v), _rows(out), lse, q_offsets, kv_offsets, **kw
        )
        dq = dq.view(q.shape)
    else:
        dq, delta = dq_pass()
        dk, dv = backward_dkdv(_rows(dout), _rows(q), _rows(k), _rows(v), lse, delta, q_offsets, kv_offsets, **kw)
    return dq, dk.view(k.shape), dv.view(v.shape)


def jagged_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor, plan, *, left: int,
    right: int, scale: float, deterministic: bool = False, blocks=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of the jagged layout (``[T, H, D]`` + offsets, LSE ``[Hq, Tq]``), the TLX
    backward of every variant on it (:func:`dispatch_backward` with the portable jagged dQ
    pass): bitwise repeatable (two passes without atomics) unless ``deterministic`` is False and
    ``jagflash.core.tuning.use_one_pass`` picks the one-pass backward. ``blocks``: a block mask
    (``jagflash.core.block_mask.BlockMask``), which both passes honour (the dQ pass is then the
    portable block-sparse one, tiled by the mask's blocks)."""
    dq_pass = jagged_backward_dq if blocks is None else functools.partial(sparse_backward_dq, blocks=blocks)
    return dispatch_backward(
        dout, q, k, v, out, lse, q_offsets, kv_offsets,
        lambda: dq_pass(
            dout, q, k, v, out, lse, q_offsets, kv_offsets, plan, left=left, right=right, scale=scale,
            backend="portable",
        ),
        left=left, right=right, scale=scale, deterministic=deterministic, plan=plan, blocks=blocks,
    )
