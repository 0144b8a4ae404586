"""Broadcast-Q attention in stock Triton: one shared ``q [Lq, Hq, D]`` against every K/V
sequence, each program running one tile program of ``jagflash.core.portable``.

Every program reads the same Q (row stride ``q.stride(0)``, no per-sequence offset); sequence
``b`` only decides where K/V start (from ``kv_offsets``) and which ``out[b]``, ``lse[b]``,
``dout[b]`` the program touches.

Grids (a plain grid until ``core.schedule`` provides a Plan):

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

from jagflash.core.ops import alloc, alloc_like, for_kernel
from jagflash.core.portable import (
    atomic_add_rows,
    attn_bwd_dkdv_tile,
    attn_bwd_dq_acc,
    attn_fwd_tile,
    locate_sequence,
)
from jagflash.core.seqlen import store_rows
from jagflash.core.tuning import block_config, kernel_flags, launch_options


@triton.jit
def _fwd_kernel(
    Q, K, V, O, LSE, kv_offsets,
    stride_qm, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ob, stride_om, stride_oh,
    lq, n_heads_q, scale, left, right,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)  # = b * Hq + h, also the row of LSE [B, Hq, Lq]
    m0 = tl.program_id(1) * BLOCK_M
    b = bh // n_heads_q
    h = bh % n_heads_q
    k_start, lk = locate_sequence(kv_offsets, b)
    hk = h // GROUP
    attn_fwd_tile(
        Q + h * stride_qh,
        K + k_start * stride_kt + hk * stride_kh,
        V + k_start * stride_vt + hk * stride_vh,
        O + b * stride_ob + h * stride_oh,
        LSE + bh * lq,
        stride_qm, stride_kt, stride_vt, stride_om,
        m0, lq, lk, scale, left, right,
        HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
    )


@triton.jit
def _dq_atomic_kernel(
    Q, K, V, O, DO, DQ, LSE, DELTA, kv_offsets,
    stride_qm, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ob, stride_om, stride_oh, stride_dob, stride_dom, stride_doh, stride_dqm, stride_dqh,
    lq, n_heads_q, scale, left, right,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    m0 = tl.program_id(1) * BLOCK_M
    b = bh // n_heads_q
    h = bh % n_heads_q
    k_start, lk = locate_sequence(kv_offsets, b)
    if lk == 0:
        return  # adds nothing to dQ, and the dK/dV pass has no tile to read its delta
    hk = h // GROUP
    dq = attn_bwd_dq_acc(
        Q + h * stride_qh,
        K + k_start * stride_kt + hk * stride_kh,
        V + k_start * stride_vt + hk * stride_vh,
        O + b * stride_ob + h * stride_oh,
        DO + b * stride_dob + h * stride_doh,
        LSE + bh * lq, DELTA + bh * lq,
        stride_qm, stride_kt, stride_vt, stride_om, stride_dom,
        m0, lq, lk, scale, left, right,
        HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
    )
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = DQ + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :]
    atomic_add_rows(ptrs, dq * scale, offs_m, lq, offs_d, HEAD_DIM, BLOCK_D == HEAD_DIM)


@triton.jit
def _dq_ordered_kernel(
    Q, K, V, O, DO, DQ, LSE, DELTA, kv_offsets,
    stride_qm, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ob, stride_om, stride_oh, stride_dob, stride_dom, stride_doh, stride_dqm, stride_dqh,
    n_seqs, lq, n_heads_q, scale, left, right,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    """Deterministic dQ: one program per (q head, q-tile) sums the sequences b = 0, 1, ... in
    order in registers, then stores once."""
    h = tl.program_id(0).to(tl.int64)
    m0 = tl.program_id(1) * BLOCK_M
    hk = h // GROUP
    # Per-sequence bases advance by pointer increments: no b * stride product to overflow.
    o_b = O + h * stride_oh
    do_b = DO + h * stride_doh
    lse_b = LSE + h * lq
    delta_b = DELTA + h * lq
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for b in range(0, n_seqs):
        k_start, lk = locate_sequence(kv_offsets, b)
        dq += attn_bwd_dq_acc(
            Q + h * stride_qh,
            K + k_start * stride_kt + hk * stride_kh,
            V + k_start * stride_vt + hk * stride_vh,
            o_b, do_b, lse_b, delta_b,
            stride_qm, stride_kt, stride_vt, stride_om, stride_dom,
            m0, lq, lk, scale, left, right,
            HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
        )
        o_b += stride_ob
        do_b += stride_dob
        lse_b += n_heads_q * lq
        delta_b += n_heads_q * lq
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = DQ + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :]
    store_rows(ptrs, (dq * scale).to(DQ.dtype.element_ty), offs_m, lq, offs_d, HEAD_DIM, BLOCK_D == HEAD_DIM)


@triton.jit
def _dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA, kv_offsets,
    stride_qm, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_dob, stride_dom, stride_doh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    lq, n_heads_q, n_heads_kv, scale, left, right,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    n0 = tl.program_id(1) * BLOCK_N
    b = bh // n_heads_kv
    hk = bh % n_heads_kv
    k_start, lk = locate_sequence(kv_offsets, b)
    if n0 >= lk:
        return
    h = hk * GROUP
    row = (b * n_heads_q + h) * lq
    attn_bwd_dkdv_tile(
        Q + h * stride_qh,
        K + k_start * stride_kt + hk * stride_kh,
        V + k_start * stride_vt + hk * stride_vh,
        DO + b * stride_dob + h * stride_doh,
        DK + k_start * stride_dkt + hk * stride_dkh,
        DV + k_start * stride_dvt + hk * stride_dvh,
        LSE + row, DELTA + row,
        stride_qm, stride_qh, stride_kt, stride_vt, stride_dom, stride_doh, stride_dkt, stride_dvt,
        lq, n0, lq, lk, scale, left, right,
        GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
    )


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    left: int,
    right: int,
    scale: float,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """O ``[B, Lq, Hq, D]`` (q's dtype) and LSE ``[B, Hq, Lq]`` fp32."""
    dtype = q.dtype
    q, k, v = (for_kernel(t, backend) for t in (q, k, v))
    lq, hq, dim = q.shape
    hkv = k.shape[1]
    batch = kv_offsets.numel() - 1
    out = alloc((batch, lq, hq, dim), q.dtype, q.device)
    lse = alloc((batch, hq, lq), torch.float32, q.device)
    cfg = block_config(backend, dim, "fwd")
    grid = (batch * hq, triton.cdiv(lq, cfg["BLOCK_M"]))
    if grid[0] > 0 and grid[1] > 0:
        _fwd_kernel[grid](
            q, k, v, out, lse, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), out.stride(2),
            lq, hq, scale, left, right,
            **kernel_flags(hq, hkv, dim, left, right),
            **launch_options(cfg),
        )
    return out.to(dtype), lse


