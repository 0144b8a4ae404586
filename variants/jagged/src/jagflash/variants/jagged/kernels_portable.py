"""Jagged attention in stock Triton: each program finds its sequence from the offsets and runs
one tile program of ``jagflash.core.portable``.

Grids: forward and dQ run one program per (sequence, q head) x q-tile, dK/dV one per
(sequence, kv head) x kv-tile; tiles past a sequence's end return at once. The tile count comes
from ``max_seqlen``, so no grid depends on a value that lives on the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jagflash.core.ops import alloc, alloc_like, for_kernel
from jagflash.core.portable import (
    attn_bwd_dkdv_tile,
    attn_bwd_dq_tile,
    attn_fwd_tile,
    block_config,
    launch_options,
)


@triton.jit
def _locate(offsets, b):
    start = tl.load(offsets + b).to(tl.int64)
    length = (tl.load(offsets + b + 1) - start).to(tl.int32)
    return start, length


@triton.jit
def _fwd_kernel(
    Q, K, V, O, LSE, q_offsets, kv_offsets,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    total_q, n_heads_q, scale, left, right,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    bh = tl.program_id(0)
    m0 = tl.program_id(1) * BLOCK_M
    b = bh // n_heads_q
    h = bh % n_heads_q
    q_start, lq = _locate(q_offsets, b)
    if m0 >= lq:
        return
    k_start, lk = _locate(kv_offsets, b)
    hk = h // GROUP
    attn_fwd_tile(
        Q + q_start * stride_qt + h * stride_qh,
        K + k_start * stride_kt + hk * stride_kh,
        V + k_start * stride_vt + hk * stride_vh,
        O + q_start * stride_ot + h * stride_oh,
        LSE + h.to(tl.int64) * total_q + q_start,
        stride_qt, stride_kt, stride_vt, stride_ot,
        m0, lq, lk, scale, left, right,
        HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
    )


@triton.jit
def _dq_kernel(
    Q, K, V, O, DO, DQ, LSE, DELTA, q_offsets, kv_offsets,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_dot, stride_doh, stride_dqt, stride_dqh,
    total_q, n_heads_q, scale, left, right,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    bh = tl.program_id(0)
    m0 = tl.program_id(1) * BLOCK_M
    b = bh // n_heads_q
    h = bh % n_heads_q
    q_start, lq = _locate(q_offsets, b)
    if m0 >= lq:
        return
    k_start, lk = _locate(kv_offsets, b)
    hk = h // GROUP
    row = h.to(tl.int64) * total_q + q_start
    attn_bwd_dq_tile(
        Q + q_start * stride_qt + h * stride_qh,
        K + k_start * stride_kt + hk * stride_kh,
        V + k_start * stride_vt + hk * stride_vh,
        O + q_start * stride_ot + h * stride_oh,
        DO + q_start * stride_dot + h * stride_doh,
        DQ + q_start * stride_dqt + h * stride_dqh,
        LSE + row, DELTA + row,
        stride_qt, stride_kt, stride_vt, stride_ot, stride_dot, stride_dqt,
        m0, lq, lk, scale, left, right,
        HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
    )


@triton.jit
def _dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA, q_offsets, kv_offsets,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    total_q, n_heads_kv, scale, left, right,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    bh = tl.program_id(0)
    n0 = tl.program_id(1) * BLOCK_N
    b = bh // n_heads_kv
    hk = bh % n_heads_kv
    k_start, lk = _locate(kv_offsets, b)
    if n0 >= lk:
        return
    q_start, lq = _locate(q_offsets, b)
    h = hk * GROUP
    attn_bwd_dkdv_tile(
        Q + q_start * stride_qt + h * stride_qh,
        K + k_start * stride_kt + hk * stride_kh,
        V + k_start * stride_vt + hk * stride_vh,
        DO + q_start * stride_dot + h * stride_doh,
        DK + k_start * stride_dkt + hk * stride_dkh,
        DV + k_start * stride_dvt + hk * stride_dvh,
        LSE + h.to(tl.int64) * total_q + q_start,
        DELTA + h.to(tl.int64) * total_q + q_start,
        stride_qt, stride_qh, stride_kt, stride_vt, stride_dot, stride_doh, stride_dkt, stride_dvt,
        total_q, n0, lq, lk, scale, left, right,
        GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
    )


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
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """O ``[Tq, Hq, D]`` (q's dtype) and LSE ``[Hq, Tq]`` fp32."""
    dtype = q.dtype
    q, k, v = (for_kernel(t, backend) for t in (q, k, v))
    tq, hq, dim = q.shape
    hkv = k.shape[1]
    out = alloc_like(q)
    lse = alloc((hq, tq), torch.float32, q.device)
    cfg = block_config(backend, dim, "fwd")
    batch = q_offsets.numel() - 1
    grid = (batch * hq, triton.cdiv(max_seqlen_q, cfg["BLOCK_M"]))
    if grid[0] > 0 and grid[1] > 0:
        _fwd_kernel[grid](
            q, k, v, out, lse, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1),
            tq, hq, scale, left, right,
            GROUP=hq // hkv, HEAD_DIM=dim, BOUNDED_LEFT=left >= 0, BOUNDED_RIGHT=right >= 0,
            **launch_options(cfg),
        )
    return out.to(dtype), lse


def backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    *,
    left: int,
    right: int,
    scale: float,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV in the inputs' dtypes. Deterministic: no atomics anywhere."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))
    tq, hq, dim = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    dq, dk, dv, delta = (alloc_like(t) for t in (q, k, v, lse))
    batch = q_offsets.numel() - 1
    flags = {"GROUP": group, "HEAD_DIM": dim, "BOUNDED_LEFT": left >= 0, "BOUNDED_RIGHT": right >= 0}
    cfg = block_config(backend, dim, "dq")
    grid = (batch * hq, triton.cdiv(max_seqlen_q, cfg["BLOCK_M"]))
    if grid[0] > 0 and grid[1] > 0:
        _dq_kernel[grid](
            q, k, v, out, dout, dq, lse, delta, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), dout.stride(0), dout.stride(1), dq.stride(0), dq.stride(1),
            tq, hq, scale, left, right, **flags, **launch_options(cfg),
        )
    cfg = block_config(backend, dim, "dkdv")
    grid = (batch * hkv, triton.cdiv(max_seqlen_kv, cfg["BLOCK_N"]))
    if grid[0] > 0 and grid[1] > 0:
        _dkdv_kernel[grid](
            q, k, v, dout, dk, dv, lse, delta, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dout.stride(0), dout.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            tq, hkv, scale, left, right, **flags, **launch_options(cfg),
        )
    return dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])
