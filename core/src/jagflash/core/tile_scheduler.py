"""Dealing a Plan's tiles to persistent programs: the host side (deal flags, workers, launch).

Takes a :class:`~jagflash.core.plan.model.Plan` and a pass; says how many programs a launch
runs and how they take the pass's table, and launches a persistent kernel over it (the loops
the programs run are ``jagflash.core.portable``'s and ``jagflash.core.tlx_attention``'s @jit
walks). Deals, by schedule kind:

- ``static`` and ``grouped``: the cost-sorted table dealt to the W workers in zigzag rounds
  (even rounds left to right, odd rounds right to left: LPT) where the pass is laid out for it,
  else round-robin; worker ``w`` computes its own slots, so no table depends on W (the zigzag
  against round-robin simulation is in bench/NOTES.md).
- ``dynamic``: each worker takes the next tile from an atomic counter (greedy list scheduling,
  the Hopper stand-in for Blackwell's cluster launch control), ahead of the one it runs so that
  locating a tile never stalls it. The counter is a fresh zeroed int32 per launch, so concurrent
  launches of one Plan never share it and a CUDA graph replays it correctly.
- ``none``: one program per table row, the hardware's block scheduler.

W is the plan's ``workers``, else the SM count times the programs of the kernel one SM holds
(:func:`default_workers`, read at call time and cached; never at import).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from jagflash.core.plan.model import PASSES, Plan, PlanInfo

__all__ = [
    "deal_flags",
    "default_workers",
    "launch",
    "occupancies",
    "plan_launch",
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
    return kind == "dynamic", kind in ("static", "grouped") and info.layout(pass_).zigzag


def plan_launch(info: PlanInfo, pass_: str, device: torch.device, occupancy: int = 1) -> tuple[int, bool, bool]:
    """``(programs, dynamic, zigzag)`` of a pass's launch of the portable kernels: one program
    per table row for ``schedule="none"``, else ``workers`` (default: SMs x ``occupancy``, the
    programs of this kernel one SM holds at once) persistent programs, at most one per row;
    :func:`deal_flags`."""
    lay = info.layout(pass_)
    dynamic, zigzag = deal_flags(info, pass_)
    if info.schedule_of(pass_) == "none":
        return lay.rows, dynamic, zigzag
    workers = info.workers or default_workers(device) * max(1, occupancy)
    return max(1, min(workers, lay.rows)), dynamic, zigzag


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
            per_warp = -(-max(regs, 1) * 32 // 256) * 256
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


def tile_counter(plan: Plan, pass_: str) -> torch.Tensor:
    """The ``COUNTER`` argument of one launch of a persistent kernel over ``pass_``: for a dynamic
    schedule a fresh zeroed int32 (so that no two launches ever share one, and a CUDA graph
    replays it from zero), else ``plan.meta`` (never read)."""
    if plan.info.schedule_of(pass_) == "dynamic":
        return torch.zeros(1, dtype=torch.int32, device=plan.tiles.device)
    return plan.meta


def launch(kernel, plan: Plan, pass_: str, tensors: Sequence, scalars: Sequence, **kw) -> None:
    """Launch a persistent ``kernel(*tensors, TILES, COUNT, COUNTER, *scalars, n_workers,
    DYNAMIC=, ZIGZAG=, **kw)`` over one pass of ``plan`` (the loop it runs is in
    ``jagflash.core.portable``): the pass's table section, its count on the device, a fresh
    zeroed counter for a dynamic schedule (so that no two launches ever share one, and a CUDA
    graph replays it from zero), and the programs (:func:`plan_launch`) as the grid.

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
    if plan.info.schedule_of(pass_) != "none" and not plan.info.workers:
        occupancy = _occupancy(kernel, device, (*head, 1), {"DYNAMIC": dynamic, "ZIGZAG": zigzag, **kw})
    programs = plan_launch(plan.info, pass_, device, occupancy)[0]
    kernel[(programs,)](*head, programs, DYNAMIC=dynamic, ZIGZAG=zigzag, **kw)
