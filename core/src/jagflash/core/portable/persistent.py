"""Persistent portable kernels: how a kernel walks a Plan's tile table, and the one walker
that runs a tile program of ``portable.mainloop`` per tile.

- :func:`walk`: a worker's loop. It resolves tiles two ahead of the one it runs: while tile
  ``i`` computes, the table row of tile ``i + 2`` and the sequence record of tile ``i + 1``
  (whose row arrived during tile ``i - 1``) are in flight, so no tile waits on the dependent
  loads that locate it.
- :func:`fwd_kernel`, :func:`bwd_kernel`: the launches (``jagflash.core.tile_scheduler.launch``) of
  the forward and of a backward pass (dQ or dK/dV), generic over the layout: ``LOCATE`` makes a
  tile's sequence record (``mainloop.jagged_sequence``, ``mainloop.dense_sequence``).
- :func:`forward`, :func:`backward_dq`, :func:`backward`: the host side, for tensors ``[T, H,
  D]`` or ``[B, N, H, D]`` (row ``-3``, head ``-2``; a sequence steps along dim 0) and LSE
  ``[Hq, Tq]`` or ``[B, Hq, Nq]``.

Forward and dQ tiles are (sequence, q head, q-tile); dK/dV tiles are (sequence, kv head,
kv-tile), summed over the GQA group in-program. Each pass is one launch of W programs (static
or dynamic schedule) or of one program per table row (``schedule="none"``); the tile count is
read on the device, so no grid depends on a value that lives on the GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType

import torch
import triton
import triton.language as tl

from jagflash.core.ops import alloc, alloc_like, for_kernel
from jagflash.core.plan.model import Plan
from jagflash.core.portable.mainloop import (
    dkdv_program,
    dq_program,
    fwd_program,
    jagged_sequence,
    sparse_sequence,
)
from jagflash.core.tile_scheduler import launch, plan_next, plan_tile, sched_first
from jagflash.core.tuning import block_config, kernel_flags, launch_options


@triton.jit
def walk(TILES, COUNT, COUNTER, n_workers, layout, LOCATE: tl.constexpr, PROGRAM: tl.constexpr, tensors, strides, mask, cfg: tl.constexpr, DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr):
    """Run ``PROGRAM(tensors, strides, record, head, start, mask, cfg)`` on every tile of this
    worker, ``record = LOCATE(*layout, sequence)``."""
    pid = tl.program_id(0)
    count = tl.load(COUNT).to(tl.int32)
    i, r = sched_first(pid, COUNTER, DYNAMIC)
    b, h, start = plan_tile(TILES, i, count)
    seq = LOCATE(layout[0], layout[1], layout[2], b)
    i_n, b_n, h_n, start_n, r = plan_next(i, r, pid, n_workers, TILES, count, COUNTER, DYNAMIC, ZIGZAG)
    while i < count:
        seq_n = LOCATE(layout[0], layout[1], layout[2], b_n)
        i_nn, b_nn, h_nn, start_nn, r = plan_next(i_n, r, pid, n_workers, TILES, count, COUNTER, DYNAMIC, ZIGZAG)
        PROGRAM(tensors, strides, seq, h, start, mask, cfg)
        i, h, start, seq = i_n, h_n, start_n, seq_n
        i_n, b_n, h_n, start_n = i_nn, b_nn, h_nn, start_nn


@triton.jit(do_not_specialize=["n_workers"])
def fwd_kernel(
    Q, K, V, O, LSE, q_offsets, kv_offsets, TILES, COUNT, COUNTER, strides, sizes, mask, n_workers,  # noqa: E741
    LOCATE: tl.constexpr, CFG: tl.constexpr, DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr,
):
    """``mainloop.fwd_program`` over a Plan's forward pass (``CFG``: :func:`config`)."""
    walk(TILES, COUNT, COUNTER, n_workers, (q_offsets, kv_offsets, sizes), LOCATE, fwd_program, (Q, K, V, O, LSE), strides, mask, CFG, DYNAMIC, ZIGZAG)


