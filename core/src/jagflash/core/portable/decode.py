"""The decode path: a jagged forward for batches whose sequences have few queries each (one
token per sequence, or a few candidates), in stock Triton (any sm80+ GPU, and the interpreter).

The tile kernels give every (sequence, query head, q-tile) its own program and read each K/V
block once per query head; with one to a few queries a sequence their q-tiles are mostly
empty rows. Here a program takes, for ONE kv head, the query rows of every query head of its
GQA group and of ``SEQS`` consecutive sequences (``jagflash.core.tuning.decode_config``)::

    program (pack p, kv head h, split s)          rows of its tile (ROWS = max_seqlen_q x GROUP)
    sequences p*SEQS .. p*SEQS+SEQS-1             [seq 0: q0 g0, q0 g1, .., q1 g0, ..][seq 1: ..]
    keys: the union of their visible keys         one contiguous range of K/V rows (sequences are
          [k_lo, k_hi), split into SPLITS chunks  back to back), chunk s of it, BLOCK_N at a time

so K and V are read once per kv head (per chunk). Each row's visible keys are one interval of
absolute K/V rows, its own sequence's band (``jagflash.core.mask.band_bounds``: causal and
windows bottom-right aligned) shifted by the sequence's start, so rows of different sequences in
one tile never see each other's keys. With ``SPLITS > 1`` (long keys: flash-decoding) each
program writes a normalised partial output and its LSE (fp32) and a second launch merges the
partials of a row through their LSE (``jagflash.core.softmax.merge_partial_rows``, the twin of
``merge_partials``). A row that sees no key (``Lk = 0``, or the mask) gets output 0 and LSE -inf.
NaN and inf in the inputs stay in their own sequence's rows, as in the tile kernels: Q's and
K's through the row mask, V's (which the shared ``p @ v`` would spread through ``0 * inf``) by a
dot over V's finite values and, in a program that met others, a second pass over its keys that
applies them to the rows that see them (packed programs only: one sequence's rows share its
keys anyway).

:func:`backward` runs the same programs backwards: each takes the same rows and keys, computes
P again from the forward's LSE, and writes dK and dV of its chunk of keys once (a key belongs to
one sequence, so to one pack: no atomics, deterministic) and its rows' dQ (summed over the
splits by a second launch where the keys were split); keys no row of their pack sees get zero
gradients. Packed programs keep a non-finite input inside its own sequence's gradients: dS is
masked to each row's own keys (V's, O's and the LSE's reach no other row), and a program that
meets a non-finite q, dO or K (which the shared dots would spread through ``0 * inf``) runs its
sequences again one at a time, each with only its own rows and keys.

:func:`forward` and :func:`backward` are the host side; which calls take them is
``jagflash.core.tuning.use_decode``'s rule (the same for both passes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jagflash.core.jagged import cdiv
from jagflash.core.mask import band_bounds, ceil_to
from jagflash.core.ops import alloc, alloc_like, for_kernel
from jagflash.core.softmax import (
    LOG2E,
    attn_delta,
    finish_softmax,
    lse_to_log2,
    merge_partial_rows,
    online_softmax_step,
)
from jagflash.core.tile_scheduler import default_workers
from jagflash.core.tuning import decode_config

__all__ = ["backward", "forward"]


@triton.jit
def _pack_rows(q_offsets, kv_offsets, batch, pack, left, right, GROUP: tl.constexpr, ROWS: tl.constexpr,
               SEQS: tl.constexpr, BLOCK_M: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr):
    """The rows of pack ``pack``: (live, token row, head within the GQA group, first visible key,
    end of the visible keys) per row, keys as absolute K/V rows (``lo == hi``: none)."""
    r = tl.arange(0, BLOCK_M)
    local = r // ROWS
    seq = pack * SEQS + local
    qi = (r % ROWS) // GROUP
    g = r % GROUP
    in_batch = (local < SEQS) & (seq < batch)
    at = tl.where(in_batch, seq, 0)
    q_start = tl.load(q_offsets + at).to(tl.int32)
    lq = tl.load(q_offsets + at + 1).to(tl.int32) - q_start
    k_start = tl.load(kv_offsets + at).to(tl.int32)
    lk = tl.load(kv_offsets + at + 1).to(tl.int32) - k_start
    live = in_batch & (qi < lq)
    lo, hi = band_bounds(qi, lq, lk, left, right, BOUNDED_LEFT, BOUNDED_RIGHT)
    lo = tl.minimum(tl.maximum(lo, 0), lk)
    hi = tl.maximum(tl.minimum(hi, lk), lo)
    lo = k_start + lo
    hi = tl.where(live, k_start + hi, lo)
    return live, q_start + qi, g, lo, hi


@triton.jit
def _chunks(lo, hi, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """A pack's key range ``[k_lo, k_lo + n_keys)`` (the union of its rows' keys), the chunk
    each split takes (a multiple of BLOCK_N; 0 without keys) and how many splits hold keys
    (at least 1: split 0 always writes its rows)."""
    seen = hi > lo
    k_lo = tl.min(tl.where(seen, lo, 2147483647), 0)
    k_hi = tl.max(tl.where(seen, hi, 0), 0)
    n_keys = tl.where(k_hi > k_lo, k_hi - k_lo, 0)
    k_lo = tl.where(n_keys > 0, k_lo, 0)
    chunk = ceil_to((n_keys + SPLITS - 1) // SPLITS, BLOCK_N)
    parts = tl.where(chunk > 0, (n_keys + tl.maximum(chunk, 1) - 1) // tl.maximum(chunk, 1), 1)
    return k_lo, n_keys, chunk, parts


@triton.jit
def _ptrs(base, row, head, stride_t, stride_h, offs_d):
    return base + row.to(tl.int64)[:, None] * stride_t + head.to(tl.int64)[:, None] * stride_h + offs_d[None, :]


@triton.jit
def _nonfinite(out, V, sv_t, hk_off, offs_d, d_ok, start, end, lo, hi, BLOCK_N: tl.constexpr):
    """``out`` with V's non-finite values of keys ``[start, end)`` applied as the plain
    ``p @ v`` applies them to each row from the keys it sees (``[lo, hi)``, its own sequence's):
    NaN for a NaN value, +-inf for an infinite one (NaN if both signs). A second pass over the
    chunk, run only where the main loop met such values."""
    state = tl.zeros(out.shape, tl.int32)  # bits: 1 +inf seen, 2 -inf seen, 4 NaN seen
    for n0 in range(start, end, BLOCK_N):
        kj = n0 + tl.arange(0, BLOCK_N)
        v = tl.load(V + kj.to(tl.int64)[:, None] * sv_t + hk_off + offs_d[None, :], mask=(kj < end)[:, None] & d_ok[None, :], other=0.0)
        vf = v.to(tl.float32)
        seen = tl.where((kj[None, :] >= lo[:, None]) & (kj[None, :] < hi[:, None]), 1.0, 0.0)
        # one dot counts all three (at most BLOCK_N <= 64 each, powers of two: exact in tf32)
        code = tl.where(vf == float("inf"), 1.0, 0.0) + tl.where(vf == float("-inf"), 128.0, 0.0) + tl.where(vf != vf, 16384.0, 0.0)
        n = tl.dot(seen, code).to(tl.int32)
        state = state | tl.where(n % 128 > 0, 1, 0) | tl.where((n // 128) % 128 > 0, 2, 0) | tl.where(n >= 16384, 4, 0)
    inf = tl.where((state & 1) > 0, float("inf"), float("-inf"))
    return tl.where(((state & 4) > 0) | (state == 3), float("nan"), tl.where(state > 0, inf, out))


@triton.jit
def decode_fwd_kernel(
    Q, K, V, O, LSE, PART_O, PART_LSE, q_offsets, kv_offsets, strides, sizes, mask,  # noqa: E741
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SEQS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    """Program (pack, kv head, split): its rows over its chunk of their keys. ``SPLITS == 1``:
    O and LSE directly; else the partial (normalised fp32 output, LSE) of split ``s`` in
    ``PART_O [SPLITS, Tq, Hq, D]`` / ``PART_LSE [SPLITS, Hq, Tq]``, for
    :func:`decode_merge_kernel`; splits past the pack's keys write nothing."""
    pack = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    (sq_t, sq_h), (sk_t, sk_h), (sv_t, sv_h), (so_t, so_h) = strides
    batch, total_q, heads_q = sizes
    scale, left, right = mask
    live, row, g, lo, hi = _pack_rows(q_offsets, kv_offsets, batch, pack, left, right, GROUP, ROWS, SEQS, BLOCK_M, BOUNDED_LEFT, BOUNDED_RIGHT)
    k_lo, n_keys, chunk, parts = _chunks(lo, hi, SPLITS, BLOCK_N)
    if split < parts:
        head = hk * GROUP + g
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        start = k_lo + split * chunk
        end = tl.minimum(start + chunk, k_lo + n_keys)
        lo = tl.maximum(lo, start)
        hi = tl.minimum(hi, end)
        q = tl.load(_ptrs(Q, row, head, sq_t, sq_h, offs_d), mask=live[:, None] & d_ok[None, :], other=0.0)
        qk_scale2 = scale * LOG2E
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        offs_n = tl.arange(0, BLOCK_N)
        bad = split * 0  # a non-finite V value met (packed programs only)
        for n0 in range(start, end, BLOCK_N):
            kj = n0 + offs_n
            kv_ok = (kj < end)[:, None] & d_ok[None, :]
            kv_row = kj.to(tl.int64)[:, None]
            k = tl.load(K + kv_row * sk_t + hk * sk_h + offs_d[None, :], mask=kv_ok, other=0.0)
            s2 = tl.dot(q, tl.trans(k)) * qk_scale2
            s2 = tl.where((kj[None, :] >= lo[:, None]) & (kj[None, :] < hi[:, None]), s2, float("-inf"))
            p, alpha, m_i, l_i = online_softmax_step(s2, m_i, l_i)
            v = tl.load(V + kv_row * sv_t + hk * sv_h + offs_d[None, :], mask=kv_ok, other=0.0)
            if SEQS > 1:
                # Another sequence's NaN or inf in V would reach these rows through p = 0 in
                # the shared dot (0 * inf): the dot takes V's finite values; the others are
                # applied after the loop, to the rows of their own sequence alone.
                finite = (v - v) == 0
                bad = tl.maximum(bad, 1 - tl.min(tl.min(finite.to(tl.int32), 1), 0))
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), tl.where(finite, v, 0.0).to(v.dtype))
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        out, lse = finish_softmax(acc, m_i, l_i)
        if SEQS > 1:  # noqa: SIM102 (a compile-time branch around a run-time one)
            if bad > 0:
                out = _nonfinite(out, V, sv_t, hk * sv_h, offs_d, d_ok, start, end, lo, hi, BLOCK_N)
        keep = live[:, None] & d_ok[None, :]
        if SPLITS == 1:
            tl.store(_ptrs(O, row, head, so_t, so_h, offs_d), out.to(O.dtype.element_ty), mask=keep)
            tl.store(LSE + head.to(tl.int64) * total_q + row, lse, mask=live)
        else:
            at = split * total_q + row
            tl.store(_ptrs(PART_O, at, head, heads_q * HEAD_DIM, HEAD_DIM, offs_d), out, mask=keep)
            tl.store(PART_LSE + (split * heads_q + head).to(tl.int64) * total_q + row, lse, mask=live)


