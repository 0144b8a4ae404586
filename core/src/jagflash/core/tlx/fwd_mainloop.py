"""The TLX forward's consumer main loop: one consumer warpgroup's 64 rows of a q-tile against the
kv-blocks of ``jagflash.core.mask``'s range.

Two consumer warpgroups take 64 rows each; they issue their QK^T wgmmas in turn (named barriers
``TURN_0`` / ``TURN_1`` of ``jagflash.core.tlx.pipeline``), so one's softmax overlaps the other's
matmul ("ping-pong"), and each keeps its QK^T of kv-block j in flight while its P V of block j-1
issues (software pipelining), carrying P in fp32. With the forward's ``SOLO`` one warpgroup takes
both halves in turn (``TURNS`` off: the SM's other program is what overlaps it), in steps of
half a kv-block (``SUB`` 2 steps a listed block). A positive scale rides in the exponent's fused
multiply-add (``FOLD_SCALE``). The range's masked head and tail run the masked specialisation of
the loop, its body the unmasked one.

The kv-blocks come from ``jagflash.core.mask``'s block iterator: a loop runs over positions
``t`` of :func:`jagflash.core.mask.block_walk` (``STEP`` apart: ``BLOCK_N`` rows, or 1 through a
block list with ``SPARSE``) and visits the block at ``block_at(row, t)``; the producer walks
the same positions (``jagflash.core.tlx.fwd_sm90``), so the K/V ring's counters stay in step.

Grouped arguments: ``kv`` is the K/V ring ``(k_tiles, v_tiles, k_fulls, k_empties, v_fulls,
v_empties)``, ``bounds`` a row's visible keys ``(col_lo, col_hi)`` (``jagflash.core.mask.
band_bounds``), ``state`` the running ``(acc, m_i, l_i, p)`` of the online softmax, ``row`` the
q-tile's block list (``jagflash.core.mask.list_row``; unused without ``SPARSE``).
"""

from __future__ import annotations

import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jagflash.core.dtypes import ACC, mma_operand, output
from jagflash.core.mask import block_at, bounds_mask, fine_visible
from jagflash.core.softmax import finish_softmax, online_softmax_step, online_softmax_step_scaled
from jagflash.core.tlx.pipeline import ring_acquire, ring_release, turn_pass, turn_wait


@triton.jit
def issue_qk(q_buf, k_buf, CID: tl.constexpr, TURNS: tl.constexpr = True):
    """Start S = Q K^T on the tensor cores, with ``TURNS`` in this warpgroup's turn
    (:func:`turn_wait`; without, a program's one consumer warpgroup issues when it likes)."""
    if TURNS:
        turn_wait(CID)
    qk = tlx.async_dot(q_buf, tlx.local_trans(k_buf))
    if TURNS:
        turn_pass(CID)
    return qk


@triton.jit
def pass_kv_blocks(kv_cnt, start, end, kv, CID: tl.constexpr, STEP: tl.constexpr, NUM_KV: tl.constexpr):
    """A consumer whose half of the q-tile lies wholly past the sequence's end: over the
    kv-blocks at positions ``[start, end)`` (``STEP`` apart) it issues no matmul, and keeps only its part of the handshakes:
    its turns to issue (so the other warpgroup never waits for it) and its release of each K and
    V slot, after the slot has filled (a release before that would count towards the slot's
    previous round, which the other warpgroup may still be reading)."""
    for _t in range(start, end, STEP):
        turn_wait(CID)
        turn_pass(CID)
        _, k_slot = ring_acquire(kv[0], kv[2], kv_cnt, NUM_KV)
        ring_release(kv[3], k_slot)
        _, v_slot = ring_acquire(kv[1], kv[4], kv_cnt, NUM_KV)
        ring_release(kv[5], v_slot)
        kv_cnt += 1
    return kv_cnt


@triton.jit
def scores(qk, qk_scale2, bounds, n0, fine, t, BLOCK_N: tl.constexpr, BOUNDED_LEFT: tl.constexpr,
           MASKED: tl.constexpr, FOLD_SCALE: tl.constexpr, FINE: tl.constexpr, SUB: tl.constexpr):
    """Scores of the kv-block at ``n0`` (position ``t`` of the walk), masked (in the masked
    specialisation) by each row's visible keys ``bounds``, and with ``FINE`` in every step by
    the bits of a tiled 64 x 64 mask (``fine``: the row's codes and the half's first row,
    ``jagflash.core.mask.fine_visible``): raw with ``FOLD_SCALE`` (the scale then rides in the
    exponent), else in the log2 domain (masked after the multiply, as 0 x -inf would be NaN)."""
    if FOLD_SCALE:
        s2 = qk
    else:
        s2 = qk * qk_scale2
    cols = n0 + tl.arange(0, BLOCK_N)
    if MASKED:
        s2 = tl.where(bounds_mask(cols[None, :], bounds[0][:, None], bounds[1][:, None], BOUNDED_LEFT), s2, float("-inf"))
    if FINE:
        s2 = tl.where(fine_visible(fine[0], t, fine[1], cols, SUB)[None, :], s2, float("-inf"))
    return s2