def backward_dq(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    left: int,
    right: int,
    scale: float,
    deterministic: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dQ pass: dQ ``[Lq, Hq, D]`` summed over the sequences (fp32 with atomics, else the
    kernel dtype) and delta = rowsum(dO * O) ``[B, Hq, Lq]`` fp32, which the dK/dV pass
    (portable or TLX) reads. Bitwise repeatable when ``deterministic``."""
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))
    lse = lse.contiguous()
    lq, hq, dim = q.shape
    batch = kv_offsets.numel() - 1
    delta = alloc_like(lse)
    flags = kernel_flags(hq, k.shape[1], dim, left, right)
    cfg = block_config(backend, dim, "dq")
    common = (
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), out.stride(2), dout.stride(0), dout.stride(1), dout.stride(2),
    )
    if deterministic:
        # Every element is written once by its (head, q-tile) program: no zero fill needed.
        dq = alloc_like(q)
        grid = (hq, triton.cdiv(lq, cfg["BLOCK_M"]))
        if grid[0] > 0 and grid[1] > 0:
            _dq_ordered_kernel[grid](
                q, k, v, out, dout, dq, lse, delta, kv_offsets, *common, dq.stride(0), dq.stride(1),
                batch, lq, hq, scale, left, right, **flags, **launch_options(cfg),
            )
    else:
        # The atomics add into zeros: a sequence of length 0 adds nothing, and B = 0 gives 0.
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        grid = (batch * hq, triton.cdiv(lq, cfg["BLOCK_M"]))
        if grid[0] > 0 and grid[1] > 0:
            _dq_atomic_kernel[grid](
                q, k, v, out, dout, dq, lse, delta, kv_offsets, *common, dq.stride(0), dq.stride(1),
                lq, hq, scale, left, right, **flags, **launch_options(cfg),
            )
    return dq, delta


def backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seqlen_kv: int,
    *,
    left: int,
    right: int,
    scale: float,
    deterministic: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ ``[Lq, Hq, D]`` (the sum over sequences), dK, dV ``[Tk, Hkv, D]``, in the inputs'
    dtypes. dK/dV are deterministic; dQ is when ``deterministic``."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))  # once, for both passes
    lse = lse.contiguous()
    dq, delta = backward_dq(
        dout, q, k, v, out, lse, kv_offsets, left=left, right=right, scale=scale,
        deterministic=deterministic, backend=backend,
    )
    lq, hq, dim = q.shape
    hkv = k.shape[1]
    batch = kv_offsets.numel() - 1
    dk, dv = alloc_like(k), alloc_like(v)
    cfg = block_config(backend, dim, "dkdv")
    grid = (batch * hkv, triton.cdiv(max_seqlen_kv, cfg["BLOCK_N"]))
    if grid[0] > 0 and grid[1] > 0:
        _dkdv_kernel[grid](
            q, k, v, dout, dk, dv, lse, delta, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dout.stride(0), dout.stride(1), dout.stride(2),
            dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            lq, hq, hkv, scale, left, right, **kernel_flags(hq, hkv, dim, left, right), **launch_options(cfg),
        )
    return dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])
