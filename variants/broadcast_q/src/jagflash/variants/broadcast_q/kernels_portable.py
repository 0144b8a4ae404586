"""Broadcast-Q attention in stock Triton: one shared ``q [Lq, Hq, D]`` against every K/V
sequence, each program running one tile program of ``jagflash.core.portable``.

Every program reads the same Q (row stride ``q.stride(0)``, no per-sequence offset); sequence
``b`` only decides where K/V start (from ``kv_offsets``) and which ``out[b]``, ``lse[b]``,
``dout[b]`` the program touches.

Grids:

- forward: (sequence, q head) x q-tile; a tile's cost grows with its sequence's K/V length. A
  zero-length sequence runs no kv iteration and writes output 0, LSE -inf.
- dQ: (sequence, q head) x q-tile, each adding its sequence's share of dQ into one fp32 buffer
  with atomics (dQ is never materialised per sequence); or, with ``deterministic``, one program
  per (q head, q-tile) summing the sequences in order in registers, no atomics. Either pass
  also stores delta = rowsum(dO * O) for the dK/dV pass, so it runs first.
- dK/dV: (sequence, kv head) x kv-tile, dK/dV in registers, the inner loop over all of Q and
  the GROUP query heads of the kv head. The tile count comes from ``max_seqlen_kv``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jagflash.core.jagged import cdiv
from jagflash.core.ops import alloc, alloc_like, for_kernel
from jagflash.core.portable.mainloop import (
    atomic_add_rows,
    dkdv_program,
    dq_acc_program,
    fwd_program,
    locate_sequence,
)
from jagflash.core.portable.persistent import config, row_strides
from jagflash.core.seqlen import row_ptrs, store_rows


@triton.jit
def _sequence(kv_offsets, b, lq, n_heads_q):
    """The record (``portable.mainloop``) of K/V sequence ``b``: output rows, dO and LSE
    ``[B, Hq, Lq]`` of ``b``; Q is shared (its sequence stride is 0)."""
    k_start, lk = locate_sequence(kv_offsets, b)
    return b, lq, k_start, lk, b * n_heads_q * lq, lq


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, kv_offsets, strides, sizes, mask, CFG: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)  # = b * Hq + h, also the row of LSE [B, Hq, Lq]
    BLOCK_M: tl.constexpr = CFG[2]
    lq, n_heads_q = sizes[0], sizes[1]
    seq = _sequence(kv_offsets, bh // n_heads_q, lq, n_heads_q)
    fwd_program((Q, K, V, O, LSE), strides, seq, bh % n_heads_q, tl.program_id(1) * BLOCK_M, mask, CFG)


@triton.jit
def _dq_atomic_kernel(Q, K, V, O, DO, DQ, LSE, DELTA, kv_offsets, strides, sizes, mask, CFG: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    HEAD_DIM: tl.constexpr = CFG[1]
    BLOCK_M: tl.constexpr = CFG[2]
    BLOCK_D: tl.constexpr = CFG[4]
    m0 = tl.program_id(1) * BLOCK_M
    lq, n_heads_q = sizes[0], sizes[1]
    h = bh % n_heads_q
    seq = _sequence(kv_offsets, bh // n_heads_q, lq, n_heads_q)
    if seq[3] == 0:
        return  # adds nothing to dQ, and the dK/dV pass has no tile to read its delta
    dq = dq_acc_program((Q, K, V, O, DO, LSE, DELTA), strides, seq, h, m0, mask, CFG)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = row_ptrs(DQ + h * strides[5][2], m0, offs_m, strides[5][1], offs_d)
    atomic_add_rows(ptrs, dq * mask[0], offs_m, lq, offs_d, HEAD_DIM, BLOCK_D == HEAD_DIM)


@triton.jit
def _dq_ordered_kernel(Q, K, V, O, DO, DQ, LSE, DELTA, kv_offsets, strides, sizes, mask, CFG: tl.constexpr):
    """Deterministic dQ: one program per (q head, q-tile) sums the sequences b = 0, 1, ... in
    order in registers, then stores once."""
    h = tl.program_id(0).to(tl.int64)
    HEAD_DIM: tl.constexpr = CFG[1]
    BLOCK_M: tl.constexpr = CFG[2]
    BLOCK_D: tl.constexpr = CFG[4]
    m0 = tl.program_id(1) * BLOCK_M
    lq, n_heads_q, n_seqs = sizes[0], sizes[1], sizes[3]
    # Per-sequence bases advance by pointer increments: no b * stride product to overflow
    # (the record's q and LSE positions are 0; the bases carry sequence b's offsets).
    o_b, do_b, lse_b, delta_b = O, DO, LSE, DELTA
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for b in range(0, n_seqs):
        k_start, lk = locate_sequence(kv_offsets, b)
        dq += dq_acc_program((Q, K, V, o_b, do_b, lse_b, delta_b), strides, (0, lq, k_start, lk, 0, lq), h, m0, mask, CFG)
        o_b += strides[3][0]
        do_b += strides[4][0]
        lse_b += n_heads_q * lq
        delta_b += n_heads_q * lq
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = row_ptrs(DQ + h * strides[5][2], m0, offs_m, strides[5][1], offs_d)
    store_rows(ptrs, (dq * mask[0]).to(DQ.dtype.element_ty), offs_m, lq, offs_d, HEAD_DIM, BLOCK_D == HEAD_DIM)


@triton.jit
def _dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA, kv_offsets, strides, sizes, mask, CFG: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    BLOCK_N: tl.constexpr = CFG[3]
    n0 = tl.program_id(1) * BLOCK_N
    lq, n_heads_q, n_heads_kv = sizes[0], sizes[1], sizes[2]
    seq = _sequence(kv_offsets, bh // n_heads_kv, lq, n_heads_q)
    if n0 >= seq[3]:
        return
    dkdv_program((Q, K, V, DO, DK, DV, LSE, DELTA), strides, seq, bh % n_heads_kv, n0, mask, CFG)


def _strides(q: torch.Tensor, *ts: torch.Tensor) -> tuple[tuple[int, int, int], ...]:
    """The programs' strides: the shared q's sequence stride is 0."""
    return ((0, q.stride(0), q.stride(1)), *row_strides(*ts))


def _sizes(q: torch.Tensor, k: torch.Tensor, kv_offsets: torch.Tensor) -> tuple[int, int, int, int]:
    return q.shape[0], q.shape[1], k.shape[1], kv_offsets.numel() - 1


def _run(kernel, pass_, programs, rows, tensors, strides, q, k, kv_offsets, *, left, right, scale, backend) -> None:
    """Launch ``kernel`` on the grid (``programs``, tiles of the pass over ``rows``); an empty
    grid launches nothing."""
    opts = config(backend, pass_, q, k, left, right)
    grid = (programs, cdiv(rows, opts["CFG"][3 if pass_ == "dkdv" else 2]))
    if grid[0] > 0 and grid[1] > 0:
        kernel[grid](*tensors, kv_offsets, strides, _sizes(q, k, kv_offsets), (scale, left, right), **opts)


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_offsets: torch.Tensor, *, left: int,
    right: int, scale: float, backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """O ``[B, Lq, Hq, D]`` (q's dtype) and LSE ``[B, Hq, Lq]`` fp32."""
    dtype = q.dtype
    q, k, v = (for_kernel(t, backend) for t in (q, k, v))
    lq, hq, dim = q.shape
    batch = kv_offsets.numel() - 1
    out = alloc((batch, lq, hq, dim), q.dtype, q.device)
    lse = alloc((batch, hq, lq), torch.float32, q.device)
    _run(
        _fwd_kernel, "fwd", batch * hq, lq, (q, k, v, out, lse), _strides(q, k, v, out), q, k,
        kv_offsets, left=left, right=right, scale=scale, backend=backend,
    )
    return out.to(dtype), lse


def backward_dq(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, kv_offsets: torch.Tensor, *, left: int, right: int, scale: float,
    deterministic: bool, backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dQ pass: dQ ``[Lq, Hq, D]`` summed over the sequences (fp32 with atomics, else the
    kernel dtype) and delta = rowsum(dO * O) ``[B, Hq, Lq]`` fp32, which the dK/dV pass
    (portable or TLX) reads. Bitwise repeatable when ``deterministic``."""
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))
    lse = lse.contiguous()
    lq, hq, _ = q.shape
    delta = alloc_like(lse)
    if deterministic:
        # Every element is written once by its (head, q-tile) program: no zero fill needed.
        dq, kernel, programs = alloc_like(q), _dq_ordered_kernel, hq
    else:
        # The atomics add into zeros: a sequence of length 0 adds nothing, and B = 0 gives 0.
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kernel, programs = _dq_atomic_kernel, (kv_offsets.numel() - 1) * hq
    _run(
        kernel, "dq", programs, lq, (q, k, v, out, dout, dq, lse, delta), _strides(q, k, v, out, dout, dq),
        q, k, kv_offsets, left=left, right=right, scale=scale, backend=backend,
    )
    return dq, delta


def backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, kv_offsets: torch.Tensor, max_seqlen_kv: int, *, left: int, right: int,
    scale: float, deterministic: bool, backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ ``[Lq, Hq, D]`` (the sum over sequences), dK, dV ``[Tk, Hkv, D]``, in the inputs'
    dtypes. dK/dV are deterministic; dQ is when ``deterministic``."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))  # once, for both passes
    lse = lse.contiguous()
    common = {"left": left, "right": right, "scale": scale, "backend": backend}
    dq, delta = backward_dq(dout, q, k, v, out, lse, kv_offsets, deterministic=deterministic, **common)
    dk, dv = alloc_like(k), alloc_like(v)
    _run(
        _dkdv_kernel, "dkdv", (kv_offsets.numel() - 1) * k.shape[1], max_seqlen_kv,
        (q, k, v, dout, dk, dv, lse, delta), _strides(q, k, v, dout, dk, dv), q, k, kv_offsets, **common,
    )
    return dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])
