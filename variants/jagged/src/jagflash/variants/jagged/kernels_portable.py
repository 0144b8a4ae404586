"""Jagged attention in stock Triton: persistent kernels that walk a Plan's tile table
(``jagflash.core.plan``), find each tile's sequence from the offsets and run one tile program
of ``jagflash.core.portable``.

Each pass (forward, dQ, dK/dV) is one launch of W programs (static or dynamic schedule) or of
one program per table row (``schedule="none"``); the tile count is read on the device, so no
grid depends on a value that lives on the GPU. Forward and dQ tiles are (sequence, q head,
q-tile); dK/dV tiles are (sequence, kv head, kv-tile), summed over the GQA group in-program.

A worker resolves tiles two ahead of the one it runs: while tile ``i`` computes, the table row
of tile ``i + 2`` and the offsets of tile ``i + 1`` (whose row arrived during tile ``i - 1``) are
in flight, so no tile waits on the two dependent loads that locate it.
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
    locate_sequence,
    plan_next,
    plan_tile,
    sched_first,
)
from jagflash.core.tile_scheduler import launch
from jagflash.core.tuning import block_config, kernel_flags, launch_options


@triton.jit
def _prologue(TILES, count, q_offsets, kv_offsets, pid, n_workers, COUNTER, DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr):
    """A worker's first tile, located (slot, head, start, q start/length, kv start/length), and
    its second tile's slot and table row, with the round counter."""
    i, r = sched_first(pid, COUNTER, DYNAMIC)
    b, h, start = plan_tile(TILES, i, count)
    q_start, lq = locate_sequence(q_offsets, b)
    k_start, lk = locate_sequence(kv_offsets, b)
    i_n, b_n, h_n, start_n, r = plan_next(i, r, pid, n_workers, TILES, count, COUNTER, DYNAMIC, ZIGZAG)
    return i, h, start, q_start, lq, k_start, lk, i_n, b_n, h_n, start_n, r


@triton.jit(do_not_specialize=["n_workers"])
def _fwd_kernel(
    Q, K, V, O, LSE, q_offsets, kv_offsets, TILES, COUNT, COUNTER,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    total_q, scale, left, right, n_workers,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr,
):
    pid = tl.program_id(0)
    count = tl.load(COUNT).to(tl.int32)
    i, h, m0, q_start, lq, k_start, lk, i_n, b_n, h_n, m0_n, r = _prologue(TILES, count, q_offsets, kv_offsets, pid, n_workers, COUNTER, DYNAMIC, ZIGZAG)
    while i < count:
        q_start_n, lq_n = locate_sequence(q_offsets, b_n)
        k_start_n, lk_n = locate_sequence(kv_offsets, b_n)
        i_nn, b_nn, h_nn, m0_nn, r = plan_next(i_n, r, pid, n_workers, TILES, count, COUNTER, DYNAMIC, ZIGZAG)
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
        i, h, m0, q_start, lq, k_start, lk = i_n, h_n, m0_n, q_start_n, lq_n, k_start_n, lk_n
        i_n, b_n, h_n, m0_n = i_nn, b_nn, h_nn, m0_nn


@triton.jit(do_not_specialize=["n_workers"])
def _dq_kernel(
    Q, K, V, O, DO, DQ, LSE, DELTA, q_offsets, kv_offsets, TILES, COUNT, COUNTER,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_dot, stride_doh, stride_dqt, stride_dqh,
    total_q, scale, left, right, n_workers,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr,
):
    pid = tl.program_id(0)
    count = tl.load(COUNT).to(tl.int32)
    i, h, m0, q_start, lq, k_start, lk, i_n, b_n, h_n, m0_n, r = _prologue(TILES, count, q_offsets, kv_offsets, pid, n_workers, COUNTER, DYNAMIC, ZIGZAG)
    while i < count:
        q_start_n, lq_n = locate_sequence(q_offsets, b_n)
        k_start_n, lk_n = locate_sequence(kv_offsets, b_n)
        i_nn, b_nn, h_nn, m0_nn, r = plan_next(i_n, r, pid, n_workers, TILES, count, COUNTER, DYNAMIC, ZIGZAG)
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
        i, h, m0, q_start, lq, k_start, lk = i_n, h_n, m0_n, q_start_n, lq_n, k_start_n, lk_n
        i_n, b_n, h_n, m0_n = i_nn, b_nn, h_nn, m0_nn


@triton.jit(do_not_specialize=["n_workers"])
def _dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA, q_offsets, kv_offsets, TILES, COUNT, COUNTER,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    total_q, scale, left, right, n_workers,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr,
):
    pid = tl.program_id(0)
    count = tl.load(COUNT).to(tl.int32)
    i, hk, n0, q_start, lq, k_start, lk, i_n, b_n, h_n, n0_n, r = _prologue(TILES, count, q_offsets, kv_offsets, pid, n_workers, COUNTER, DYNAMIC, ZIGZAG)
    while i < count:
        q_start_n, lq_n = locate_sequence(q_offsets, b_n)
        k_start_n, lk_n = locate_sequence(kv_offsets, b_n)
        i_nn, b_nn, h_nn, n0_nn, r = plan_next(i_n, r, pid, n_workers, TILES, count, COUNTER, DYNAMIC, ZIGZAG)
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
        i, hk, n0, q_start, lq, k_start, lk = i_n, h_n, n0_n, q_start_n, lq_n, k_start_n, lk_n
        i_n, b_n, h_n, n0_n = i_nn, b_nn, h_nn, n0_nn


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    plan: Plan,
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
    launch(
        _fwd_kernel, plan, "fwd", (q, k, v, out, lse, q_offsets, kv_offsets),
        (
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), tq, scale, left, right,
        ),
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
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    plan: Plan,
    *,
    left: int,
    right: int,
    scale: float,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dQ pass: dQ (fp32 under the interpreter, else q's dtype) and delta = rowsum(dO * O)
    ``[Hq, Tq]`` fp32, which the dK/dV pass (portable or TLX) reads."""
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))
    tq, hq, dim = q.shape
    dq, delta = alloc_like(q), alloc_like(lse)
    launch(
        _dq_kernel, plan, "dq", (q, k, v, out, dout, dq, lse, delta, q_offsets, kv_offsets),
        (
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), dout.stride(0), dout.stride(1), dq.stride(0), dq.stride(1),
            tq, scale, left, right,
        ),
        **kernel_flags(hq, k.shape[1], dim, left, right), **launch_options(block_config(backend, dim, "dq")),
    )
    return dq, delta


def backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    plan: Plan,
    *,
    left: int,
    right: int,
    scale: float,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV in the inputs' dtypes. Deterministic: no atomics on data (a dynamic schedule
    changes which program runs a tile, never what the tile computes)."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))  # once, for both passes
    dq, delta = backward_dq(
        dout, q, k, v, out, lse, q_offsets, kv_offsets, plan, left=left, right=right, scale=scale,
        backend=backend,
    )
    tq, hq, dim = q.shape
    dk, dv = alloc_like(k), alloc_like(v)
    launch(
        _dkdv_kernel, plan, "dkdv", (q, k, v, dout, dk, dv, lse, delta, q_offsets, kv_offsets),
        (
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dout.stride(0), dout.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            tq, scale, left, right,
        ),
        **kernel_flags(hq, k.shape[1], dim, left, right), **launch_options(block_config(backend, dim, "dkdv")),
    )
    return dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])