@triton.jit
def softmax_step(s, qk_scale2, m_i, l_i, FOLD_SCALE: tl.constexpr):
    """The online-softmax step of scores from :func:`scores`."""
    if FOLD_SCALE:
        return online_softmax_step_scaled(s, qk_scale2, m_i, l_i)
    else:
        return online_softmax_step(s, m_i, l_i)


@triton.jit
def consume(state, kv_cnt, q_buf, kv, bounds, row, start, end, qk_scale2,
            CID: tl.constexpr, DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_KV: tl.constexpr,
            BOUNDED_LEFT: tl.constexpr, MASKED: tl.constexpr, FOLD_SCALE: tl.constexpr, SPARSE: tl.constexpr,
            SUB: tl.constexpr = 1, TURNS: tl.constexpr = True, fine=0, FINE: tl.constexpr = False):
    """One consumer warpgroup over the kv-blocks at positions ``[start, end)`` (masked or not), pipelined:
    the QK^T of block j is in flight while P V of block j-1 is issued. ``state``'s ``p`` holds
    the probabilities of the previous block, not yet multiplied into ``acc``, in fp32 (converted
    where the wgmma takes it); ``acc`` is already scaled to the current running max."""
    acc, m_i, l_i, p = state
    STEP: tl.constexpr = 1 if SPARSE else BLOCK_N
    for t in range(start, end, STEP):
        n0 = block_at(row, t, BLOCK_N, SPARSE, SUB)
        k_buf, k_slot = ring_acquire(kv[0], kv[2], kv_cnt, NUM_KV)
        qk = issue_qk(q_buf, k_buf, CID, TURNS)
        v_buf, v_slot = ring_acquire(kv[1], kv[4], kv_cnt - 1, NUM_KV)
        acc = tlx.async_dot(mma_operand(p, DTYPE), v_buf, acc)
        qk = tlx.async_dot_wait(1, qk)
        ring_release(kv[3], k_slot)
        s2 = scores(qk, qk_scale2, bounds, n0, fine, t, BLOCK_N, BOUNDED_LEFT, MASKED, FOLD_SCALE, FINE, SUB)
        p_new, alpha, m_i, l_i = softmax_step(s2, qk_scale2, m_i, l_i, FOLD_SCALE)
        acc = tlx.async_dot_wait(0, acc)
        ring_release(kv[5], v_slot)
        acc = acc * alpha[:, None]
        p = p_new
        kv_cnt += 1
    return (acc, m_i, l_i, p), kv_cnt


