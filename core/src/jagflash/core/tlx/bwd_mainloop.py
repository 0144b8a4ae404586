"""The TLX dK/dV kernel's consumer main loop: one consumer warpgroup's 64 kv rows against the
64-query steps of ``jagflash.core.mask.dkdv_q_range``'s range, optionally with dQ.

Grouped arguments: ``kv`` is the kv-tile's halves ``(k_tiles, v_tiles)`` (two 64-row buffers
each, one per consumer); ``qring`` the Q/dO ring ``(q_tiles, do_tiles, lse_tiles, delta_tiles,
q_fulls, q_empties)``, with ``SOLE_DQ`` also the step's dQ cell counts (each step's Q, dO,
packed per-query vectors and count arrive together in one slot); ``seq`` the sequence's ``(lq, lk, q_start, row)`` with ``row`` the kv-tile's block list
for this head (``jagflash.core.mask.tile_list``); ``band`` the mask's ``(left, right)``;
``dq`` the one-pass write-back's ``(desc_dq, ds_tiles, dq_stages, dq_col, sole)``, ``sole``
``SOLE_DQ``'s ``(desc_dqo, dq_outs, scale)``: dQ's TMA descriptor (64-column halves), each
consumer's bf16 stage for a single cell's store, the softmax scale (the counts:
``jagflash.core.tlx.bwd_preprocess.dq_cell_counts``; a sequence the kernel owns counts two a
kv-tile, so none of its cells is written here).
"""

from __future__ import annotations

import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jagflash.core.dtypes import mma_operand
from jagflash.core.mask import band_bounds, block_at, bounds_mask, fine_visible
from jagflash.core.seqlen import q_row
from jagflash.core.tlx.pipeline import (
    consumers_sync,
    dq_add_or_store,
    dq_reduce_add,
    opaque_zero,
    ring_acquire,
    ring_release,
)