@triton.jit(do_not_specialize=["n_workers"])
def bwd_kernel(
    T0, T1, T2, T3, T4, T5, LSE, DELTA, q_offsets, kv_offsets, TILES, COUNT, COUNTER, strides,
    sizes, mask, n_workers, LOCATE: tl.constexpr, PROGRAM: tl.constexpr, CFG: tl.constexpr,
    DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr,
):
    """``PROGRAM`` over a Plan's dQ or dK/dV pass: ``mainloop.dq_program`` (``T* = Q, K, V, O,
    DO, DQ``) or ``mainloop.dkdv_program`` (``T* = Q, K, V, DO, DK, DV``)."""
    walk(TILES, COUNT, COUNTER, n_workers, (q_offsets, kv_offsets, sizes), LOCATE, PROGRAM, (T0, T1, T2, T3, T4, T5, LSE, DELTA), strides, mask, CFG, DYNAMIC, ZIGZAG)


def row_strides(*ts: torch.Tensor) -> tuple[tuple[int, int, int], ...]:
    """``(sequence, row, head)`` strides of ``[T, H, D]`` or ``[B, N, H, D]`` tensors: dims 0,
    -3 and -2."""
    return tuple((s[0], s[-3], s[-2]) for s in (t.stride() for t in ts))


def config(
    backend: str, pass_: str, q: torch.Tensor, k: torch.Tensor, left: int, right: int,
    block_size: tuple[int, int] | None = None,
) -> Mapping[str, object]:
    """A launch's ``CFG`` (the programs' compile-time tuple ``(GROUP, HEAD_DIM, BLOCK_M,
    BLOCK_N, BLOCK_D, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE)``), ``num_warps`` and ``num_stages``,
    from ``jagflash.core.tuning`` for q ``[..., Hq, D]`` and k ``[..., Hkv, D]``; with a block
    mask's ``block_size`` the tiles are its blocks and ``SPARSE`` is set. Every launch asks:
    kept per (backend, pass, heads, head dim, mask bounds, block size), all it depends on, and
    returned read-only."""
    size = None if block_size is None else (int(block_size[0]), int(block_size[1]))
    return _config(backend, pass_, q.shape[-2], k.shape[-2], q.shape[-1], left, right, size)


@functools.lru_cache(maxsize=256)
def _config(
    backend: str, pass_: str, heads_q: int, heads_kv: int, head_dim: int, left: int, right: int,
    block_size: tuple[int, int] | None,
) -> Mapping[str, object]:
    flags = kernel_flags(heads_q, heads_kv, head_dim, left, right)
    opts = launch_options(block_config(backend, head_dim, pass_, block_size))
    cfg = (
        flags["GROUP"], flags["HEAD_DIM"], opts["BLOCK_M"], opts["BLOCK_N"], opts["BLOCK_D"], flags["BOUNDED_LEFT"],
        flags["BOUNDED_RIGHT"], block_size is not None,
    )
    return MappingProxyType({"CFG": cfg, "num_warps": opts["num_warps"], "num_stages": opts["num_stages"]})


def _launch(kernel, plan, pass_, tensors, strides, q, k, offsets, *, left, right, scale, backend, blocks=None, **kw):
    mask = (scale, left, right)
    size = None
    if blocks is not None:
        mask, size = (*mask, *blocks.kernel_lists()), blocks.block_size
    launch(
        kernel, plan, pass_, (*tensors, *offsets), (strides, (q.shape[-3], k.shape[-3], q.shape[-2]), mask),
        **kw, **config(backend, pass_, q, k, left, right, size),
    )


