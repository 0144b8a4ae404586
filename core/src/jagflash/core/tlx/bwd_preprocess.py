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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jagflash.core.jagged import cdiv, next_pow2, seq_lengths
from jagflash.core.memo import TensorMemo
from jagflash.core.ops import stepped_arange
from jagflash.core.seqlen import owned_seq, upper_bound
from jagflash.core.softmax import attn_delta, lse_to_log2
from jagflash.core.tuning import VEC_PAD


@triton.jit
def _vectors_kernel(
    O, DO, LSE, DELTA_IN, LSE2, DELTA, DQ_ACC, q_offsets, kv_offsets, VEC_TILE, vec_rows, n_seqs, search_steps,
    stride_ot, stride_oh, stride_dot, stride_doh, stride_lh, stride_ls, stride_acc,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, GIVEN_DELTA: tl.constexpr, PAD: tl.constexpr,
    ZERO_ACC: tl.constexpr, ACC_SHARED: tl.constexpr, OWN_SPAN: tl.constexpr,
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
    sequences of at most OWN_SPAN keys are left alone (the dK/dV kernel zeroes them itself)."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    h = tl.program_id(1).to(tl.int64)
    in_range = p < vec_rows
    b = upper_bound(VEC_TILE + 1, n_seqs, p // PAD, search_steps)  # n_seqs: past the last tile
    owned = b < n_seqs
    q_start = tl.load(q_offsets + b).to(tl.int64)
    length = tl.load(q_offsets + b + 1, mask=owned, other=0).to(tl.int64) - q_start
    r = p - tl.load(VEC_TILE + b).to(tl.int64) * PAD
    valid = in_range & owned & (r < length)
    at = h * stride_lh + q_start * stride_ls + r
    if GIVEN_DELTA:
        delta = tl.load(DELTA_IN + at, mask=valid, other=0.0)
    else:
        offs_d = tl.arange(0, HEAD_DIM)
        r64 = (q_start + r)[:, None]
        o = tl.load(O + r64 * stride_ot + h * stride_oh + offs_d[None, :], mask=valid[:, None], other=0.0)
        do = tl.load(DO + r64 * stride_dot + h * stride_doh + offs_d[None, :], mask=valid[:, None], other=0.0)
        delta = attn_delta(o, do)
        if ZERO_ACC:
            keep = (valid & (b == 0)) if ACC_SHARED else valid  # (the first sequence's rows are the block's)
            if OWN_SPAN > 0:
                keep = keep & ~owned_seq(kv_offsets, b, owned, OWN_SPAN)
            tl.store(DQ_ACC + r64 * stride_acc + h * HEAD_DIM + offs_d[None, :], tl.zeros([BLOCK, HEAD_DIM], tl.float32), mask=keep[:, None])
    lse2 = tl.where(valid, lse_to_log2(tl.load(LSE + at, mask=valid, other=0.0)), float("inf"))
    tl.store(LSE2 + h * vec_rows + p, lse2, mask=in_range)
    tl.store(DELTA + h * vec_rows + p, delta, mask=in_range)


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


def scaled_cast(src: torch.Tensor, scale: float, out: torch.Tensor, owned: tuple | None = None) -> torch.Tensor:
    """``out = scale * src`` in ``out``'s dtype (both contiguous, ``src`` fp32 with as many
    elements as ``out``): the one-pass backward's dQ from its fp32 accumulator. One pass, ~3.95
    TB/s on the H200, where ``torch.mul(src, scale, out=out)`` (TensorIterator's dynamic cast)
    ran at ~3.1 (bench/NOTES.md, session 24). ``owned``: ``(q_offsets, kv_offsets, own_span)``
    with ``src`` ``[Tq, ...]`` rows of those offsets: the rows of the sequences of 1 to
    ``own_span`` keys are left as they are (the dK/dV kernel wrote them: ``tuning.own_span``)."""
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
    if owned is None or not owned[2]:
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
    kernel that owns them does: ``jagflash.core.tuning.own_span``)."""
    n_seqs = q_offsets.numel() - 1
    if lse.dim() == 3:
        _, hq, length = lse.shape
        tq, lse_strides = n_seqs * length, (length, hq)
        vec_tile = stepped_arange(n_seqs + 1, cdiv(length, VEC_PAD), lse.device, torch.int32, (lse, q_offsets))
    else:
        hq, tq = lse.shape
        lse_strides = (tq, 1)
        vec_tile = packed_tiles(q_offsets)
    vec_rows = cdiv(tq + VEC_PAD * n_seqs, 16) * 16  # 16-divisible: aligned per-head rows
    if dq_acc is not None and delta is not None:
        raise ValueError("backward_vectors: dq_acc is zeroed while O and dO are read; a given delta reads neither")
    kv_offsets, own = (q_offsets, 0) if owned is None or dq_acc is None else owned
    if own and acc_shared:
        raise ValueError("backward_vectors: broadcast-Q's shared rows have no owner (owned with acc_shared)")
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
    block = 64
    zero = dq_acc is not None
    _vectors_kernel[(cdiv(vec_rows, block), hq)](
        out, dout, lse.contiguous(), delta, lse2, packed_delta, dq_acc if zero else lse2, q_offsets, kv_offsets, vec_tile,
        vec_rows, n_seqs, n_seqs.bit_length(), *strides, *lse_strides, dq_acc.stride(0) if zero else 0, HEAD_DIM=dim,
        BLOCK=block, GIVEN_DELTA=given, PAD=VEC_PAD, ZERO_ACC=zero, ACC_SHARED=acc_shared, OWN_SPAN=own, num_warps=4,
    )
    return lse2, packed_delta, vec_tile

