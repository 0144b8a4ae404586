"""The attention main loops in stock Triton, as ``@triton.jit`` tile programs.

Two levels. The tile functions take base pointers (a variant that walks its own grid may call
them directly):

- :func:`attn_fwd_tile`: one q-tile of one head: O and LSE.
- :func:`attn_bwd_dkdv_tile`: one kv-tile of one kv head: dK and dV, summed over the query
  heads of its GQA group inside the program, so the result is deterministic.
- :func:`attn_bwd_dq_acc`: the dQ of one q-tile against one K/V sequence, in registers and not
  yet scaled; it stores delta = rowsum(dO * O) for the dK/dV pass (so no separate preprocess
  launch is needed; launch it first). :func:`dq_program` stores dQ; layouts whose dQ sums over
  several K/V sequences (broadcast-Q) add it with :func:`atomic_add_rows` across programs, or
  in order in one program.

The programs :func:`fwd_program`, :func:`dq_program`, :func:`dkdv_program` and
:func:`dq_acc_program` take the same work with grouped arguments: the tensors (a tuple of
pointers), their strides (a ``(sequence, row, head)`` triple per tensor: :func:`rows_at`), the
tile's sequence record, its head and first row, the mask ``(scale, left, right)`` (block
sparse: ``(scale, left, right, kv_lists, q_lists)``, the lists of
``jagflash.core.block_mask.BlockMask.kernel_lists``, with the record of
:func:`sparse_sequence`) and the compile-time configuration ``(GROUP, HEAD_DIM, BLOCK_M,
BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE)``. A sequence record is ``(q_at, lq, k_at, lk, lse_at, lse_h)``: the positions
that multiply the q-side and k-side tensors' sequence strides, the lengths, the LSE (and delta)
offset of head 0 and the step between heads; :func:`jagged_sequence` and :func:`dense_sequence`
make the records of the two layouts (a persistent walker calls them: ``portable.persistent``).

Each tile function loops over its partner tiles in three ranges (``jagflash.core.mask``): a
masked range, an unmasked one (no score mask, no key bound checks), and a masked tail, each a
compile-time specialisation of the same loop body, through the block iterator
(``mask.block_walk`` / ``mask.block_at``): the band's blocks, or those of a block list in it.

Pointers: ``*_base`` point at row 0 of the sequence for the tile's head; ``stride_*m`` is the
stride between rows (tokens); the head dimension is contiguous. LSE and delta are fp32 with
rows contiguous.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jagflash.core.mask import (
    band_mask,
    block_at,
    block_walk,
    dkdv_q_range,
    kv_tile_range,
    list_row,
)
from jagflash.core.seqlen import load_rows, row_ptrs, store_rows
from jagflash.core.softmax import (
    LOG2E,
    attn_delta,
    finish_softmax,
    lse_to_log2,
    online_softmax_step,
)


@triton.jit
def _fwd_loop(
    acc, m_i, l_i, q, offs_m, offs_d,
    k_base, v_base, stride_km, stride_vm,
    start, end, row, lq, lk, qk_scale2, left, right,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, MASKED: tl.constexpr, SPARSE: tl.constexpr,
):
    STEP: tl.constexpr = 1 if SPARSE else BLOCK_N
    for t in range(start, end, STEP):
        n0 = block_at(row, t, BLOCK_N, SPARSE)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = load_rows(row_ptrs(k_base, n0, offs_n, stride_km, offs_d), offs_n, lk, offs_d, HEAD_DIM, MASKED, EVEN_D)
        s2 = tl.dot(q, tl.trans(k)) * qk_scale2
        if MASKED:
            mask = band_mask(offs_m[:, None], offs_n[None, :], lq, lk, left, right, BOUNDED_LEFT, BOUNDED_RIGHT)
            s2 = tl.where(mask, s2, float("-inf"))
        p, alpha, m_i, l_i = online_softmax_step(s2, m_i, l_i)
        v = load_rows(row_ptrs(v_base, n0, offs_n, stride_vm, offs_d), offs_n, lk, offs_d, HEAD_DIM, MASKED, EVEN_D)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_i, l_i


@triton.jit
def attn_fwd_tile(
    q_base, k_base, v_base, o_base, lse_base,
    stride_qm, stride_km, stride_vm, stride_om,
    m0, lq, lk, scale, left, right, row,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, SPARSE: tl.constexpr,
):
    """Forward for the q-tile at row ``m0``: writes O rows and their LSE (natural log)."""
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(row_ptrs(q_base, m0, offs_m, stride_qm, offs_d), offs_m, lq, offs_d, HEAD_DIM, True, EVEN_D)
    qk_scale2 = scale * LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, full_lo, full_hi, hi = kv_tile_range(m0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
    lo, full_lo, full_hi, hi = block_walk(lo, full_lo, full_hi, hi, row, BLOCK_N, SPARSE)
    acc, m_i, l_i = _fwd_loop(acc, m_i, l_i, q, offs_m, offs_d, k_base, v_base, stride_km, stride_vm, lo, full_lo, row, lq, lk, qk_scale2, left, right, HEAD_DIM, BLOCK_N, EVEN_D, BOUNDED_LEFT, BOUNDED_RIGHT, True, SPARSE)
    acc, m_i, l_i = _fwd_loop(acc, m_i, l_i, q, offs_m, offs_d, k_base, v_base, stride_km, stride_vm, full_lo, full_hi, row, lq, lk, qk_scale2, left, right, HEAD_DIM, BLOCK_N, EVEN_D, BOUNDED_LEFT, BOUNDED_RIGHT, False, SPARSE)
    acc, m_i, l_i = _fwd_loop(acc, m_i, l_i, q, offs_m, offs_d, k_base, v_base, stride_km, stride_vm, full_hi, hi, row, lq, lk, qk_scale2, left, right, HEAD_DIM, BLOCK_N, EVEN_D, BOUNDED_LEFT, BOUNDED_RIGHT, True, SPARSE)
    out, lse = finish_softmax(acc, m_i, l_i)
    store_rows(row_ptrs(o_base, m0, offs_m, stride_om, offs_d), out.to(o_base.dtype.element_ty), offs_m, lq, offs_d, HEAD_DIM, EVEN_D)
    tl.store(lse_base + offs_m, lse, mask=offs_m < lq)


@triton.jit
def _dq_loop(
    dq, q, do, lse2, delta, offs_m, offs_d,
    k_base, v_base, stride_km, stride_vm,
    start, end, row, lq, lk, qk_scale2, left, right,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, MASKED: tl.constexpr, SPARSE: tl.constexpr,
):
    STEP: tl.constexpr = 1 if SPARSE else BLOCK_N
    for t in range(start, end, STEP):
        n0 = block_at(row, t, BLOCK_N, SPARSE)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = load_rows(row_ptrs(k_base, n0, offs_n, stride_km, offs_d), offs_n, lk, offs_d, HEAD_DIM, MASKED, EVEN_D)
        v = load_rows(row_ptrs(v_base, n0, offs_n, stride_vm, offs_d), offs_n, lk, offs_d, HEAD_DIM, MASKED, EVEN_D)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale2 - lse2[:, None])
        if MASKED:
            mask = band_mask(offs_m[:, None], offs_n[None, :], lq, lk, left, right, BOUNDED_LEFT, BOUNDED_RIGHT)
            p = tl.where(mask, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    return dq


@triton.jit
def attn_bwd_dq_acc(
    q_base, k_base, v_base, o_base, do_base, lse_base, delta_base,
    stride_qm, stride_km, stride_vm, stride_om, stride_dom,
    m0, lq, lk, scale, left, right, row,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, SPARSE: tl.constexpr,
):
    """dQ of the q-tile at row ``m0`` against one K/V sequence, returned as an fp32
    ``[BLOCK_M, BLOCK_D]`` tile *not yet multiplied by* ``scale`` (a caller summing over several
    sequences multiplies once); stores delta = rowsum(dO * O) of its rows for the dK/dV pass.

    :func:`dq_program` stores it; callers that reduce dQ across K/V sequences do that
    themselves: in registers, in order (deterministic), or with :func:`atomic_add_rows`.
    """
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(row_ptrs(q_base, m0, offs_m, stride_qm, offs_d), offs_m, lq, offs_d, HEAD_DIM, True, EVEN_D)
    do = load_rows(row_ptrs(do_base, m0, offs_m, stride_dom, offs_d), offs_m, lq, offs_d, HEAD_DIM, True, EVEN_D)
    o = load_rows(row_ptrs(o_base, m0, offs_m, stride_om, offs_d), offs_m, lq, offs_d, HEAD_DIM, True, EVEN_D)
    delta = attn_delta(o, do)
    tl.store(delta_base + offs_m, delta, mask=offs_m < lq)
    lse2 = lse_to_log2(tl.load(lse_base + offs_m, mask=offs_m < lq, other=float("-inf")))
    qk_scale2 = scale * LOG2E
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, full_lo, full_hi, hi = kv_tile_range(m0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
    lo, full_lo, full_hi, hi = block_walk(lo, full_lo, full_hi, hi, row, BLOCK_N, SPARSE)
    dq = _dq_loop(dq, q, do, lse2, delta, offs_m, offs_d, k_base, v_base, stride_km, stride_vm, lo, full_lo, row, lq, lk, qk_scale2, left, right, HEAD_DIM, BLOCK_N, EVEN_D, BOUNDED_LEFT, BOUNDED_RIGHT, True, SPARSE)
    dq = _dq_loop(dq, q, do, lse2, delta, offs_m, offs_d, k_base, v_base, stride_km, stride_vm, full_lo, full_hi, row, lq, lk, qk_scale2, left, right, HEAD_DIM, BLOCK_N, EVEN_D, BOUNDED_LEFT, BOUNDED_RIGHT, False, SPARSE)
    dq = _dq_loop(dq, q, do, lse2, delta, offs_m, offs_d, k_base, v_base, stride_km, stride_vm, full_hi, hi, row, lq, lk, qk_scale2, left, right, HEAD_DIM, BLOCK_N, EVEN_D, BOUNDED_LEFT, BOUNDED_RIGHT, True, SPARSE)
    return dq


@triton.jit
def atomic_add_rows(ptrs, x, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, EVEN_D: tl.constexpr):
    """Atomically add a ``[rows, BLOCK_D]`` tile, skipping rows past ``n_rows`` and columns past
    HEAD_DIM: :func:`~jagflash.core.seqlen.store_rows` for a sum that several programs write
    (fp32 buffers; the interpreter has no bf16 atomics). Relaxed: the kernel's end orders it."""
    if EVEN_D:
        tl.atomic_add(ptrs, x, mask=rows[:, None] < n_rows, sem="relaxed")
    else:
        tl.atomic_add(ptrs, x, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), sem="relaxed")


