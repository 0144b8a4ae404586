"""Dealing a Plan's tiles to persistent programs: on the host the deal flags, the workers and the
launch; in kernels (``@triton.jit``, portable) each worker's walk over a pass's table
(:func:`sched_first`, :func:`sched_next`, :func:`plan_tile`, :func:`plan_next`).

Takes a :class:`~jagflash.core.plan.model.Plan` and a pass; says how many programs a launch
runs and how they take the pass's table, and launches a persistent kernel over it (the portable
kernels' walker is ``jagflash.core.portable.persistent.walk``; the TLX kernels' roles walk
through ``jagflash.core.tlx.pipeline.walk_first``). Deals, by schedule kind:

- ``static`` and ``grouped``: the cost-sorted table dealt to the W workers in zigzag rounds
  (even rounds left to right, odd rounds right to left: LPT) where the pass is laid out for it,
  else round-robin; worker ``w`` computes its own slots, so no table depends on W (the zigzag
  against round-robin simulation is in bench/NOTES.md).
- ``dynamic`` and ``dynamic-grouped`` (:data:`DYNAMIC_SCHEDULES`): each worker takes the next
  tile of the table (cost-sorted, or sequence-grouped) from an atomic counter (greedy list scheduling,
  the Hopper stand-in for Blackwell's cluster launch control), ahead of the one it runs so that
  locating a tile never stalls it. The counter is a zeroed int32 no other launch gets
  (:func:`tile_counter`), so concurrent launches of one Plan never share it and a CUDA graph
  replays it correctly.
- ``none``: one program per table row, the hardware's block scheduler.

W is the plan's ``workers``, else the SM count times the programs of the kernel one SM holds
(:func:`default_workers`, read at call time and cached; never at import).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from jagflash.core.jagged import cdiv
from jagflash.core.memo import memo_allowed
from jagflash.core.plan.model import DYNAMIC_SCHEDULES, PASSES, Plan, PlanInfo

__all__ = [
    "deal_flags",
    "default_workers",
    "launch",
    "occupancies",
    "plan_launch",
    "plan_next",
    "plan_tile",
    "sched_first",
    "sched_next",
    "tile_counter",
]


@functools.cache
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def default_workers(device: torch.device) -> int:
    """Persistent programs per launch: the SM count on a GPU (read at call time, cached), a
    handful on the CPU (the interpreter runs programs one after another anyway)."""
    if device.type == "cuda":
        return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 4



def deal_flags(info: PlanInfo, pass_: str) -> tuple[bool, bool]:
    """``(dynamic, zigzag)``: how a persistent kernel (portable or TLX) deals ``pass_``'s table
    to its programs. ``dynamic``: from the launch's atomic tile counter (a dynamic schedule);
    ``zigzag``: a static deal that mirrors its odd rounds, where the pass is laid out for it
    (grouped, static); batch order (``"none"``) and a dynamic deal have no rounds to mirror."""
    kind = info.schedule_of(pass_)
    return kind in DYNAMIC_SCHEDULES, kind in ("static", "grouped") and info.layout(pass_).zigzag


def plan_launch(info: PlanInfo, pass_: str, device: torch.device, occupancy: int = 1) -> tuple[int, bool, bool]:
    """``(programs, dynamic, zigzag)`` of a pass's launch of the portable kernels: one program
    per table row for ``schedule="none"``, else ``workers`` (default: SMs x ``occupancy``, the
    programs of this kernel one SM holds at once) persistent programs, at most one per row;
    :func:`deal_flags`."""
    return (_programs(info, pass_, device, occupancy), *deal_flags(info, pass_))


def _programs(info: PlanInfo, pass_: str, device: torch.device, occupancy: int) -> int:
    rows = info.layout(pass_).rows
    if info.schedule_of(pass_) == "none":
        return rows
    return max(1, min(info.workers or default_workers(device) * max(1, occupancy), rows))


_occupancies: dict[tuple, int] = {}


def _occupancy(kernel, device: torch.device, args: tuple, kw: dict) -> int:
    """Programs of a compiled kernel one SM runs at once (threads, registers, shared memory),
    from the kernel compiled for these arguments; cached. 1 when it cannot be told."""
    if device.type != "cuda":
        return 1
    key = (kernel, device, tuple(a.dtype if isinstance(a, torch.Tensor) else None for a in args), tuple(sorted(kw.items())))
    if key not in _occupancies:
        try:
            compiled = kernel.warmup(*args, grid=(1,), **kw)
            compiled._init_handles()
            regs, smem, warps = int(compiled.n_regs), int(compiled.metadata.shared), int(compiled.metadata.num_warps)
            props = torch.cuda.get_device_properties(device)
            threads = getattr(props, "max_threads_per_multi_processor", 2048)
            regs_sm = getattr(props, "regs_per_multiprocessor", 65536)
            smem_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
            per_warp = cdiv(max(regs, 1) * 32, 256) * 256
            _occupancies[key] = max(1, min(
                threads // (32 * warps), regs_sm // (per_warp * warps),
                smem_sm // (smem + 1024) if smem else 32, 32,
            ))
        except Exception:  # an older or newer Triton without these attributes: one per SM
            _occupancies[key] = 1
    return _occupancies[key]


def occupancies() -> dict[str, int]:
    """The programs per SM chosen so far for each compiled persistent kernel (for reports)."""
    return {f"{getattr(k[0], '__name__', k[0])} {dict(k[3])}": v for k, v in _occupancies.items()}


#: Counters per zeroed buffer of :func:`tile_counter` (a buffer is zeroed by one fill per this
#: many dynamic launches), and int32 per counter: 4 (16 bytes), so that every counter has the
#: 16-byte alignment Triton specialises pointers on, as a fresh allocation has (same binary).
COUNTER_SLOTS, _SLOT_INTS = 1024, 4
#: ``(device, stream handle) -> [buffer [COUNTER_SLOTS, 4] int32, its slots' views, next free slot]``.
_counter_pools: dict[tuple, list] = {}
_counter_lock = threading.Lock()


def _stream_key(device: torch.device) -> tuple:
    if device.type == "cuda":
        return (device, torch.cuda.current_stream(device).cuda_stream)
    return (device, None)


def tile_counter(plan: Plan, pass_: str) -> torch.Tensor:
    """The ``COUNTER`` argument of one launch of a persistent kernel over ``pass_``: for a dynamic
    schedule a zeroed int32 no other launch ever gets, else ``plan.meta`` (never read).

    In plain eager mode outside a CUDA graph capture (``jagflash.core.memo.memo_allowed``) the
    counter is the next unused slot of a buffer kept per device and stream, zeroed by one fill
    when it is made and when its :data:`COUNTER_SLOTS` slots are used up: the fill is queued on
    the stream after every launch that used a slot, so a launch on that stream (the one
    current here, which the launch that follows uses) always starts from zero, and a call costs
    no fill kernel. Under tracing, modes and capture it is a fresh ``torch.zeros(1)`` (a graph's
    replays zero it again)."""
    if plan.info.schedule_of(pass_) not in DYNAMIC_SCHEDULES:
        return plan.meta
    device = plan.tiles.device
    if not memo_allowed((plan.tiles,)):
        return torch.zeros(1, dtype=torch.int32, device=device)
    key = _stream_key(device)
    with _counter_lock:
        pool = _counter_pools.get(key)
        if pool is None:
            buffer = torch.zeros((COUNTER_SLOTS, _SLOT_INTS), dtype=torch.int32, device=device)
            pool = _counter_pools[key] = [buffer, buffer[:, :1].unbind(0), 0]  # each slot's [1] view
        buffer, views, slot = pool
        if slot == len(views):
            buffer.zero_()
            slot = 0
        pool[2] = slot + 1
        return views[slot]


def launch(kernel, plan: Plan, pass_: str, tensors: Sequence, scalars: Sequence, **kw) -> None:
    """Launch a persistent ``kernel(*tensors, TILES, COUNT, COUNTER, *scalars, n_workers,
    DYNAMIC=, ZIGZAG=, **kw)`` over one pass of ``plan`` (the loop it runs is in
    ``jagflash.core.portable``): the pass's table section, its count on the device, a fresh
    zeroed counter for a dynamic schedule (:func:`tile_counter`: no two launches ever share one,
    and a CUDA graph replays it from zero), and the programs (:func:`plan_launch`) as the grid.

    ``n_workers`` should be ``do_not_specialize``-d, so that every worker count runs one binary.
    """
    lay = plan.info.layout(pass_)
    if lay.rows == 0:
        return
    device = plan.tiles.device
    dynamic, zigzag = deal_flags(plan.info, pass_)
    counter = tile_counter(plan, pass_)
    head = (*tensors, plan.section(pass_), plan.meta[PASSES.index(pass_) :], counter, *scalars)
    occupancy = 1
    if device.type == "cuda" and plan.info.schedule_of(pass_) != "none" and not plan.info.workers:
        occupancy = _occupancy(kernel, device, (*head, 1), {"DYNAMIC": dynamic, "ZIGZAG": zigzag, **kw})
    programs = _programs(plan.info, pass_, device, occupancy)
    kernel[(programs,)](*head, programs, DYNAMIC=dynamic, ZIGZAG=zigzag, **kw)


# --- in kernels: a worker's walk over a pass's table ----------------------------------------
#
# A persistent kernel walks a Plan's tile table; every variant's kernel reads it the same way,
# fetching the next tile's row (and whatever it derives from it, such as the sequence's offsets)
# before it runs the current one, so that those loads' latency hides behind the tile's work:
#
#     count = tl.load(COUNT).to(tl.int32)
#     i, r = sched_first(pid, COUNTER, DYNAMIC)
#     seq, head, start = plan_tile(TILES, i, count)
#     while i < count:
#         i_next, r = sched_next(i, r, pid, n_workers, COUNTER, DYNAMIC, ZIGZAG)
#         seq_next, head_next, start_next = plan_tile(TILES, i_next, count)
#         ...one tile program on (seq, head, start)...
#         i, seq, head, start = i_next, seq_next, head_next, start_next
#
# Static: worker ``pid`` takes slot ``pid`` of every round of ``n_workers`` slots (mirrored on
# odd rounds when ZIGZAG); once its slot of a round is past the count, every later one is too.
# Dynamic: each worker takes the next slot from the int32 counter COUNTER (zeroed per launch)
# when it starts a tile, i.e. one tile ahead (``jagflash.core.plan.simulate`` models that).
# ``schedule="none"`` launches one program per table row: n_workers = rows, one round.


@triton.jit
def sched_first(pid, COUNTER, DYNAMIC: tl.constexpr):
    """The first table slot of worker ``pid``, and the round counter. A dynamic claim is a
    relaxed atomic: it hands out each slot once and publishes no data (the counter is zeroed
    between launches, in stream order), so it needs none of an acquire-release add's fences
    (on sm_90 a GPU-wide membar before the add and an L1 invalidation after it, which the
    TLX producers waited for at every tile: bench/NOTES.md, session 25)."""
    if DYNAMIC:
        i = tl.atomic_add(COUNTER, 1, sem="relaxed")
    else:
        i = pid
    return i, pid * 0


@triton.jit
def sched_next(i, r, pid, n_workers, COUNTER, DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr):
    """The next table slot of worker ``pid`` after slot ``i`` of round ``r``, and its round."""
    r = r + 1
    if DYNAMIC:
        i = tl.atomic_add(COUNTER, 1, sem="relaxed")  # (see sched_first)
    else:
        w = pid
        if ZIGZAG:
            w = tl.where(r % 2 == 1, n_workers - 1 - pid, pid)
        i = r * n_workers + w
    return i, r


@triton.jit
def plan_tile(TILES, i, count):
    """Row ``i`` of a Plan's tile table: ``(sequence, head, first row)``; zeros past ``count``
    (a harmless tile to prefetch for: the loop ends before running it)."""
    ok = i < count
    row = TILES + tl.where(ok, i, 0).to(tl.int64) * 3
    return tl.load(row, mask=ok, other=0), tl.load(row + 1, mask=ok, other=0), tl.load(row + 2, mask=ok, other=0)


@triton.jit
def plan_next(i, r, pid, n_workers, TILES, count, COUNTER, DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr):
    """The next tile of worker ``pid`` after slot ``i`` of round ``r``: ``(slot, sequence, head,
    first row, round)``, its table row loaded (so it is in flight while the current tile runs)."""
    i, r = sched_next(i, r, pid, n_workers, COUNTER, DYNAMIC, ZIGZAG)
    b, h, start = plan_tile(TILES, i, count)
    return i, b, h, start, r

