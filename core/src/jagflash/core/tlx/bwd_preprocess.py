"""The TLX backward's passes around its dK/dV kernel.

- The preprocess (:func:`backward_vectors`): log2 LSE and delta = rowsum(dO * O) packed per
  sequence for the dK/dV kernel, each sequence's rows starting at a multiple of ``VEC_PAD``
  (``jagflash.core.tuning``), padding rows holding lse2 = +inf (P = 0) and delta = 0, so that the
  kernel's producer loads a step's vectors as one TMA box each, without a mask; for the one-pass
  backward it also zeroes the fp32 dQ accumulator (but the rows of the sequences the kernel
  owns: ``jagflash.core.tuning.own_span``).
- The one-pass backward's postprocess (:func:`scaled_cast`): dQ = scale x the accumulator, in
  dQ's dtype, one read of the accumulator and one write of dQ at the copy rate (but the owned
  rows, which the kernel wrote).
- With ``SOLE_DQ`` (``jagflash.core.tuning.BwdConfig``), the dQ cells (a 64-query step's columns
  of one head) that one kv-tile adds into, counted by :func:`dq_cell_counts` before the
  preprocess, are written by that tile's consumer; the preprocess zeroes the accumulator of the
  cells of two adds or more only and writes the dQ zeros of those of none, and the cast reads
  only the cells of two adds or more (:func:`scaled_cast` with ``cells``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jagflash.core.jagged import cdiv, next_pow2, seq_lengths
from jagflash.core.mask import block_at, block_walk, dkdv_q_range, tile_list
from jagflash.core.memo import TensorMemo
from jagflash.core.ops import stepped_arange
from jagflash.core.seqlen import owned_seq, plan_row, seq_starts, upper_bound
from jagflash.core.softmax import attn_delta, lse_to_log2
from jagflash.core.tuning import VEC_PAD

#: The ints a dQ cell's count takes in :func:`dq_cell_counts`' rows, the count first: 128 bytes,
#: so that the dK/dV kernel's producer loads each into a ring slot of its own by TMA (a TMA load's
#: shared-memory destination must be 128-byte aligned: 16-byte slots stopped the kernel with a
#: misaligned address, bench/NOTES.md session 36).
CELL_INTS = tl.constexpr(32)


@triton.jit
def _vectors_kernel(
    O, DO, LSE, DELTA_IN, LSE2, DELTA, DQ_ACC, q_offsets, kv_offsets, VEC_TILE, vec_rows, n_seqs, search_steps,
    stride_ot, stride_oh, stride_dot, stride_doh, stride_lh, stride_ls, stride_acc,
    CELLS, cell_row, DQ, stride_dqt,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, GIVEN_DELTA: tl.constexpr, PAD: tl.constexpr,
    ZERO_ACC: tl.constexpr, ACC_SHARED: tl.constexpr, OWN_SPAN: tl.constexpr, SOLE: tl.constexpr,
):
    """The backward's preprocess: ``BLOCK`` rows of head ``program_id(1)`` of the packed
    ``[Hq, vec_rows]`` vectors, each written once. Packed row ``p`` lies in the PAD-row tile
    ``p // PAD``, owned by sequence ``b`` (a binary search over ``VEC_TILE``'s tile prefix sum,
    zero-length sequences skipped); it is that sequence's query ``r = p - VEC_TILE[b] * PAD``
    if ``r`` is under its length: log2 LSE (``lse_to_log2``) and delta = rowsum(dO * O) (or
    ``DELTA_IN``, laid out as LSE, when ``GIVEN_DELTA``); else padding, lse2 = +inf (P = 0) and
    delta = 0. LSE (and DELTA_IN) are ``[Hq, Tq]`` (``stride_lh`` Tq, ``stride_ls`` 1) or ``[B,
    Hq, L]`` (L, Hq): the value of query r of sequence b is at ``h * stride_lh + q_offsets[b] *
    stride_ls + r``.

    ``ZERO_ACC``: also zero the one-pass backward's fp32 dQ accumulator ``DQ_ACC`` (rows of
    ``stride_acc``, head h's D columns at ``h * HEAD_DIM``) on the rows read here, every query
    row once (the offsets end at the row count); ``ACC_SHARED`` (broadcast-Q): its rows are the
    shared block's, zeroed through the first sequence's; ``OWN_SPAN`` > 0: the rows of the
    sequences of at most OWN_SPAN keys are left alone (the dK/dV kernel zeroes them itself).
    ``SOLE`` (``SOLE_DQ``): this program's 64 rows of head h are dQ cell ``(program_id(0), h)`` of
    :func:`dq_cell_counts` (``cell_row`` ints a step; BLOCK 64, PAD a multiple of 64); where no kv-tile adds into it
    (``CELLS`` holds 0), its dQ rows (``DQ``, rows ``stride_dqt`` apart) are written as zeros
    here, as nothing else writes them, and its delta is 0 (no step reads it; its O and dO rows are
    not loaded); its accumulator rows are zeroed only where two kv-tiles or more add into it (one
    writes dQ itself)."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    h = tl.program_id(1).to(tl.int64)
    in_range = p < vec_rows
    b, owned, q_start, r, valid = _packed_rows(p, VEC_TILE, q_offsets, n_seqs, search_steps, PAD)
    valid = valid & in_range
    at = h * stride_lh + q_start * stride_ls + r
    if GIVEN_DELTA:
        delta = tl.load(DELTA_IN + at, mask=valid, other=0.0)
    else:
        offs_d = tl.arange(0, HEAD_DIM)
        r64 = (q_start + r)[:, None]
        live = valid
        if SOLE:  # (a cell no kv-tile visits: nothing reads its delta, so its O and dO rows stay unread)
            adds = tl.load(CELLS + tl.program_id(0) * cell_row + CELL_INTS * h)
            live = valid & (adds > 0)
        o = tl.load(O + r64 * stride_ot + h * stride_oh + offs_d[None, :], mask=live[:, None], other=0.0)
        do = tl.load(DO + r64 * stride_dot + h * stride_doh + offs_d[None, :], mask=live[:, None], other=0.0)
        delta = attn_delta(o, do)
        if ZERO_ACC:
            keep = (valid & (b == 0)) if ACC_SHARED else valid  # (the first sequence's rows are the block's)
            if OWN_SPAN > 0:
                keep = keep & ~owned_seq(kv_offsets, b, owned, OWN_SPAN)
            if SOLE:
                keep = keep & (adds > 1)
                if adds == 0:
                    tl.store(DQ + r64 * stride_dqt + h * HEAD_DIM + offs_d[None, :], tl.zeros([BLOCK, HEAD_DIM], DQ.dtype.element_ty), mask=valid[:, None])
            tl.store(DQ_ACC + r64 * stride_acc + h * HEAD_DIM + offs_d[None, :], tl.zeros([BLOCK, HEAD_DIM], tl.float32), mask=keep[:, None])
    lse2 = tl.where(valid, lse_to_log2(tl.load(LSE + at, mask=valid, other=0.0)), float("inf"))
    tl.store(LSE2 + h * vec_rows + p, lse2, mask=in_range)
    tl.store(DELTA + h * vec_rows + p, delta, mask=in_range)