@triton.jit
def attend(kv_cnt, q_buf, kv, bounds, row, blocks, qk_scale2,
           CID: tl.constexpr, DTYPE: tl.constexpr, HALF: tl.constexpr, HEAD_DIM: tl.constexpr,
           BLOCK_N: tl.constexpr, NUM_KV: tl.constexpr, BOUNDED_LEFT: tl.constexpr,
           FOLD_SCALE: tl.constexpr, SPARSE: tl.constexpr, SUB: tl.constexpr = 1, TURNS: tl.constexpr = True,
           fine=0, FINE: tl.constexpr = False):
    """One consumer warpgroup's HALF rows of a q-tile against the kv-blocks at the positions
    ``blocks`` = ``(p0, p1, p2, p3)`` of ``jagflash.core.mask.block_walk`` (of
    ``kv_tile_range``'s range, through the list ``row`` with ``SPARSE``): the first block alone
    (its mask decided at run time), then the masked head, the unmasked body and the masked
    tail, then P V of the last block. Returns ``(acc, m_i, l_i, kv_cnt)`` (unnormalised; no
    block: ``l_i`` 0, which ``finish_softmax`` turns into O 0 and LSE -inf)."""
    lo, full_lo, full_hi, hi = blocks
    STEP: tl.constexpr = 1 if SPARSE else BLOCK_N
    m_i = tl.full([HALF], float("-inf"), ACC)
    l_i = tl.zeros([HALF], ACC)
    acc = tl.zeros([HALF, HEAD_DIM], ACC)
    if hi > lo:
        k_buf, k_slot = ring_acquire(kv[0], kv[2], kv_cnt, NUM_KV)
        qk = issue_qk(q_buf, k_buf, CID, TURNS)
        qk = tlx.async_dot_wait(0, qk)
        ring_release(kv[3], k_slot)
        n0 = block_at(row, lo, BLOCK_N, SPARSE, SUB)
        if (lo < full_lo) | (lo >= full_hi):
            s2 = scores(qk, qk_scale2, bounds, n0, fine, lo, BLOCK_N, BOUNDED_LEFT, True, FOLD_SCALE, FINE, SUB)
        else:
            s2 = scores(qk, qk_scale2, bounds, n0, fine, lo, BLOCK_N, BOUNDED_LEFT, False, FOLD_SCALE, FINE, SUB)
        p, _, m_i, l_i = softmax_step(s2, qk_scale2, m_i, l_i, FOLD_SCALE)  # acc is 0: no rescale
        kv_cnt += 1
        second = lo + STEP
        state = (acc, m_i, l_i, p)
        state, kv_cnt = consume(state, kv_cnt, q_buf, kv, bounds, row, second, tl.maximum(full_lo, second), qk_scale2, CID, DTYPE, BLOCK_N, NUM_KV, BOUNDED_LEFT, True, FOLD_SCALE, SPARSE, SUB, TURNS, fine, FINE)
        state, kv_cnt = consume(state, kv_cnt, q_buf, kv, bounds, row, tl.maximum(full_lo, second), tl.maximum(full_hi, second), qk_scale2, CID, DTYPE, BLOCK_N, NUM_KV, BOUNDED_LEFT, False, FOLD_SCALE, SPARSE, SUB, TURNS, fine, FINE)
        state, kv_cnt = consume(state, kv_cnt, q_buf, kv, bounds, row, tl.maximum(full_hi, second), hi, qk_scale2, CID, DTYPE, BLOCK_N, NUM_KV, BOUNDED_LEFT, True, FOLD_SCALE, SPARSE, SUB, TURNS, fine, FINE)
        acc, m_i, l_i, p = state
        v_buf, v_slot = ring_acquire(kv[1], kv[4], kv_cnt - 1, NUM_KV)
        acc = tlx.async_dot(mma_operand(p, DTYPE), v_buf, acc)
        acc = tlx.async_dot_wait(0, acc)
        ring_release(kv[5], v_slot)
    return acc, m_i, l_i, kv_cnt


@triton.jit
def store_half(acc, m_i, l_i, O, LSE, desc_o, q_buf, q_empty, busy, r0, lq, q_start, h,
               stride_ot, stride_oh, stride_lh, stride_ls,
               HALF: tl.constexpr, HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr, STAGE_O: tl.constexpr, TMA_O: tl.constexpr):
    """A consumer's epilogue of the HALF rows from ``r0`` of a q-tile (those under ``lq`` of the
    sequence starting at row ``q_start``; head ``h``): O (normalised, in DTYPE) and LSE from the
    online softmax's ``(acc, m_i, l_i)``, and the half's Q slot ``q_buf`` handed back (its
    ``q_empty``) where ``busy`` (the producer loaded Q for the tile)."""
    if busy and not STAGE_O:
        tlx.barrier_arrive(q_empty, 1)
    rows = r0 + tl.arange(0, HALF)
    out, lse = finish_softmax(acc, m_i, l_i)
    valid = rows < lq
    offs_d = tl.arange(0, HEAD_DIM)
    o_rows = (q_start + rows).to(tl.int64)
    o_ptrs = O + o_rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    if STAGE_O:
        # O through this half's Q slot (its last QK^T has completed): written in the MMA layout,
        # read back in the store's, where converting the layout in registers takes a 16 KB scratch
        # buffer of shared memory; a tile that visited no block stores zeros made in the store's
        # layout. With TMA_O a half whose rows all lie in the sequence leaves by one TMA store
        # (the slot is free once the copy engine has read it), not by the warpgroup's own stores
        if busy:
            tlx.local_store(q_buf, output(out, DTYPE))
            if TMA_O and (r0 + HALF <= lq):
                tlx.fence("async_shared")
                tlx.async_descriptor_store(desc_o, q_buf, [q_start + r0, h * HEAD_DIM])
                tlx.async_descriptor_store_wait(0)
            else:
                tl.store(o_ptrs, tlx.local_load(q_buf), mask=valid[:, None])
            tlx.barrier_arrive(q_empty, 1)
        else:
            tl.store(o_ptrs, tl.zeros([HALF, HEAD_DIM], DTYPE), mask=valid[:, None])
    else:
        tl.store(o_ptrs, output(out, DTYPE), mask=valid[:, None])
    # LSE [Hq, Tq] (stride_lh = Tq, stride_ls = 1) or [B, Hq, L] (L, Hq: q_start = b L); int32
    # offsets: LSE has D times fewer elements than O, which fits in memory
    tl.store(LSE + (h * stride_lh + q_start * stride_ls + rows), lse, mask=valid)