def forward(locate, q, k, v, q_offsets, kv_offsets, plan: Plan, *, left: int, right: int, scale: float, backend: str, blocks=None):
    """O (q's shape and dtype) and LSE ``[*batch, Hq, rows]`` fp32 of the layout ``locate``
    reads (``mainloop.jagged_sequence``: ``[T, H, D]``; ``mainloop.dense_sequence``:
    ``[B, N, H, D]``; ``mainloop.sparse_sequence`` with ``blocks``, a
    ``jagflash.core.block_mask.BlockMask``: only its listed blocks are visited)."""
    dtype = q.dtype
    q, k, v = (for_kernel(t, backend) for t in (q, k, v))
    out = alloc_like(q)
    lse = alloc((*q.shape[:-3], q.shape[-2], q.shape[-3]), torch.float32, q.device)
    _launch(
        fwd_kernel, plan, "fwd", (q, k, v, out, lse), row_strides(q, k, v, out), q, k, (q_offsets, kv_offsets),
        left=left, right=right, scale=scale, backend=backend, blocks=blocks, LOCATE=locate,
    )
    return out.to(dtype), lse


def backward_dq(locate, dout, q, k, v, out, lse, q_offsets, kv_offsets, plan: Plan, *, left: int, right: int, scale: float, backend: str, blocks=None):
    """The dQ pass: dQ (fp32 under the interpreter, else q's dtype) and delta = rowsum(dO * O)
    (LSE's shape, fp32), which the dK/dV pass (portable or TLX) reads."""
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))
    return _dq_pass(
        locate, dout, q, k, v, out, lse, q_offsets, kv_offsets, plan, left=left, right=right, scale=scale,
        backend=backend, blocks=blocks,
    )


def _dq_pass(locate, dout, q, k, v, out, lse, q_offsets, kv_offsets, plan, *, left, right, scale, backend, blocks):
    """:func:`backward_dq` on tensors already made :func:`for_kernel`'s."""
    dq, delta = alloc_like(q), alloc_like(lse)
    _launch(
        bwd_kernel, plan, "dq", (q, k, v, out, dout, dq, lse, delta), row_strides(q, k, v, out, dout, dq), q, k,
        (q_offsets, kv_offsets), left=left, right=right, scale=scale, backend=backend, blocks=blocks, LOCATE=locate,
        PROGRAM=dq_program,
    )
    return dq, delta


def backward(locate, dout, q, k, v, out, lse, q_offsets, kv_offsets, plan: Plan, *, left: int, right: int, scale: float, backend: str, blocks=None):
    """dQ, dK, dV in the inputs' dtypes. Deterministic: no atomics on data (a dynamic schedule
    changes which program runs a tile, never what the tile computes)."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    dout, q, k, v, out = (for_kernel(t, backend) for t in (dout, q, k, v, out))  # once, for both passes
    common = {"left": left, "right": right, "scale": scale, "backend": backend, "blocks": blocks}
    dq, delta = _dq_pass(locate, dout, q, k, v, out, lse, q_offsets, kv_offsets, plan, **common)
    dk, dv = alloc_like(k), alloc_like(v)
    _launch(
        bwd_kernel, plan, "dkdv", (q, k, v, dout, dk, dv, lse, delta), row_strides(q, k, v, dout, dk, dv), q, k,
        (q_offsets, kv_offsets), **common, LOCATE=locate, PROGRAM=dkdv_program,
    )
    return dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2])


#: :func:`forward`, :func:`backward_dq` and :func:`backward` on the jagged layout ``[T, H, D]`` +
#: offsets (``mainloop.jagged_sequence``; LSE ``[Hq, Tq]``): the kernels of every variant on it.
jagged_forward = functools.partial(forward, jagged_sequence)
jagged_backward_dq = functools.partial(backward_dq, jagged_sequence)
jagged_backward = functools.partial(backward, jagged_sequence)

#: The same on the jagged layout with a block mask (``blocks=``; ``mainloop.sparse_sequence``).
sparse_forward = functools.partial(forward, sparse_sequence)
sparse_backward_dq = functools.partial(backward_dq, sparse_sequence)
sparse_backward = functools.partial(backward, sparse_sequence)
