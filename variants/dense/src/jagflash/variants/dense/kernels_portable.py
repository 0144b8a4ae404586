"""Dense attention in stock Triton: each program finds its rows from the batch index and runs
one tile program of ``jagflash.core.portable`` (the same main loops as the jagged variant).

Grids: forward and dQ run one program per (batch, q head) x q-tile, dK/dV one per
(batch, kv head) x kv-tile.
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
def _fwd_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_ob, stride_on, stride_oh,
    lq, lk, n_heads_q, scale, left, right,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    m0 = tl.program_id(1) * BLOCK_M
    b = bh // n_heads_q
    h = bh % n_heads_q
    hk = h // GROUP
    attn_fwd_tile(
        Q + b * stride_qb + h * stride_qh,
        K + b * stride_kb + hk * stride_kh,
        V + b * stride_vb + hk * stride_vh,
        O + b * stride_ob + h * stride_oh,
        LSE + bh * lq,
        stride_qn, stride_kn, stride_vn, stride_on,
        m0, lq, lk, scale, left, right,
        HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
    )


@triton.jit
def _dq_kernel(
    Q, K, V, O, DO, DQ, LSE, DELTA,
    stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_ob, stride_on, stride_oh,
    stride_dob, stride_don, stride_doh, stride_dqb, stride_dqn, stride_dqh,
    lq, lk, n_heads_q, scale, left, right,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    m0 = tl.program_id(1) * BLOCK_M
    b = bh // n_heads_q
    h = bh % n_heads_q
    hk = h // GROUP
    attn_bwd_dq_tile(
        Q + b * stride_qb + h * stride_qh,
        K + b * stride_kb + hk * stride_kh,
        V + b * stride_vb + hk * stride_vh,
        O + b * stride_ob + h * stride_oh,
        DO + b * stride_dob + h * stride_doh,
        DQ + b * stride_dqb + h * stride_dqh,
        LSE + bh * lq, DELTA + bh * lq,
        stride_qn, stride_kn, stride_vn, stride_on, stride_don, stride_dqn,
        m0, lq, lk, scale, left, right,
        HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
    )


@triton.jit
def _dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA,
    stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_dob, stride_don, stride_doh,
    stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
    lq, lk, n_heads_kv, scale, left, right,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    n0 = tl.program_id(1) * BLOCK_N
    b = bh // n_heads_kv
    hk = bh % n_heads_kv
    h = hk * GROUP
    lse_row = (b * n_heads_kv * GROUP + h) * lq
    attn_bwd_dkdv_tile(
        Q + b * stride_qb + h * stride_qh,
        K + b * stride_kb + hk * stride_kh,
        V + b * stride_vb + hk * stride_vh,
        DO + b * stride_dob + h * stride_doh,
        DK + b * stride_dkb + hk * stride_dkh,
        DV + b * stride_dvb + hk * stride_dvh,
        LSE + lse_row, DELTA + lse_row,
        stride_qn, stride_qh, stride_kn, stride_vn, stride_don, stride_doh, stride_dkn, stride_dvn,
        lq, n0, lq, lk, scale, left, right,
        GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
    )


def _strides(*ts: torch.Tensor) -> list[int]:
    return [s for t in ts for s in t.stride()[:3]]


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, left: int, right: int, scale: float, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """O ``[B, Nq, Hq, D]`` (q's dtype) and LSE ``[B, Hq, Nq]`` fp32."""
    dtype = q.dtype
    q, k, v = (for_kernel(t, backend) for t in (q, k, v))
    batch, lq, hq, dim = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    out = alloc_like(q)
    lse = alloc((batch, hq, lq), torch.float32, q.device)
    cfg = block_config(backend, dim, "fwd")
    grid = (batch * hq, triton.cdiv(lq, cfg["BLOCK_M"]))
    if grid[0] > 0 and grid[1] > 0:
        _fwd_kernel[grid](
            q, k, v, out, lse, *_strides(q, k, v, out), lq, lk, hq, scale, left, right,
            GROUP=hq // hkv, HEAD_DIM=dim, BOUNDED_LEFT=left >= 0, BOUNDED_RIGHT=right >= 0,
            **launch_options(cfg),
        )
    return out.to(dtype), lse


def backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, *, left: int, right: int, scale: float, backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV in the inputs' dtypes. Deterministic: no atomics anywhere."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))
    batch, lq, hq, dim = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    dq, dk, dv, delta = (alloc_like(t) for t in (q, k, v, lse))
    flags = {"GROUP": hq // hkv, "HEAD_DIM": dim, "BOUNDED_LEFT": left >= 0, "BOUNDED_RIGHT": right >= 0}
    cfg = block_config(backend, dim, "dq")
    grid = (batch * hq, triton.cdiv(lq, cfg["BLOCK_M"]))
    if grid[0] > 0 and grid[1] > 0:
        _dq_kernel[grid](
            q, k, v, out, dout, dq, lse, delta, *_strides(q, k, v, out, dout, dq),
            lq, lk, hq, scale, left, right, **flags, **launch_options(cfg),
        )
    cfg = block_config(backend, dim, "dkdv")
    grid = (batch * hkv, triton.cdiv(lk, cfg["BLOCK_N"]))
    if grid[0] > 0 and grid[1] > 0:
        _dkdv_kernel[grid](
            q, k, v, dout, dk, dv, lse, delta, *_strides(q, k, v, dout, dk, dv),
            lq, lk, hkv, scale, left, right, **flags, **launch_options(cfg),
        )
    return dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])