@triton.jit
def locate_sequence(offsets, b):
    """Start row (int64) and length (int32) of sequence ``b`` of a jagged tensor."""
    start = tl.load(offsets + b).to(tl.int64)
    length = (tl.load(offsets + b + 1) - start).to(tl.int32)
    return start, length


@triton.jit
def _dkdv_loop(
    dk, dv, k, v, offs_n, offs_d,
    q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
    start, end, row, lq, lk, qk_scale2, left, right,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_D: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, MASKED: tl.constexpr, SPARSE: tl.constexpr,
):
    STEP: tl.constexpr = 1 if SPARSE else BLOCK_M
    for t in range(start, end, STEP):
        m0 = block_at(row, t, BLOCK_M, SPARSE)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        # Rows past lq load LSE -inf, which lse_to_log2 turns into +inf: they add exactly zero.
        q = load_rows(row_ptrs(q_base, m0, offs_m, stride_qm, offs_d), offs_m, lq, offs_d, HEAD_DIM, True, EVEN_D)
        do = load_rows(row_ptrs(do_base, m0, offs_m, stride_dom, offs_d), offs_m, lq, offs_d, HEAD_DIM, True, EVEN_D)
        lse2 = lse_to_log2(tl.load(lse_base + offs_m, mask=offs_m < lq, other=float("-inf")))
        delta = tl.load(delta_base + offs_m, mask=offs_m < lq, other=0.0)
        pt = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale2 - lse2[None, :])
        if MASKED:
            mask = band_mask(offs_m[None, :], offs_n[:, None], lq, lk, left, right, BOUNDED_LEFT, BOUNDED_RIGHT)
            pt = tl.where(mask, pt, 0.0)
        dv += tl.dot(pt.to(do.dtype), do)
        dpt = tl.dot(v, tl.trans(do))
        dst = pt * (dpt - delta[None, :])
        dk += tl.dot(dst.to(q.dtype), q)
    return dk, dv