@triton.jit
def dkdv_steps(
    dk, dv, kv, qring, kv_rows, q_cnt, start, end, seq, band, qk_scale2, dq,
    CID: tl.constexpr, DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, NUM_Q: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, MASKED: tl.constexpr,
    FUSED_DQ: tl.constexpr, Q_SHARED: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
    DQ_STAGES: tl.constexpr, DQ_COLS: tl.constexpr, SPARSE: tl.constexpr, SUB: tl.constexpr, SOLE_DQ: tl.constexpr = False,
    fine=0, FINE: tl.constexpr = False,
):
    """One consumer warpgroup's HALF kv rows (``kv[0][CID]``, ``kv[1][CID]``) against the q-steps
    at positions ``[start, end)`` of ``jagflash.core.mask.block_walk`` (BLOCK_M queries each;
    with ``SPARSE`` through the list ``seq[3]``, ``SUB`` steps per listed q-block) of one query head: S^T = K Q^T and dP^T = V dO^T on the tensor cores, then
    dV += P^T dO (P^T from registers) and dK += dS^T Q (dS^T through shared memory).

    With ``FUSED_DQ`` the step also computes this warpgroup's part of the step's dQ: both
    warpgroups store their dS^T (64 kv rows each) into the step's pair of ``ds_tiles`` (double
    buffered by step parity), meet (:func:`jagflash.core.tlx.pipeline.consumers_sync`), and
    warpgroup ``CID`` multiplies the whole dS (128 kv rows) by the columns ``[CID * D/2, (CID +
    1) * D/2)`` of K: dQ[:, half] = dS K[:, half], a 64 x D/2 fp32 tile that no other warpgroup
    of the program adds to, reduce-added into the fp32 accumulator ``[rows, Hq * D]`` at row
    ``q_start + m0`` (broadcast-Q: ``m0``), column ``dq_col + CID * D/2``. At D 64
    (``DQ_COLS == HEAD_DIM``: half of K, 32 columns, would fall off its 128-byte swizzle) the
    warpgroup whose ``CID`` is the step's parity computes the whole row over both K halves and
    the other goes straight on (every other step each, so the two stay balanced). K and V are
    indexed through an opaque zero, so their wgmma descriptors are rebuilt each step instead of
    hoisted out of the loop and spilled (bench/NOTES.md, session 4). With ``SOLE_DQ`` (D 128) a
    step whose cell this kv-tile alone adds into stores its dQ (:func:`jagflash.core.tlx.pipeline.dq_add_or_store`) instead;
    its count comes with the step's vectors (the producer's TMA load into ``qring[6]``). With
    ``FINE`` (a tiled 64 x 64 mask) every step also drops what its tile's bits leave out
    (``fine``: the kv-tile's row of bits, ``jagflash.core.mask.tile_codes``)."""
    k_tiles, v_tiles = kv
    q_tiles, do_tiles, lse_tiles, delta_tiles, q_fulls, q_empties = qring[0], qring[1], qring[2], qring[3], qring[4], qring[5]
    lq, lk, q_start, listed = seq
    STEP: tl.constexpr = 1 if SPARSE else BLOCK_M
    for t in range(start, end, STEP):
        m0 = block_at(listed, t, BLOCK_M, SPARSE, SUB)
        if FUSED_DQ:
            zero = opaque_zero(q_cnt)
        else:
            zero = 0
        k_buf = k_tiles[CID + zero]
        v_buf = v_tiles[CID + zero]
        rows = m0 + tl.arange(0, BLOCK_M)
        q_buf, slot = ring_acquire(q_tiles, q_fulls, q_cnt, NUM_Q)
        do_buf = do_tiles[slot]
        st = tlx.async_dot(k_buf, tlx.local_trans(q_buf))
        dpt = tlx.async_dot(v_buf, tlx.local_trans(do_buf))
        # The packed vectors (bwd_preprocess), loaded by the producer with Q and dO: rows past
        # lq are padding, lse2 = +inf (P = 0) and delta 0, so they add nothing (to dQ either:
        # their dS is exactly 0, so the reduce-add into the next sequence's rows adds 0).
        lse2 = tlx.local_load(lse_tiles[slot])
        delta = tlx.local_load(delta_tiles[slot])
        if SOLE_DQ:  # (the step's dQ cell count, loaded with its vectors: int 0 of the box)
            sole = dq[4]
            adds = tlx.local_load(tlx.local_slice(qring[6][slot], [0, 0], [1, 1]))
            alone = tl.sum(tl.sum(adds, 1), 0) == 1
        st = tlx.async_dot_wait(1, st)
        pt = tl.math.exp2(st * qk_scale2 - lse2)
        if MASKED:
            q_lo, q_hi = band_bounds(rows, lq, lk, band[0], band[1], BOUNDED_LEFT, BOUNDED_RIGHT)
            pt = tl.where(bounds_mask(kv_rows[:, None], q_lo[None, :], q_hi[None, :], BOUNDED_LEFT), pt, 0.0)
        if FINE:  # every step: the bits of the tile's 64 x 64 blocks (P = 0 where unlisted, so dS, dK, dV and dQ add 0)
            pt = tl.where(fine_visible(fine, t, m0, kv_rows, SUB)[:, None], pt, 0.0)
        dpt = tlx.async_dot_wait(0, dpt)
        dv = tlx.async_dot(mma_operand(pt, DTYPE), do_buf, dv)
        dst = mma_operand(pt * (dpt - delta), DTYPE)
        if FUSED_DQ:
            desc_dq, ds_tiles, dq_stages, dq_col = dq[0], dq[1], dq[2], dq[3]
            pair = 2 * (q_cnt % 2)
            ds_buf = ds_tiles[pair + CID]
        else:
            ds_buf = dq[1][CID]
        tlx.local_store(ds_buf, dst)
        tlx.fence("async_shared")  # (Triton's barrier pass syncs the warpgroup here)
        dk = tlx.async_dot(ds_buf, q_buf, dk)
        if FUSED_DQ:
            # Both halves of dS^T are in shared memory once both warpgroups pass here; the
            # other pair of buffers is free: both finished the previous step's dQ before it
            # (the one that computes it, with whole rows, arrives here only after it has).
            consumers_sync(q_cnt)
            row = q_row(q_start, m0, Q_SHARED)
            if DQ_COLS == HEAD_DIM:
                # (dK and dV waited for outside the branch: a wgmma wait inside a run-time
                # branch on a product issued before it does not compile)
                dk = tlx.async_dot_wait(0, dk)
                dv = tlx.async_dot_wait(0, dv)
                ring_release(q_empties, slot)  # dQ reads dS and K only
                if q_cnt % 2 == CID:
                    dq_tile = tlx.async_dot(tlx.local_trans(ds_tiles[pair]), k_tiles[zero])
                    dq_tile = tlx.async_dot(tlx.local_trans(ds_tiles[pair + 1]), k_tiles[1 + zero], dq_tile)
                    dq_tile = tlx.async_dot_wait(0, dq_tile)
                    dq_reduce_add(desc_dq, dq_stages, DQ_STAGES * CID, DQ_STAGES, q_cnt // 2, dq_tile, row, dq_col)
            else:
                dq_tile = tlx.async_dot(
                    tlx.local_trans(ds_tiles[pair]), tlx.local_slice(k_tiles[zero], [0, CID * DQ_COLS], [HALF, DQ_COLS])
                )
                dq_tile = tlx.async_dot(
                    tlx.local_trans(ds_tiles[pair + 1]), tlx.local_slice(k_tiles[1 + zero], [0, CID * DQ_COLS], [HALF, DQ_COLS]), dq_tile
                )
                dq_tile = tlx.async_dot_wait(0, dq_tile)
                dk = tlx.async_dot_wait(0, dk)
                dv = tlx.async_dot_wait(0, dv)
                ring_release(q_empties, slot)  # released before the dQ write-back
                if SOLE_DQ:
                    dq_add_or_store(desc_dq, dq_stages, DQ_STAGES * CID, DQ_STAGES, q_cnt, dq_tile, row, dq_col + CID * DQ_COLS, alone, sole, DTYPE)
                else:
                    dq_reduce_add(desc_dq, dq_stages, DQ_STAGES * CID, DQ_STAGES, q_cnt, dq_tile, row, dq_col + CID * DQ_COLS)
        else:
            dk = tlx.async_dot_wait(0, dk)
            dv = tlx.async_dot_wait(0, dv)
            ring_release(q_empties, slot)
        q_cnt += 1
    return dk, dv, q_cnt