@triton.jit
def _packed_rows(p, VEC_TILE, q_offsets, n_seqs, search_steps, PAD: tl.constexpr):
    """Rows ``p`` of the packed vectors (:func:`backward_vectors`): ``(b, owned, q_start, r,
    valid)``, packed row ``p`` lying in the PAD-row tile ``p // PAD`` of sequence ``b`` (a binary
    search over ``VEC_TILE``'s tile prefix sum, zero-length sequences skipped; ``owned``: ``b``
    is a sequence, not past the last tile), its query ``r`` (of the sequence starting at row
    ``q_start``) where ``valid`` (``r`` under the sequence's length), else padding."""
    b = upper_bound(VEC_TILE + 1, n_seqs, p // PAD, search_steps)  # n_seqs: past the last tile
    owned = b < n_seqs
    q_start = tl.load(q_offsets + b).to(tl.int64)
    length = tl.load(q_offsets + b + 1, mask=owned, other=0).to(tl.int64) - q_start
    r = p - tl.load(VEC_TILE + b).to(tl.int64) * PAD
    return b, owned, q_start, r, owned & (r < length)


@triton.jit
def _scale_rows(SRC, DST, at, keep, scale):
    """``DST[at] = scale * SRC[at]`` in DST's dtype where ``keep`` (the source read once, not kept
    in L2)."""
    x = tl.load(SRC + at, mask=keep, other=0.0, eviction_policy="evict_first")
    tl.store(DST + at, (x * scale).to(DST.dtype.element_ty), mask=keep)


@triton.jit
def _scaled_cast_kernel(SRC, DST, n, scale, BLOCK: tl.constexpr):
    """``DST[i] = scale * SRC[i]`` in DST's dtype, for the ``BLOCK`` elements of this program
    (flat, both contiguous; 64-bit offsets)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _scale_rows(SRC, DST, i, i < n, scale)


@triton.jit
def _scaled_cast_rows_kernel(
    SRC, DST, rows, cols, scale, q_offsets, kv_offsets, n_seqs, search_steps, OWN_SPAN: tl.constexpr,
    ROWS: tl.constexpr, COLS: tl.constexpr,
):
    """:func:`_scaled_cast_kernel` over a ``[rows, cols]`` block of ROWS x COLS, but the rows of
    the sequences the dK/dV kernel owns (``OWN_SPAN``: ``jagflash.core.seqlen.owned_seq``; a row's
    sequence by a binary search over ``q_offsets``)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * COLS + tl.arange(0, COLS)
    b = upper_bound(q_offsets + 1, n_seqs, r, search_steps)
    keep = (r < rows) & ~owned_seq(kv_offsets, b, b < n_seqs, OWN_SPAN)
    at = r.to(tl.int64)[:, None] * cols + c[None, :]
    _scale_rows(SRC, DST, at, keep[:, None] & (c < cols)[None, :], scale)


@triton.jit
def _cells_cast_kernel(
    SRC, DST, CELLS, cell_row, q_offsets, kv_offsets, VEC_TILE, n_seqs, search_steps, scale, HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr, PAD: tl.constexpr, OWN_SPAN: tl.constexpr,
):
    """:func:`_scaled_cast_kernel` of dQ cell ``(program_id(0), h)`` (``h``:
    ``program_id(1)``; BLOCK packed rows, :func:`_packed_rows`) if two kv-tiles or more add into
    it (``CELLS``: :func:`dq_cell_counts`), but the rows of the sequences the dK/dV kernel owns;
    SRC and DST ``[Tq, Hq * HEAD_DIM]``, contiguous."""
    h = tl.program_id(1)
    if tl.load(CELLS + tl.program_id(0) * cell_row + CELL_INTS * h) > 1:
        p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        b, owned, q_start, r, keep = _packed_rows(p, VEC_TILE, q_offsets, n_seqs, search_steps, PAD)
        if OWN_SPAN > 0:
            keep = keep & ~owned_seq(kv_offsets, b, owned, OWN_SPAN)
        cols = h.to(tl.int64) * HEAD_DIM + tl.arange(0, HEAD_DIM)
        at = (q_start + r)[:, None] * (tl.num_programs(1) * HEAD_DIM) + cols[None, :]
        _scale_rows(SRC, DST, at, keep[:, None], scale)


def scaled_cast(src: torch.Tensor, scale: float, out: torch.Tensor, owned: tuple | None = None,
                cells: tuple | None = None) -> torch.Tensor:
    """``out = scale * src`` in ``out``'s dtype (both contiguous, ``src`` fp32 with as many
    elements as ``out``): the one-pass backward's dQ from its fp32 accumulator. One pass, ~3.95
    TB/s on the H200, where ``torch.mul(src, scale, out=out)`` (TensorIterator's dynamic cast)
    ran at ~3.1 (bench/NOTES.md, session 24). ``owned``: ``(q_offsets, kv_offsets, own_span)``
    with ``src`` ``[Tq, ...]`` rows of those offsets: the rows of the sequences of 1 to
    ``own_span`` keys are left as they are (the dK/dV kernel wrote them: ``tuning.own_span``).
    ``cells`` (``SOLE_DQ``): ``(counts, vec_tile, q_offsets)``, :func:`dq_cell_counts`' counts
    and :func:`vector_tiles`' tiles, ``src`` and ``out`` ``[Tq, Hq, D]``: only the cells that two
    kv-tiles or more add into are written (the kernel wrote the others, the preprocess those
    none adds into)."""
    reasons = [
        *([] if src.dtype == torch.float32 else [f"the source is {src.dtype}, not fp32"]),
        *([] if src.numel() == out.numel() else [f"the source has {src.numel()} elements, the output {out.numel()}"]),
        *(f"the {name} is not contiguous" for name, t in (("source", src), ("output", out)) if not t.is_contiguous()),
    ]
    if owned is not None and src.dim() < 1:
        reasons.append("owned rows need a source of rows")
    if reasons:
        raise ValueError("scaled_cast: " + "; ".join(reasons))
    n = out.numel()
    if not n:
        return out
    if cells is not None:
        counts, vec_tile, q_offsets = cells
        kv_offsets, span = (q_offsets, 0) if owned is None else owned[1:]
        n_seqs = q_offsets.numel() - 1
        hq = out.shape[1]
        _cells_cast_kernel[(counts.shape[0], hq)](
            src, out, counts, counts.stride(0), q_offsets, kv_offsets, vec_tile, n_seqs, n_seqs.bit_length(), scale, HEAD_DIM=out.shape[2],
            BLOCK=64, PAD=VEC_PAD, OWN_SPAN=span, num_warps=4,
        )
    elif owned is None or not owned[2]:
        block = 4096
        _scaled_cast_kernel[(cdiv(n, block),)](src, out, n, scale, BLOCK=block, num_warps=8)
    else:
        q_offsets, kv_offsets, span = owned
        rows = src.shape[0]
        cols = n // max(rows, 1)
        width = min(next_pow2(cols), 1024)
        height = max(4096 // width, 1)
        n_seqs = q_offsets.numel() - 1
        _scaled_cast_rows_kernel[(cdiv(rows, height), cdiv(cols, width))](
            src, out, rows, cols, scale, q_offsets, kv_offsets, n_seqs, max(n_seqs, 1).bit_length(), OWN_SPAN=span,
            ROWS=height, COLS=width, num_warps=8,
        )
    return out


#: :func:`packed_tiles` by offsets (storage and version counter: ``jagflash.core.memo``).
VEC_TILE_MEMO = TensorMemo(8)


def packed_tiles(q_offsets: torch.Tensor) -> torch.Tensor:
    """``vec_tile`` ``[B + 1]`` int32 of :func:`backward_vectors` for jagged ``q_offsets``: the
    prefix sum of each sequence's ``VEC_PAD``-row tiles (``vec_tile[0] = 0``). A function of the
    offsets' values only, so in plain eager mode outside a CUDA graph capture it is kept per
    offsets tensor (:data:`VEC_TILE_MEMO`: an in-place write to the offsets makes a fresh one)
    and the backward of every layer on one batch makes it once (five torch ops fewer a call);
    nothing may write it."""
    key = VEC_TILE_MEMO.key((q_offsets,), "vec_tile")
    hit = VEC_TILE_MEMO.get(key)
    if hit is not None:
        return hit
    vec_tile = torch.zeros(q_offsets.numel(), dtype=torch.int32, device=q_offsets.device)
    vec_tile[1:] = torch.cumsum(torch.div(seq_lengths(q_offsets) + VEC_PAD - 1, VEC_PAD, rounding_mode="floor"), 0)
    VEC_TILE_MEMO.put(key, (q_offsets,), vec_tile)
    return vec_tile


def vector_tiles(lse: torch.Tensor, q_offsets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(vec_tile, vec_rows)`` of :func:`backward_vectors` for ``lse`` (``[Hq, Tq]`` or ``[B, Hq,
    L]``) and the offsets: each sequence's first ``VEC_PAD``-row tile of the packed vectors, and
    their rows (the bound ``Tq + VEC_PAD * B``, 16-divisible)."""
    n_seqs = q_offsets.numel() - 1
    if lse.dim() == 3:
        length = lse.shape[2]
        tq = n_seqs * length
        vec_tile = stepped_arange(n_seqs + 1, cdiv(length, VEC_PAD), lse.device, torch.int32, (lse, q_offsets))
    else:
        tq = lse.shape[1]
        vec_tile = packed_tiles(q_offsets)
    return vec_tile, cdiv(tq + VEC_PAD * n_seqs, 16) * 16


@triton.jit
def _dq_cells_kernel(
    CELLS, cell_row, TILES, COUNT, heads, q_offsets, kv_offsets, VEC_TILE, lists, left, right,
    GROUP: tl.constexpr, HEAD_MAJOR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, SPARSE: tl.constexpr, PAD: tl.constexpr,
    OWN_SPAN: tl.constexpr,
):
    """One row of the dK/dV pass's table: +1 to every dQ cell its kv-tile
    adds into, walking the positions the dK/dV kernel walks (the table row decoded by
    ``plan_row``, its q-range by ``dkdv_q_range``, with ``SPARSE`` through the kv-tile's row of
    the transposed lists: ``block_walk`` / ``block_at``). Cell of query head ``h`` at step ``m0``
    of sequence ``b``: ``[(VEC_TILE[b] * PAD + m0) // BLOCK_M, CELL_INTS h]``, one more where the step
    crosses the sequence's end. A sequence the dK/dV
    kernel owns (``OWN_SPAN``: ``jagflash.core.seqlen.owned_seq``) counts 2 a kv-tile instead,
    so that no cell of it has one add (``SOLE_DQ`` writes those; the owner writes its own)."""
    STEP: tl.constexpr = 1 if SPARSE else BLOCK_M
    SUB: tl.constexpr = BLOCK_N // BLOCK_M
    count = tl.load(COUNT).to(tl.int32)
    ok, b, hk, n0 = plan_row(tl.program_id(0), TILES, count, heads, HEAD_MAJOR)
    _, lq, _, lk = seq_starts(q_offsets, kv_offsets, b)
    if ok & (n0 < lk):
        add = 1
        if OWN_SPAN > 0:
            add = tl.where(owned_seq(kv_offsets, b, True, OWN_SPAN), 2, 1)
        lo, full_lo, full_hi, hi = dkdv_q_range(n0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
        step0 = tl.load(VEC_TILE + b) * (PAD // BLOCK_M)
        for g in range(GROUP):
            head = hk * GROUP + g
            listed = tile_list(lists, b, head, n0 // BLOCK_N, SPARSE)
            p0, _, _, p3 = block_walk(lo, full_lo, full_hi, hi, listed, BLOCK_M, SPARSE, SUB, True)
            for t in range(p0, p3, STEP):
                m0 = block_at(listed, t, BLOCK_M, SPARSE, SUB)
                cell = (step0 + m0 // BLOCK_M).to(tl.int64) * cell_row + CELL_INTS * head
                tail = (m0 + BLOCK_M > lq).to(tl.int32)  # (a cell past its sequence's end is summed: a whole-box store would cross into the next)
                tl.atomic_add(CELLS + cell, add + tail, sem="relaxed")


def dq_cell_counts(plan, lse, q_offsets, kv_offsets, *, heads_q: int, left: int, right: int, config, lists=None) -> torch.Tensor:
    """The adds into each dQ cell of the one-pass backward with ``SOLE_DQ``: ``[steps, W]``
    int32 (a cell: a 64-query step of the packed vectors' rows, :func:`vector_tiles`, times one
    query head, at ``[step, CELL_INTS h]``; both consumer warpgroups' column halves add alike;
    ``W`` is ``CELL_INTS Hq``: the dK/dV kernel's producer loads a step's count by TMA, a box of
    its own, the count first; the other ints stay 0). ``plan``:
    the launch's plan (its dK/dV pass's table), ``config`` its ``BwdConfig``, ``lists`` a block
    mask's transposed lists (``BlockMask.kernel_lists()[1]``) or None. One program per table row
    walks its kv-tile's steps (:func:`_dq_cells_kernel`)."""
    from jagflash.core.plan.model import PASSES  # (the plan's modules import this one's users)

    vec_tile, vec_rows = vector_tiles(lse, q_offsets)
    counts = torch.zeros((cdiv(vec_rows, 64), CELL_INTS.value * heads_q), dtype=torch.int32, device=lse.device)
    lay = plan.info.layout("dkdv")
    if lay.rows:
        _dq_cells_kernel[(lay.rows,)](
            counts, counts.stride(0), plan.section("dkdv"), plan.meta[PASSES.index("dkdv"):], lay.heads, q_offsets, kv_offsets, vec_tile,
            lists, left, right, GROUP=config.GROUP, HEAD_MAJOR=config.HEAD_MAJOR, BLOCK_M=config.BLOCK_M,
            BLOCK_N=config.BLOCK_N, BOUNDED_LEFT=config.BOUNDED_LEFT, BOUNDED_RIGHT=config.BOUNDED_RIGHT,
            SPARSE=config.SPARSE, PAD=config.PAD, OWN_SPAN=config.OWN_SPAN, num_warps=1,
        )
    return counts


def backward_vectors(
    lse: torch.Tensor,
    q_offsets: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    dout: torch.Tensor | None = None,
    delta: torch.Tensor | None = None,
    dq_acc: torch.Tensor | None = None,
    acc_shared: bool = False,
    owned: tuple | None = None,
    cells: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The dK/dV kernel's per-query vectors, packed (see the module's docstring): ``(lse2, delta,
    vec_tile)``, ``lse2`` and ``delta`` ``[Hq, vec_rows]`` fp32 and ``vec_tile`` ``[B + 1]`` int32,
    sequence ``b``'s rows starting at row ``vec_tile[b] * VEC_PAD``. ``lse`` ``[Hq, Tq]``, or
    ``[B, Hq, L]`` for sequences of one length L (``jagflash.core.tlx.fwd_sm90.forward``'s ``lse_per_sequence``); delta
    = rowsum(dO * O) of ``out`` and ``dout`` (``[Tq, Hq, D]``), or given (laid out as ``lse``,
    from the portable dQ pass). One kernel writes every packed row, padding included (no
    fills); for sequences of one length ``vec_tile`` is ``arange(B + 1) * ceil(L / VEC_PAD)``,
    kept in plain eager mode (``core.ops.stepped_arange``), else :func:`packed_tiles`' (kept per
    offsets tensor). No host synchronisation:
    ``vec_rows`` is the bound ``Tq + VEC_PAD * B``.

    ``dq_acc`` (with ``out`` and ``dout``): the one-pass backward's fp32 dQ accumulator ``[Tq,
    Hq * D]`` (``acc_shared``, broadcast-Q: ``[Lq, Hq * D]``, the block every sequence adds
    into), zeroed by the same kernel while it reads O and dO (one pass over memory fewer than a
    separate fill); with no rows to read (Tq or B 0) it is zeroed here. ``owned``: ``(kv_offsets,
    own_span)``: the rows of the sequences of 1 to ``own_span`` keys are not zeroed (the dK/dV
    kernel that owns them does: ``jagflash.core.tuning.own_span``). ``cells``: ``(counts, dq)``
    with ``dq_acc``, the one-pass backward with ``SOLE_DQ``: :func:`dq_cell_counts`' counts and
    dQ ``[Tq, Hq, D]`` (contiguous), whose rows in cells no kv-tile visits are written as zeros
    here; the accumulator is zeroed only in the cells of two adds or more."""
    n_seqs = q_offsets.numel() - 1
    vec_tile, vec_rows = vector_tiles(lse, q_offsets)
    if lse.dim() == 3:
        _, hq, length = lse.shape
        tq, lse_strides = n_seqs * length, (length, hq)
    else:
        hq, tq = lse.shape
        lse_strides = (tq, 1)
    if dq_acc is not None and delta is not None:
        raise ValueError("backward_vectors: dq_acc is zeroed while O and dO are read; a given delta reads neither")
    kv_offsets, own = (q_offsets, 0) if owned is None or dq_acc is None else owned
    if own and acc_shared:
        raise ValueError("backward_vectors: broadcast-Q's shared rows have no owner (owned with acc_shared)")
    if cells is not None and (dq_acc is None or acc_shared or VEC_PAD % 64):
        raise ValueError("backward_vectors: dQ cells need the accumulator (dq_acc), no broadcast-Q and 64-row padding")
    if not (tq and n_seqs):
        if dq_acc is not None:
            dq_acc.zero_()
        lse2 = torch.full((hq, vec_rows), float("inf"), dtype=torch.float32, device=lse.device)
        return lse2, torch.zeros_like(lse2), vec_tile
    lse2 = torch.empty((hq, vec_rows), dtype=torch.float32, device=lse.device)
    packed_delta = torch.empty_like(lse2)
    given = delta is not None
    if given:
        delta = delta.contiguous()
        out = dout = delta  # unused
        strides = (0, 0, 0, 0)
        dim = 16
    else:
        out, dout = out.contiguous(), dout.contiguous()
        strides = (out.stride(0), out.stride(1), dout.stride(0), dout.stride(1))
        dim = out.shape[-1]
        delta = lse  # unused
    block = 64  # (one dQ cell of SOLE_DQ a program and head)
    zero = dq_acc is not None
    sole = cells is not None and zero
    counts, dq = cells if sole else (lse2, lse2)
    _vectors_kernel[(cdiv(vec_rows, block), hq)](
        out, dout, lse.contiguous(), delta, lse2, packed_delta, dq_acc if zero else lse2, q_offsets, kv_offsets, vec_tile,
        vec_rows, n_seqs, n_seqs.bit_length(), *strides, *lse_strides, dq_acc.stride(0) if zero else 0, counts,
        counts.stride(0) if sole else 0, dq,
        dq.stride(0) if sole else 0, HEAD_DIM=dim, BLOCK=block, GIVEN_DELTA=given, PAD=VEC_PAD,
        ZERO_ACC=zero, ACC_SHARED=acc_shared, OWN_SPAN=own, SOLE=sole, num_warps=4,
    )
    return lse2, packed_delta, vec_tile