@triton.jit
def attn_bwd_dkdv_tile(
    q_base, k_base, v_base, do_base, dk_base, dv_base, lse_base, delta_base,
    stride_qm, stride_qh, stride_km, stride_vm, stride_dom, stride_doh, stride_dkm, stride_dvm,
    stride_lseh, n0, lq, lk, scale, left, right, lists, b, h0,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, SPARSE: tl.constexpr,
):
    """dK, dV for the kv-tile at row ``n0``, summed over the GROUP query heads that read it.

    ``q_base``, ``do_base``, ``lse_base`` and ``delta_base`` point at the group's first query
    head ``h0``; ``stride_qh``, ``stride_doh`` and ``stride_lseh`` step to the next one. With
    ``SPARSE``, each head visits the q-blocks of its row of the transposed block lists
    ``lists`` (sequence ``b``; ``jagflash.core.mask.list_row``), else ``lists``, ``b`` are unused.
    """
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_rows(row_ptrs(k_base, n0, offs_n, stride_km, offs_d), offs_n, lk, offs_d, HEAD_DIM, True, EVEN_D)
    v = load_rows(row_ptrs(v_base, n0, offs_n, stride_vm, offs_d), offs_n, lk, offs_d, HEAD_DIM, True, EVEN_D)
    qk_scale2 = scale * LOG2E
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    band = dkdv_q_range(n0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
    for g in range(GROUP):
        row = 0
        if SPARSE:
            row = list_row(lists, b, h0 + g, n0 // BLOCK_N)
        lo, full_lo, full_hi, hi = block_walk(band[0], band[1], band[2], band[3], row, BLOCK_M, SPARSE)
        qh = q_base + g * stride_qh
        doh = do_base + g * stride_doh
        lseh = lse_base + tl.cast(g, tl.int64) * stride_lseh
        deltah = delta_base + tl.cast(g, tl.int64) * stride_lseh
        dk, dv = _dkdv_loop(dk, dv, k, v, offs_n, offs_d, qh, doh, lseh, deltah, stride_qm, stride_dom, lo, full_lo, row, lq, lk, qk_scale2, left, right, HEAD_DIM, BLOCK_M, EVEN_D, BOUNDED_LEFT, BOUNDED_RIGHT, True, SPARSE)
        dk, dv = _dkdv_loop(dk, dv, k, v, offs_n, offs_d, qh, doh, lseh, deltah, stride_qm, stride_dom, full_lo, full_hi, row, lq, lk, qk_scale2, left, right, HEAD_DIM, BLOCK_M, EVEN_D, BOUNDED_LEFT, BOUNDED_RIGHT, False, SPARSE)
        dk, dv = _dkdv_loop(dk, dv, k, v, offs_n, offs_d, qh, doh, lseh, deltah, stride_qm, stride_dom, full_hi, hi, row, lq, lk, qk_scale2, left, right, HEAD_DIM, BLOCK_M, EVEN_D, BOUNDED_LEFT, BOUNDED_RIGHT, True, SPARSE)
    store_rows(row_ptrs(dk_base, n0, offs_n, stride_dkm, offs_d), (dk * scale).to(dk_base.dtype.element_ty), offs_n, lk, offs_d, HEAD_DIM, EVEN_D)
    store_rows(row_ptrs(dv_base, n0, offs_n, stride_dvm, offs_d), dv.to(dv_base.dtype.element_ty), offs_n, lk, offs_d, HEAD_DIM, EVEN_D)


# --- grouped programs -------------------------------------------------------------------------


@triton.jit
def rows_at(T, strides, seq, head):
    """Row 0 of the sequence at position ``seq`` for head ``head`` of a tensor whose
    ``(sequence, row, head)`` strides are ``strides``."""
    return T + seq * strides[0] + tl.cast(head, tl.int64) * strides[2]


@triton.jit
def jagged_sequence(q_offsets, kv_offsets, sizes, b):
    """The record of sequence ``b`` of jagged ``[T, H, D]`` tensors (LSE ``[Hq, Tq]``);
    ``sizes = (Tq, Tk, Hq)``."""
    q_start, lq = locate_sequence(q_offsets, b)
    k_start, lk = locate_sequence(kv_offsets, b)
    return q_start, lq, k_start, lk, q_start, sizes[0]


@triton.jit
def dense_sequence(q_offsets, kv_offsets, sizes, b):
    """The record of batch entry ``b`` of dense ``[B, N, H, D]`` tensors (LSE ``[B, Hq, Nq]``);
    ``sizes = (Nq, Nk, Hq)``; the offsets are not read."""
    bb = b.to(tl.int64)
    return bb, sizes[0], bb, sizes[1], bb * sizes[2] * sizes[0], sizes[0]


@triton.jit
def sparse_sequence(q_offsets, kv_offsets, sizes, b):
    """:func:`jagged_sequence`'s record followed by ``b``: what a block-sparse program needs to
    find its tile's block list (``mask[3]``, ``mask[4]``: :func:`fwd_program`)."""
    q_start, lq, k_start, lk, lse_at, lse_h = jagged_sequence(q_offsets, kv_offsets, sizes, b)
    return q_start, lq, k_start, lk, lse_at, lse_h, b


@triton.jit
def _q_tile_row(mask, seq, h, m0, cfg: tl.constexpr):
    """The q-tile's row of the forward block lists ``mask[3]``, or 0 without lists."""
    SPARSE: tl.constexpr = cfg[7]
    row = 0
    if SPARSE:
        row = list_row(mask[3], seq[6], h, m0 // cfg[2])
    return row


@triton.jit
def fwd_program(tensors, strides, seq, h, m0, mask, cfg: tl.constexpr):
    """:func:`attn_fwd_tile` on ``tensors = (Q, K, V, O, LSE)`` (strides of Q, K, V, O)."""
    GROUP: tl.constexpr = cfg[0]
    hk = h // GROUP
    lists = _q_tile_row(mask, seq, h, m0, cfg)
    attn_fwd_tile(
        rows_at(tensors[0], strides[0], seq[0], h), rows_at(tensors[1], strides[1], seq[2], hk),
        rows_at(tensors[2], strides[2], seq[2], hk), rows_at(tensors[3], strides[3], seq[0], h),
        tensors[4] + seq[4] + h.to(tl.int64) * seq[5],
        strides[0][1], strides[1][1], strides[2][1], strides[3][1], m0, seq[1], seq[3], mask[0],
        mask[1], mask[2], lists, cfg[1], cfg[2], cfg[3], cfg[4], cfg[5], cfg[6], cfg[7],
    )


@triton.jit
def dq_acc_program(tensors, strides, seq, h, m0, mask, cfg: tl.constexpr):
    """:func:`attn_bwd_dq_acc` on ``tensors = (Q, K, V, O, DO, LSE, DELTA)`` (strides of Q, K,
    V, O, DO): the q-tile's dQ against the record's K/V sequence, not yet scaled."""
    GROUP: tl.constexpr = cfg[0]
    hk = h // GROUP
    row = seq[4] + h.to(tl.int64) * seq[5]
    lists = _q_tile_row(mask, seq, h, m0, cfg)
    return attn_bwd_dq_acc(
        rows_at(tensors[0], strides[0], seq[0], h), rows_at(tensors[1], strides[1], seq[2], hk),
        rows_at(tensors[2], strides[2], seq[2], hk), rows_at(tensors[3], strides[3], seq[0], h),
        rows_at(tensors[4], strides[4], seq[0], h), tensors[5] + row, tensors[6] + row,
        strides[0][1], strides[1][1], strides[2][1], strides[3][1], strides[4][1], m0, seq[1],
        seq[3], mask[0], mask[1], mask[2], lists, cfg[1], cfg[2], cfg[3], cfg[4], cfg[5], cfg[6], cfg[7],
    )


@triton.jit
def dq_program(tensors, strides, seq, h, m0, mask, cfg: tl.constexpr):
    """:func:`dq_acc_program`, scaled and stored: ``tensors = (Q, K, V, O, DO, DQ, LSE, DELTA)``
    (strides of Q, K, V, O, DO, DQ)."""
    DQ = tensors[5]
    dq = dq_acc_program((tensors[0], tensors[1], tensors[2], tensors[3], tensors[4], tensors[6], tensors[7]), strides, seq, h, m0, mask, cfg)
    HEAD_DIM: tl.constexpr = cfg[1]
    BLOCK_M: tl.constexpr = cfg[2]
    BLOCK_D: tl.constexpr = cfg[4]
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = row_ptrs(rows_at(DQ, strides[5], seq[0], h), m0, offs_m, strides[5][1], offs_d)
    store_rows(ptrs, (dq * mask[0]).to(DQ.dtype.element_ty), offs_m, seq[1], offs_d, HEAD_DIM, BLOCK_D == HEAD_DIM)


@triton.jit
def dkdv_program(tensors, strides, seq, hk, n0, mask, cfg: tl.constexpr):
    """:func:`attn_bwd_dkdv_tile` for kv head ``hk`` on ``tensors = (Q, K, V, DO, DK, DV, LSE,
    DELTA)`` (strides of Q, K, V, DO, DK, DV)."""
    GROUP: tl.constexpr = cfg[0]
    SPARSE: tl.constexpr = cfg[7]
    h = hk * GROUP
    row = seq[4] + h.to(tl.int64) * seq[5]
    lists = 0
    b = 0
    if SPARSE:
        lists = mask[4]
        b = seq[6]
    attn_bwd_dkdv_tile(
        rows_at(tensors[0], strides[0], seq[0], h), rows_at(tensors[1], strides[1], seq[2], hk),
        rows_at(tensors[2], strides[2], seq[2], hk), rows_at(tensors[3], strides[3], seq[0], h),
        rows_at(tensors[4], strides[4], seq[2], hk), rows_at(tensors[5], strides[5], seq[2], hk),
        tensors[6] + row, tensors[7] + row, strides[0][1], strides[0][2], strides[1][1],
        strides[2][1], strides[3][1], strides[3][2], strides[4][1], strides[5][1], seq[5], n0,
        seq[1], seq[3], mask[0], mask[1], mask[2], lists, b, h, GROUP, cfg[1], cfg[2], cfg[3], cfg[4],
        cfg[5], cfg[6], cfg[7],
    )
