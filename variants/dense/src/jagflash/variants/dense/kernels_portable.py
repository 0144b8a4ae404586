"""Dense attention in stock Triton: persistent kernels that walk a Plan's tile table
(``jagflash.core.plan``; a dense batch is a jagged one of equal lengths) and run one tile
program of ``jagflash.core.portable`` per tile (the same main loops as the jagged variant).

Forward and dQ tiles are (batch, q head, q-tile), dK/dV tiles (batch, kv head, kv-tile). With
a causal mask the tiles' costs differ, and the static and dynamic schedules hand the longest out
first; without one every tile costs the same and the schedule only sets the launch shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jagflash.core.ops import alloc, alloc_like, for_kernel
from jagflash.core.plan.model import Plan
from jagflash.core.portable import (
    attn_bwd_dkdv_tile,
    attn_bwd_dq_tile,
    attn_fwd_tile,
    plan_next,
    plan_tile,
    sched_first,
)
from jagflash.core.tile_scheduler import launch
from jagflash.core.tuning import block_config, kernel_flags, launch_options


@triton.jit(do_not_specialize=["n_workers"])
def _fwd_kernel(
    Q, K, V, O, LSE, TILES, COUNT, COUNTER,
    stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_ob, stride_on, stride_oh,
    lq, lk, n_heads_q, scale, left, right, n_workers,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr,
):
    pid = tl.program_id(0)
    count = tl.load(COUNT).to(tl.int32)
    i, r = sched_first(pid, COUNTER, DYNAMIC)
    b, h, m0 = plan_tile(TILES, i, count)
    while i < count:
        i_n, b_n, h_n, m0_n, r = plan_next(i, r, pid, n_workers, TILES, count, COUNTER, DYNAMIC, ZIGZAG)
        bb = b.to(tl.int64)
        hk = h // GROUP
        attn_fwd_tile(
            Q + bb * stride_qb + h * stride_qh,
            K + bb * stride_kb + hk * stride_kh,
            V + bb * stride_vb + hk * stride_vh,
            O + bb * stride_ob + h * stride_oh,
            LSE + (bb * n_heads_q + h) * lq,
            stride_qn, stride_kn, stride_vn, stride_on,
            m0, lq, lk, scale, left, right,
            HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
        )
        i, b, h, m0 = i_n, b_n, h_n, m0_n


@triton.jit(do_not_specialize=["n_workers"])
def _dq_kernel(
    Q, K, V, O, DO, DQ, LSE, DELTA, TILES, COUNT, COUNTER,
    stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_ob, stride_on, stride_oh,
    stride_dob, stride_don, stride_doh, stride_dqb, stride_dqn, stride_dqh,
    lq, lk, n_heads_q, scale, left, right, n_workers,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr,
):
    pid = tl.program_id(0)
    count = tl.load(COUNT).to(tl.int32)
    i, r = sched_first(pid, COUNTER, DYNAMIC)
    b, h, m0 = plan_tile(TILES, i, count)
    while i < count:
        i_n, b_n, h_n, m0_n, r = plan_next(i, r, pid, n_workers, TILES, count, COUNTER, DYNAMIC, ZIGZAG)
        bb = b.to(tl.int64)
        hk = h // GROUP
        row = (bb * n_heads_q + h) * lq
        attn_bwd_dq_tile(
            Q + bb * stride_qb + h * stride_qh,
            K + bb * stride_kb + hk * stride_kh,
            V + bb * stride_vb + hk * stride_vh,
            O + bb * stride_ob + h * stride_oh,
            DO + bb * stride_dob + h * stride_doh,
            DQ + bb * stride_dqb + h * stride_dqh,
            LSE + row, DELTA + row,
            stride_qn, stride_kn, stride_vn, stride_on, stride_don, stride_dqn,
            m0, lq, lk, scale, left, right,
            HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
        )
        i, b, h, m0 = i_n, b_n, h_n, m0_n


@triton.jit(do_not_specialize=["n_workers"])
def _dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA, TILES, COUNT, COUNTER,
    stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh, stride_dob, stride_don, stride_doh,
    stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
    lq, lk, n_heads_kv, scale, left, right, n_workers,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr,
):
    pid = tl.program_id(0)
    count = tl.load(COUNT).to(tl.int32)
    i, r = sched_first(pid, COUNTER, DYNAMIC)
    b, hk, n0 = plan_tile(TILES, i, count)
    while i < count:
        i_n, b_n, h_n, n0_n, r = plan_next(i, r, pid, n_workers, TILES, count, COUNTER, DYNAMIC, ZIGZAG)
        bb = b.to(tl.int64)
        h = hk * GROUP
        lse_row = (bb * n_heads_kv * GROUP + h) * lq
        attn_bwd_dkdv_tile(
            Q + bb * stride_qb + h * stride_qh,
            K + bb * stride_kb + hk * stride_kh,
            V + bb * stride_vb + hk * stride_vh,
            DO + bb * stride_dob + h * stride_doh,
            DK + bb * stride_dkb + hk * stride_dkh,
            DV + bb * stride_dvb + hk * stride_dvh,
            LSE + lse_row, DELTA + lse_row,
            stride_qn, stride_qh, stride_kn, stride_vn, stride_don, stride_doh, stride_dkn, stride_dvn,
            lq, n0, lq, lk, scale, left, right,
            GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT,
        )
        i, b, hk, n0 = i_n, b_n, h_n, n0_n


def _strides(*ts: torch.Tensor) -> list[int]:
    return [s for t in ts for s in t.stride()[:3]]


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan, *, left: int, right: int,
    scale: float, backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """O ``[B, Nq, Hq, D]`` (q's dtype) and LSE ``[B, Hq, Nq]`` fp32."""
    dtype = q.dtype
    q, k, v = (for_kernel(t, backend) for t in (q, k, v))
    batch, lq, hq, dim = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    out = alloc_like(q)
    lse = alloc((batch, hq, lq), torch.float32, q.device)
    launch(
        _fwd_kernel, plan, "fwd", (q, k, v, out, lse),
        (*_strides(q, k, v, out), lq, lk, hq, scale, left, right),
        **kernel_flags(hq, hkv, dim, left, right),
        **launch_options(block_config(backend, dim, "fwd")),
    )
    return out.to(dtype), lse


def backward_dq(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, plan: Plan, *, left: int, right: int, scale: float, backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dQ pass: dQ (fp32 under the interpreter, else q's dtype) and delta = rowsum(dO * O)
    ``[B, Hq, Nq]`` fp32, which the dK/dV pass (portable or TLX) reads."""
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))
    _, lq, hq, dim = q.shape
    dq, delta = alloc_like(q), alloc_like(lse)
    launch(
        _dq_kernel, plan, "dq", (q, k, v, out, dout, dq, lse, delta),
        (*_strides(q, k, v, out, dout, dq), lq, k.shape[1], hq, scale, left, right),
        **kernel_flags(hq, k.shape[2], dim, left, right), **launch_options(block_config(backend, dim, "dq")),
    )
    return dq, delta


def backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, plan: Plan, *, left: int, right: int, scale: float, backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV in the inputs' dtypes. Deterministic: no atomics on data."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))  # once, for both passes
    dq, delta = backward_dq(dout, q, k, v, out, lse, plan, left=left, right=right, scale=scale, backend=backend)
    _, lq, hq, dim = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    dk, dv = alloc_like(k), alloc_like(v)
    launch(
        _dkdv_kernel, plan, "dkdv", (q, k, v, dout, dk, dv, lse, delta),
        (*_strides(q, k, v, dout, dk, dv), lq, lk, hkv, scale, left, right),
        **kernel_flags(hq, hkv, dim, left, right), **launch_options(block_config(backend, dim, "dkdv")),
    )
    return dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])