@triton.jit
def _merge_rows(
    q_offsets, kv_offsets, sizes, mask,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SEQS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    """A merge program's (pack, kv head) rows: live, token row, query head, how many splits
    wrote them, the head-dim offsets and the rows' store mask."""
    pack = tl.program_id(0)
    hk = tl.program_id(1)
    batch, _, _ = sizes
    left, right = mask
    live, row, g, lo, hi = _pack_rows(q_offsets, kv_offsets, batch, pack, left, right, GROUP, ROWS, SEQS, BLOCK_M, BOUNDED_LEFT, BOUNDED_RIGHT)
    _, _, _, parts = _chunks(lo, hi, SPLITS, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    return live, row, hk * GROUP + g, parts, offs_d, live[:, None] & (offs_d < HEAD_DIM)[None, :]


@triton.jit
def decode_merge_kernel(
    O, LSE, PART_O, PART_LSE, q_offsets, kv_offsets, strides, sizes, mask,  # noqa: E741
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SEQS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    """Program (pack, kv head): merge the partials its splits wrote into O and LSE."""
    so_t, so_h = strides
    _, total_q, heads_q = sizes
    live, row, head, parts, offs_d, keep = _merge_rows(
        q_offsets, kv_offsets, sizes, mask, GROUP, HEAD_DIM, ROWS, SEQS, BLOCK_M, BLOCK_N, BLOCK_D, SPLITS,
        BOUNDED_LEFT, BOUNDED_RIGHT,
    )
    out = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lse = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in range(0, parts):
        part = tl.load(_ptrs(PART_O, s * total_q + row, head, heads_q * HEAD_DIM, HEAD_DIM, offs_d), mask=keep, other=0.0)
        part_lse = tl.load(PART_LSE + (s * heads_q + head).to(tl.int64) * total_q + row, mask=live, other=float("-inf"))
        out, lse = merge_partial_rows(out, lse, part, part_lse)
    tl.store(_ptrs(O, row, head, so_t, so_h, offs_d), out.to(O.dtype.element_ty), mask=keep)
    tl.store(LSE + head.to(tl.int64) * total_q + row, lse, mask=live)


def _launch(q, k, q_offsets, *, max_seqlen_q, max_seqlen_kv, left, right, backend, backward):
    """What both passes' launches share: ``cfg`` (``jagflash.core.tuning.decode_config``), the
    kernels' compile-time arguments, the number of packs and the ``sizes`` tuple."""
    total_q, heads_q, head_dim = q.shape
    heads_kv = k.shape[1]
    batch = q_offsets.numel() - 1
    group = heads_q // heads_kv
    cfg = decode_config(
        backend, batch=batch, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, total_kv=k.shape[0],
        heads_kv=heads_kv, group=group, head_dim=head_dim, sms=default_workers(q.device), backward=backward,
    )
    consts = dict(
        GROUP=group, HEAD_DIM=head_dim, ROWS=cfg.ROWS, SEQS=cfg.SEQS, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
        BLOCK_D=cfg.BLOCK_D, SPLITS=cfg.SPLITS, BOUNDED_LEFT=left >= 0, BOUNDED_RIGHT=right >= 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return cfg, consts, cdiv(batch, cfg.SEQS), (batch, total_q, heads_q)


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor, *,
    max_seqlen_q: int, max_seqlen_kv: int, left: int, right: int, scale: float, backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """O ``[Tq, Hq, D]`` (q's dtype) and LSE ``[Hq, Tq]`` fp32 (natural log) of a jagged
    attention, by the decode kernels. ``q [Tq, Hq, D]``, ``k``/``v [Tk, Hkv, D]``, offsets
    ``[B+1]`` (validated by the caller); ``max_seqlen_q`` / ``max_seqlen_kv`` upper bounds of the
    lengths (the caller's: a sequence longer than ``max_seqlen_q`` would lose rows, so they must
    hold, as everywhere); ``left``/``right`` the band (``jagflash.core.mask.mask_bounds``);
    ``backend`` ``portable`` or ``interpreter`` (bf16 upcast there:
    ``jagflash.core.ops.for_kernel``). Launches: one (``SPLITS == 1``) or two (the partials'
    merge), grids from host ints only (no sync)."""
    dtype = q.dtype
    q, k, v = (for_kernel(t, backend) for t in (q, k, v))
    total_q, heads_q, head_dim = q.shape
    out = alloc_like(q)
    lse = alloc((heads_q, total_q), torch.float32, q.device)
    if total_q == 0:
        return out.to(dtype), lse
    cfg, consts, packs, sizes = _launch(
        q, k, q_offsets, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, left=left, right=right,
        backend=backend, backward=False,
    )
    heads_kv = k.shape[1]
    if cfg.SPLITS > 1:
        parts = (alloc((cfg.SPLITS, total_q, heads_q, head_dim), torch.float32, q.device),
                 alloc((cfg.SPLITS, heads_q, total_q), torch.float32, q.device))
    else:
        parts = (out, lse)  # not read: SPLITS == 1 writes O and LSE directly
    strides = tuple((t.stride(0), t.stride(1)) for t in (q, k, v, out))
    decode_fwd_kernel[(packs, heads_kv, cfg.SPLITS)](
        q, k, v, out, lse, *parts, q_offsets, kv_offsets, strides, sizes, (scale, left, right), **consts
    )
    if cfg.SPLITS > 1:
        decode_merge_kernel[(packs, heads_kv)](
            out, lse, *parts, q_offsets, kv_offsets, strides[3], sizes, (left, right), **consts
        )
    return out.to(dtype), lse


# --- the backward ------------------------------------------------------------------------------


@triton.jit
def _any_nonfinite(x):
    """1 if the tile holds a NaN or an infinity, else 0."""
    return 1 - tl.min(tl.min(((x - x) == 0).to(tl.int32), 1), 0)


@triton.jit
def _zero_keys(DK, DV, sdk_t, sdv_t, offs_d, d_ok, start, end, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Zero dK and dV of keys ``[start, end)`` (of the kv head ``DK`` and ``DV`` point at)."""
    for n0 in range(start, end, BLOCK_N):
        kj = n0 + tl.arange(0, BLOCK_N)
        ok = (kj < end)[:, None] & d_ok[None, :]
        kv_row = kj.to(tl.int64)[:, None]
        zero = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        tl.store(DK + kv_row * sdk_t + offs_d[None, :], zero.to(DK.dtype.element_ty), mask=ok)
        tl.store(DV + kv_row * sdv_t + offs_d[None, :], zero.to(DV.dtype.element_ty), mask=ok)


@triton.jit
def _bwd_keys(
    dq, q, do, lse2, delta, lo, hi, K, V, DK, DV, kv_strides, offs_d, d_ok, start, end, qk_scale2, scale,
    BLOCK_N: tl.constexpr, CHECK: tl.constexpr,
):
    """Keys ``[start, end)`` against the rows (``q``, ``do``, log2 LSE, delta; row ``i`` sees
    keys ``[lo_i, hi_i)``): stores their dK and dV (every row's share: the keys' whole
    gradient) and returns ``dq`` plus the rows' share of dQ (not yet scaled), and with
    ``CHECK`` whether a loaded K value was non-finite. dS is masked to the rows' own keys
    (``0 * inf`` of a masked P would otherwise carry V's and O's non-finite values)."""
    sk_t, sv_t, sdk_t, sdv_t = kv_strides
    bad = start * 0
    for n0 in range(start, end, BLOCK_N):
        kj = n0 + tl.arange(0, BLOCK_N)
        ok = (kj < end)[:, None] & d_ok[None, :]
        kv_row = kj.to(tl.int64)[:, None]
        k = tl.load(K + kv_row * sk_t + offs_d[None, :], mask=ok, other=0.0)
        v = tl.load(V + kv_row * sv_t + offs_d[None, :], mask=ok, other=0.0)
        seen = (kj[None, :] >= lo[:, None]) & (kj[None, :] < hi[:, None])
        p = tl.where(seen, tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale2 - lse2[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = tl.where(seen, p * (dp - delta[:, None]), 0.0)
        dv = tl.dot(tl.trans(p.to(do.dtype)), do)
        dk = tl.dot(tl.trans(ds.to(q.dtype)), q) * scale
        dq += tl.dot(ds.to(k.dtype), k)
        if CHECK:
            bad = tl.maximum(bad, _any_nonfinite(k))
        tl.store(DK + kv_row * sdk_t + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=ok)
        tl.store(DV + kv_row * sdv_t + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=ok)
    return dq, bad


@triton.jit
def decode_bwd_kernel(
    Q, K, V, O, DO, LSE, DQ, DK, DV, PART_DQ, q_offsets, kv_offsets, strides, sizes, mask,  # noqa: E741
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SEQS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    """Program (pack, kv head, split): the gradients of its rows over its chunk of their keys,
    the rows and chunks of :func:`decode_fwd_kernel`. dK, dV of the chunk's keys directly; dQ
    directly (``SPLITS == 1``) or split ``s``'s share in ``PART_DQ [SPLITS, Tq, Hq, D]`` fp32
    for :func:`decode_bwd_merge_kernel`. Split 0 also zeroes the keys of its sequences that
    none of their rows sees (outside the pack's key range)."""
    pack = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    (sq_t, sq_h), (sk_t, sk_h), (sv_t, sv_h), (so_t, so_h), (sdo_t, sdo_h), (sdq_t, sdq_h), (sdk_t, sdk_h), (sdv_t, sdv_h) = strides
    batch, total_q, heads_q = sizes
    scale, left, right = mask
    live, row, g, lo, hi = _pack_rows(q_offsets, kv_offsets, batch, pack, left, right, GROUP, ROWS, SEQS, BLOCK_M, BOUNDED_LEFT, BOUNDED_RIGHT)
    k_lo, n_keys, chunk, parts = _chunks(lo, hi, SPLITS, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    K += hk.to(tl.int64) * sk_h
    V += hk.to(tl.int64) * sv_h
    DK += hk.to(tl.int64) * sdk_h
    DV += hk.to(tl.int64) * sdv_h
    if split == 0:
        first = pack * SEQS
        seq_lo = tl.load(kv_offsets + first).to(tl.int32)
        seq_hi = tl.load(kv_offsets + tl.minimum(first + SEQS, batch)).to(tl.int32)
        hull_lo = tl.where(n_keys > 0, k_lo, seq_hi)
        _zero_keys(DK, DV, sdk_t, sdv_t, offs_d, d_ok, seq_lo, hull_lo, BLOCK_N, BLOCK_D)
        _zero_keys(DK, DV, sdk_t, sdv_t, offs_d, d_ok, tl.maximum(k_lo + n_keys, hull_lo), seq_hi, BLOCK_N, BLOCK_D)
    if split < parts:
        head = hk * GROUP + g
        start = k_lo + split * chunk
        end = tl.minimum(start + chunk, k_lo + n_keys)
        lo = tl.maximum(lo, start)
        hi = tl.minimum(hi, end)
        rows_ok = live[:, None] & d_ok[None, :]
        q = tl.load(_ptrs(Q, row, head, sq_t, sq_h, offs_d), mask=rows_ok, other=0.0)
        do = tl.load(_ptrs(DO, row, head, sdo_t, sdo_h, offs_d), mask=rows_ok, other=0.0)
        o = tl.load(_ptrs(O, row, head, so_t, so_h, offs_d), mask=rows_ok, other=0.0)
        delta = attn_delta(o, do)
        lse2 = lse_to_log2(tl.load(LSE + head.to(tl.int64) * total_q + row, mask=live, other=float("-inf")))
        qk_scale2 = scale * LOG2E
        kv_strides = (sk_t, sv_t, sdk_t, sdv_t)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        dq, bad = _bwd_keys(dq, q, do, lse2, delta, lo, hi, K, V, DK, DV, kv_strides, offs_d, d_ok, start, end, qk_scale2, scale, BLOCK_N, SEQS > 1)
        if SEQS > 1:
            # q's and dO's through dK and dV, K's through dQ; V's, O's and the LSE's reach the
            # other sequences only through dS, which is masked (see _bwd_keys).
            bad = tl.maximum(bad, tl.maximum(_any_nonfinite(q), _any_nonfinite(do)))
            if bad > 0:
                # Again, one sequence at a time: its rows alone against its keys alone.
                tl.debug_barrier()
                _zero_keys(DK, DV, sdk_t, sdv_t, offs_d, d_ok, start, end, BLOCK_N, BLOCK_D)
                tl.debug_barrier()
                local = tl.arange(0, BLOCK_M) // ROWS
                dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
                for s in range(0, SEQS):
                    own = live & (local == s) & (hi > lo)
                    s_lo = tl.min(tl.where(own, lo, 2147483647), 0)
                    s_hi = tl.max(tl.where(own, hi, 0), 0)
                    if s_hi > s_lo:
                        mine = own[:, None]
                        dq_s, _ = _bwd_keys(
                            tl.zeros([BLOCK_M, BLOCK_D], tl.float32), tl.where(mine, q, 0.0), tl.where(mine, do, 0.0),
                            tl.where(own, lse2, float("inf")), tl.where(own, delta, 0.0), tl.where(own, lo, 0),
                            tl.where(own, hi, 0), K, V, DK, DV, kv_strides, offs_d, d_ok, s_lo, s_hi, qk_scale2,
                            scale, BLOCK_N, False,
                        )
                        dq += tl.where(mine, dq_s, 0.0)
        dq = dq * scale
        if SPLITS == 1:
            tl.store(_ptrs(DQ, row, head, sdq_t, sdq_h, offs_d), dq.to(DQ.dtype.element_ty), mask=rows_ok)
        else:
            at = split * total_q + row
            tl.store(_ptrs(PART_DQ, at, head, heads_q * HEAD_DIM, HEAD_DIM, offs_d), dq, mask=rows_ok)


@triton.jit
def decode_bwd_merge_kernel(
    DQ, PART_DQ, q_offsets, kv_offsets, strides, sizes, mask,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SEQS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    """Program (pack, kv head): dQ of its rows, the sum of its splits' shares (in split order)."""
    sdq_t, sdq_h = strides
    _, total_q, heads_q = sizes
    _, row, head, parts, offs_d, keep = _merge_rows(
        q_offsets, kv_offsets, sizes, mask, GROUP, HEAD_DIM, ROWS, SEQS, BLOCK_M, BLOCK_N, BLOCK_D, SPLITS,
        BOUNDED_LEFT, BOUNDED_RIGHT,
    )
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for s in range(0, parts):
        dq += tl.load(_ptrs(PART_DQ, s * total_q + row, head, heads_q * HEAD_DIM, HEAD_DIM, offs_d), mask=keep, other=0.0)
    tl.store(_ptrs(DQ, row, head, sdq_t, sdq_h, offs_d), dq.to(DQ.dtype.element_ty), mask=keep)


def backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, *, max_seqlen_q: int, max_seqlen_kv: int, left: int,
    right: int, scale: float, backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (the dtypes of q, k, v) of a jagged attention by the decode kernels, at the
    forward's ``out [Tq, Hq, D]`` and natural-log ``lse [Hq, Tq]`` (those :func:`forward` gives,
    or any forward's of the same attention). Arguments as :func:`forward`'s; the programs are
    its programs (``jagflash.core.tuning.decode_config``). Launches: one, or two where the keys
    are split (the dQ shares' sum); grids from host ints only (no sync). Deterministic."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))
    total_q, heads_q, head_dim = q.shape
    dq, dk, dv = alloc_like(q), alloc_like(k), alloc_like(v)
    if total_q == 0:  # no row: every key's gradient is zero
        return dq.to(dtypes[0]), dk.zero_().to(dtypes[1]), dv.zero_().to(dtypes[2])
    cfg, consts, packs, sizes = _launch(
        q, k, q_offsets, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, left=left, right=right,
        backend=backend, backward=True,
    )
    heads_kv = k.shape[1]
    part = alloc((cfg.SPLITS, total_q, heads_q, head_dim), torch.float32, q.device) if cfg.SPLITS > 1 else dq
    strides = tuple((t.stride(0), t.stride(1)) for t in (q, k, v, out, dout, dq, dk, dv))
    decode_bwd_kernel[(packs, heads_kv, cfg.SPLITS)](
        q, k, v, out, dout, lse, dq, dk, dv, part, q_offsets, kv_offsets, strides, sizes, (scale, left, right), **consts
    )
    if cfg.SPLITS > 1:
        decode_bwd_merge_kernel[(packs, heads_kv)](
            dq, part, q_offsets, kv_offsets, strides[5], sizes, (left, right), **consts
        )
    return dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])
