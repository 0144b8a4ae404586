"""A schedule replayed on the CPU: makespan, efficiency, and sequences in flight.

:func:`simulate` replays tiles of given costs, in table order, on W identical workers under one
deal rule and reports the makespan and its efficiency against the lower bound
``max(sum(cost) / W, max(cost))``; :func:`simulate_plan` replays a Plan's pass the way its kernel
deals it. The simulator has no memory system: :func:`sequences_in_flight` is its proxy for L2
pressure. Reads the plan's tensors (a host sync on a GPU): for tools and tests, not for calls.
The measurements it was checked against are in bench/NOTES.md; the A/B that prints every
schedule's simulated efficiency on the bench's workloads is ``bench/probes/schedule_ab.py``.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from jagflash.core.jagged import seq_lengths
from jagflash.core.plan.cost import tile_costs
from jagflash.core.plan.model import _SIDE, DYNAMIC_SCHEDULES, Plan

__all__ = ["Simulation", "section_costs", "sequences_in_flight", "simulate", "simulate_plan"]


@dataclass(frozen=True)
class Simulation:
    """A schedule replayed on W identical workers: the time the last one finishes, the lower
    bound ``max(sum(cost) / W, max(cost))`` and their ratio (1.0 is perfect).

    ``sequences_in_flight`` (from :func:`simulate_plan`): the mean number of distinct sequences
    among W consecutive tiles of the table, the tiles that run at about the same time. The
    simulator has no memory system; this is its proxy for L2 pressure (the tiles of one
    sequence read the same K/V; on the H200 the order with fewer in flight won where balance
    was equal: bench/NOTES.md, 2026-11-30)."""

    makespan: float
    lower_bound: float
    efficiency: float
    loads: np.ndarray
    sequences_in_flight: float = float("nan")


def simulate(
    costs: Sequence[float] | np.ndarray | torch.Tensor, workers: int, rule: str, lookahead: int = 2
) -> Simulation:
    """Replay tiles of ``costs`` (in table order) on ``workers`` workers.

    ``rule``:

    - ``"zigzag"`` / ``"round-robin"``: static; worker ``w`` takes slot ``w`` of every round of
      ``workers`` slots, mirrored on odd rounds for zigzag.
    - ``"dynamic"``: the kernels' atomic counter. A worker takes tiles ``lookahead`` ahead of the
      one it runs (the jagged kernels prefetch two tiles' metadata, so 2): at the start every
      worker takes one tile, then one more each, ``lookahead`` times; afterwards a worker takes
      the next tile when it starts one.
    - ``"greedy"``: the next tile goes to the worker free first (no lookahead): the hardware
      block scheduler running ``schedule="none"`` with ``workers`` resident programs.

    Ties go to the lower worker.
    """
    c = np.asarray(costs.cpu() if isinstance(costs, torch.Tensor) else costs, dtype=np.float64)
    n = c.size
    loads = np.zeros(workers)
    if rule in ("zigzag", "round-robin"):
        idx = np.arange(n)
        rnd, w = idx // workers, idx % workers
        if rule == "zigzag":
            w = np.where(rnd % 2 == 1, workers - 1 - w, w)
        np.add.at(loads, w, c)
    elif rule in ("dynamic", "greedy"):
        ahead = lookahead if rule == "dynamic" else 0
        queues: list[deque[int]] = [deque() for _ in range(workers)]
        nxt = 0
        for _ in range(1 + ahead):
            for q in queues:
                if nxt < n:
                    q.append(nxt)
                    nxt += 1
        heap = [(0.0, w) for w in range(workers)]
        while heap:
            t, w = heapq.heappop(heap)
            q = queues[w]
            if not q and nxt < n:
                q.append(nxt)
                nxt += 1
            if not q:
                loads[w] = t
                continue
            x = c[q.popleft()]
            while len(q) < ahead and nxt < n:
                q.append(nxt)
                nxt += 1
            heapq.heappush(heap, (t + x, w))
    else:
        raise ValueError(f"unknown rule {rule!r}: zigzag, round-robin, dynamic or greedy")
    makespan = float(loads.max()) if workers else 0.0
    bound = max(float(c.sum()) / workers, float(c.max()) if n else 0.0)
    return Simulation(makespan, bound, bound / makespan if makespan > 0 else 1.0, loads)


def section_costs(plan: Plan, pass_: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, costs)`` of a pass's valid tiles in table order, on the CPU (reads the device)."""
    lay = plan.info.layout(pass_)
    rows = plan.section(pass_)[: plan.count(pass_)].cpu().to(torch.int64)
    lq = seq_lengths(plan.q_offsets.cpu())  # type: ignore[union-attr]
    lk = seq_lengths(plan.kv_offsets.cpu())  # type: ignore[union-attr]
    seq, start = rows[:, 0], rows[:, 2]
    costs = tile_costs(_SIDE[pass_], start, lq[seq], lk[seq], lay.block_m, lay.block_n, plan.info.left, plan.info.right)
    return rows, costs


def simulate_plan(plan: Plan, pass_: str, workers: int = 132, overhead: float = 0.0) -> Simulation:
    """Replay a plan's pass on ``workers`` workers the way its kernel runs it; ``overhead`` adds
    a fixed cost per tile (prologue and epilogue, in kv-tile iterations)."""
    rows, costs = section_costs(plan, pass_)
    costs = costs.double() + overhead
    kind = plan.info.schedule_of(pass_)
    if kind == "none":
        rule = "greedy"
    elif kind in DYNAMIC_SCHEDULES:
        rule = "dynamic"
    else:
        rule = "zigzag" if plan.info.layout(pass_).zigzag else "round-robin"
    sim = simulate(costs, workers, rule)
    return dataclasses.replace(sim, sequences_in_flight=sequences_in_flight(rows[:, 0], workers))


def sequences_in_flight(seq: torch.Tensor | np.ndarray, workers: int) -> float:
    """Mean count of distinct values among each ``workers`` consecutive entries of ``seq``
    (a table's sequence column, in table order); NaN for an empty table."""
    a = np.asarray(seq.cpu() if isinstance(seq, torch.Tensor) else seq)
    if a.size == 0 or workers <= 0:
        return float("nan")
    return float(np.mean([np.unique(a[i : i + workers]).size for i in range(0, a.size, workers)]))
