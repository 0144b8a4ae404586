"""Load balancing: the tile cost model, static and dynamic schedules, the Plan, a simulator.

Skewed lengths are where jagged attention loses: one 4,096-token sequence among a hundred short
ones gives a few tiles that each cost 64 times more than the rest, and a grid that hands tiles
out in batch order ends with most SMs idle while a few finish the long ones. The kernels
therefore run *persistent*: a fixed number of workers (the SM count times the programs of the
kernel one SM holds) loop over a table of tiles that this module builds, once per batch, on the
device:

- **cost model**: a forward (or dQ) q-tile costs the kv-tiles it visits under the mask
  (:func:`jagflash.core.mask.kv_tile_ranges`); a dK/dV kv-tile costs the q-tiles it visits
  (:func:`jagflash.core.jagged.dkdv_q_ranges`). Tiles of no row do not exist; a tile that sees
  nothing costs 0 and stays (it writes zeros and LSE -inf).
- **static** (``schedule="static"``): the table is sorted by cost, largest first (stable, so
  deterministic), and dealt to the W workers in zigzag rounds (even rounds left to right, odd
  rounds right to left: LPT). Every pass deals zigzag: round-robin, planned for the backward,
  simulated at 0.955 on the causal GQA batch's dK/dV (zigzag 0.986). Worker ``w`` computes its
  own slots, so no table depends on W.
- **dynamic** (``schedule="dynamic"``): the same sorted table; each worker takes the next tile
  from an atomic counter (greedy list scheduling, the Hopper stand-in for Blackwell's cluster
  launch control), two tiles ahead of the one it runs so that locating a tile never stalls it.
  The counter is a fresh zeroed int32 per launch, so concurrent launches of one Plan never
  share it and a CUDA graph replays it correctly.
- **grouped** (``schedule="grouped"``): sequences sorted by cost (q-tiles x kv-tiles, largest
  first), each sequence's tiles together and heaviest first (sequences of equal cost share a
  group), dealt zigzag like static. The tiles that run at once then share their sequence's K/V
  in L2: on the H200, batch order beat the cost-sorted static table by 9 % on causal jagged
  batches (bench/NOTES.md), and grouped keeps most of that locality while still starting the
  longest sequences first.
- **none** (``schedule="none"``): the table in batch order (sequence, tile, head), one program
  per tile and the hardware's block scheduler: the classic varlen launch, the A/B baseline.

``backward_schedule`` gives the backward passes (dQ, dK/dV) their own kind (default: the
forward's), e.g. a persistent forward with a batch-order backward.

A :class:`Plan` is plain tensors and ints, so it passes through a ``torch.library`` op and a CUDA
graph: ``tiles`` int32 ``[rows, 3]`` of ``(sequence, head, first row)`` in sections per pass
(``fwd``, ``dq``, ``dkdv``; dq shares fwd's rows when their tile sizes and order agree), ``meta`` int64
``[5]`` (the valid tile count of each pass, then fingerprints of the q and kv offsets), and
:class:`PlanInfo` (schedule, workers, batch, totals, heads, mask, per-pass tile sizes and
sections). Each section is sized by a bound known without reading the offsets
(``min((T + B*(blk-1)) // blk, B * ceil(max_seqlen / blk)) * heads``), so no shape and no grid
depends on a value on the GPU; rows past the count are ``-1``. On a GPU four small Triton
kernels and one sort build it (``_build_triton``); elsewhere torch ops do (``_build_torch``,
the reference the Triton build is tested against).

Build with :func:`make_plan` (or a variant's ``make_plan(q, k, ...)``, which fills in its tile
sizes) once per batch and pass ``plan=`` to every layer's call: the forward and the backward
use it, and the backward never rebuilds it. A Plan used for another problem is refused: the
ints are compared on the host, the offsets by identity, else by fingerprint on the device
(``torch._assert_async``, no sync). :func:`simulate` replays a schedule on the CPU and reports
the makespan and its efficiency against ``max(sum(cost) / W, max(cost))``.

``python -m jagflash.core.schedule --bench`` times the build on a CUDA device;
``--simulate`` prints every schedule's simulated efficiency on the bench's jagged workloads.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import heapq
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from jagflash.core.capability import InvalidInput
from jagflash.core.jagged import seq_lengths
from jagflash.core.mask import (
    dkdv_q_range,
    dkdv_q_ranges,
    kv_tile_range,
    kv_tile_ranges,
    mask_bounds,
)
from jagflash.core.seqlen import upper_bound
from jagflash.core.tuning import DEFAULT_BACKWARD_SCHEDULE, DEFAULT_SCHEDULE

__all__ = [
    "BENCH_JAGGED",
    "PASSES",
    "SCHEDULES",
    "JaggedWorkload",
    "PassLayout",
    "Plan",
    "PlanInfo",
    "Simulation",
    "check_plan",
    "deal_flags",
    "default_workers",
    "launch",
    "make_plan",
    "occupancies",
    "offsets_fingerprint",
    "plan_info",
    "plan_launch",
    "resolve_plan",
    "section_costs",
    "sequences_in_flight",
    "simulate",
    "simulate_plan",
    "sort_kind",
    "tile_costs",
    "tile_counter",
    "workload_plan",
    "workload_plan_kwargs",
]

SCHEDULES = ("none", "static", "dynamic", "grouped")


def sort_kind(schedule: str) -> int:
    """How a schedule orders its table: 0 batch order, 1 by tile cost, 2 by sequence cost then
    tile cost (``grouped``: a sequence's tiles stay together)."""
    return {"none": 0, "static": 1, "dynamic": 1, "grouped": 2}[schedule]


PASSES = ("fwd", "dq", "dkdv")
#: Which side a pass tiles: q-tiles (forward, dQ) or kv-tiles (dK/dV).
_SIDE = {"fwd": "q", "dq": "q", "dkdv": "kv"}
#: How a static schedule deals each pass's sorted tiles to the workers.
_ZIGZAG = {"fwd": True, "dq": True, "dkdv": True}
_MAGIC = 0x4A46504C  # "JFPL"
_VERSION = 1
#: ``q_ptr``/``kv_ptr`` sentinels: the offsets are unknown (check their values on the device),
#: or the plan was built inside the very call that uses it (nothing to check).
PTR_UNKNOWN = 0
PTR_SAME_CALL = -2
PTR_DENSE = -3
_FP_MOD = 2_147_483_647  # 2**31 - 1: keeps every product of the fingerprint inside int64


@dataclass(frozen=True)
class PassLayout:
    """One pass's section of the tile table: tile sizes, where its rows start, how many."""

    block_m: int
    block_n: int
    row0: int
    tiles: int  # tiles per head the section has room for (a bound, not the count)
    heads: int
    zigzag: bool

    @property
    def rows(self) -> int:
        return self.tiles * self.heads

    def _ints(self) -> list[int]:
        return [self.block_m, self.block_n, self.row0, self.tiles, self.heads, int(self.zigzag)]


@dataclass(frozen=True)
class PlanInfo:
    """Everything about a Plan that is an int: what it was built for and how its table is laid
    out. Travels through ops as ``list[int]`` (:meth:`to_ints` / :meth:`from_ints`)."""

    schedule: str  # the forward's; ``backward_schedule`` the dQ and dK/dV passes'
    backward_schedule: str
    workers: int  # 0: the device's SM count at launch (4 under the interpreter)
    batch: int
    total_q: int
    total_kv: int
    heads_q: int
    heads_kv: int
    left: int
    right: int
    backward: bool
    q_ptr: int
    kv_ptr: int
    passes: tuple[PassLayout, PassLayout, PassLayout]

    @property
    def rows(self) -> int:
        return max((p.row0 + p.rows for p in self.passes), default=0)

    def layout(self, pass_: str) -> PassLayout:
        return self.passes[PASSES.index(pass_)]

    def schedule_of(self, pass_: str) -> str:
        return self.schedule if pass_ == "fwd" else self.backward_schedule

    def to_ints(self) -> list[int]:
        head = [
            _MAGIC, _VERSION, SCHEDULES.index(self.schedule),
            SCHEDULES.index(self.backward_schedule), self.workers, self.batch,
            self.total_q, self.total_kv, self.heads_q, self.heads_kv, self.left, self.right,
            int(self.backward), self.q_ptr, self.kv_ptr,
        ]
        return head + [x for p in self.passes for x in p._ints()]

    @classmethod
    def from_ints(cls, ints: Sequence[int]) -> PlanInfo:
        """The info a Plan's ``op_args`` carried (every call with a plan decodes it: the
        decoded, frozen infos of the last plans are kept)."""
        return _info_from_ints(tuple(int(x) for x in ints))


@functools.lru_cache(maxsize=64)
def _info_from_ints(ints: tuple[int, ...]) -> PlanInfo:
    n = 15
    if len(ints) != n + 6 * len(PASSES) or ints[0] != _MAGIC or ints[1] != _VERSION:
        raise InvalidInput("plan", ["plan_info is not the info of a jagflash Plan (version 1)"])
    passes = tuple(
        PassLayout(*ints[n + 6 * i : n + 5 + 6 * i], zigzag=bool(ints[n + 5 + 6 * i]))
        for i in range(len(PASSES))
    )
    return PlanInfo(
        SCHEDULES[ints[2]], SCHEDULES[ints[3]], *ints[4:12], bool(ints[12]), ints[13],  # type: ignore[arg-type]
        ints[14], passes,  # type: ignore[arg-type]
    )


@dataclass(frozen=True, eq=False)
class Plan:
    """A schedule for one batch's tiles, built once (:func:`make_plan`) and reused by every
    layer's forward and backward that share the offsets.

    ``tiles`` int32 ``[rows, 3]``: ``(sequence, head, first row)``, pass sections as
    ``info.layout(pass)`` says, rows past a pass's count ``-1``. ``meta`` int64 ``[5]``: tile
    count of ``fwd``, ``dq``, ``dkdv``, fingerprint of the q offsets, of the kv offsets.
    ``q_offsets``/``kv_offsets`` are the offsets it was built from (kept alive so that their
    identity means something).
    """

    tiles: torch.Tensor
    meta: torch.Tensor
    info: PlanInfo
    q_offsets: torch.Tensor | None = None
    kv_offsets: torch.Tensor | None = None

    @property
    def schedule(self) -> str:
        return self.info.schedule

    @property
    def device(self) -> torch.device:
        return self.tiles.device

    def op_args(self) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """``(plan_tiles, plan_meta, plan_info)``: how the Plan crosses a ``torch.library`` op."""
        return self.tiles, self.meta, self.info.to_ints()

    def section(self, pass_: str) -> torch.Tensor:
        lay = self.info.layout(pass_)
        return self.tiles[lay.row0 : lay.row0 + lay.rows]

    def count(self, pass_: str) -> int:
        """Valid tiles of a pass (reads the device: a host sync on a GPU; for tools and tests)."""
        return int(self.meta[PASSES.index(pass_)])

    def __repr__(self) -> str:
        i = self.info
        secs = ", ".join(f"{n} {p.block_m}x{p.block_n}:{p.rows}" for n, p in zip(PASSES, i.passes))
        return (
            f"Plan({i.schedule if i.schedule == i.backward_schedule else i.schedule + '/' + i.backward_schedule}, "
            f"workers={i.workers or 'auto'}, B={i.batch}, Hq={i.heads_q}, "
            f"Hkv={i.heads_kv}, mask=({i.left}, {i.right}), {secs}, device={self.device})"
        )


# --- building ----------------------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _tile_bound(total: int, batch: int, block: int, max_seqlen: int | None) -> int:
    """Tiles per head a section needs room for, from ints only: sum_b ceil(L_b / block) is at
    most (T + B*(block-1)) // block, and at most B * ceil(max_seqlen / block)."""
    bound = (total + batch * (block - 1)) // block if batch else 0
    if max_seqlen is not None and max_seqlen >= 0:
        bound = min(bound, batch * _cdiv(max_seqlen, block))
    return max(bound, 0)


def plan_info(
    *,
    batch: int,
    total_q: int,
    total_kv: int,
    heads_q: int,
    heads_kv: int,
    causal: bool = False,
    window: tuple[int, int] | None = None,
    blocks: dict[str, tuple[int, int]],
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    workers: int | None = None,
    schedule: str = "static",
    backward_schedule: str | None = None,
    backward: bool = True,
    q_ptr: int = PTR_UNKNOWN,
    kv_ptr: int = PTR_UNKNOWN,
) -> PlanInfo:
    """The :class:`PlanInfo` of a plan, from ints alone (no tensor is read).

    ``blocks`` maps each pass (``fwd``, ``dq``, ``dkdv``) to its ``(block_m, block_n)``; missing
    backward passes take the forward's sizes.
    """
    reasons = []
    backward_schedule = schedule if backward_schedule is None else backward_schedule
    for name, kind in (("schedule", schedule), ("backward_schedule", backward_schedule)):
        if kind not in SCHEDULES:
            reasons.append(f"{name} {kind!r} not in {SCHEDULES}")
    if "fwd" not in blocks:
        reasons.append("blocks must give the forward's (block_m, block_n)")
    for name, bl in blocks.items():
        if name not in PASSES:
            reasons.append(f"blocks has unknown pass {name!r}; passes are {PASSES}")
        elif len(bl) != 2 or min(bl) < 1:
            reasons.append(f"blocks[{name!r}] must be two positive ints, got {bl}")
    if heads_q < 1 or heads_kv < 1 or heads_q % heads_kv:
        reasons.append(f"heads_q ({heads_q}) must be a positive multiple of heads_kv ({heads_kv})")
    if workers is not None and workers < 1:
        reasons.append(f"workers must be at least 1, got {workers}")
    if min(batch, total_q, total_kv) < 0:
        reasons.append("batch and totals must be non-negative")
    if reasons:
        raise InvalidInput("make_plan", reasons)
    left, right = mask_bounds(causal, window)
    passes = []
    row0 = 0
    for name in PASSES:
        bm, bn = (int(x) for x in blocks.get(name, blocks["fwd"]))
        q_side = _SIDE[name] == "q"
        heads = heads_q if q_side else heads_kv
        if name != "fwd" and not backward:
            passes.append(PassLayout(bm, bn, row0, 0, heads, _ZIGZAG[name]))
            continue
        if (
            name == "dq" and (bm, bn) == (passes[0].block_m, passes[0].block_n)
            and sort_kind(schedule) == sort_kind(backward_schedule or schedule)
        ):
            # Same tile sizes and order: dQ reads the forward's section (the deal is per pass).
            passes.append(dataclasses.replace(passes[0], zigzag=_ZIGZAG[name]))
            continue
        if q_side:
            tiles = _tile_bound(total_q, batch, bm, max_seqlen_q)
        else:
            tiles = _tile_bound(total_kv, batch, bn, max_seqlen_kv)
        passes.append(PassLayout(bm, bn, row0, tiles, heads, _ZIGZAG[name]))
        row0 += tiles * heads
    return PlanInfo(
        schedule, backward_schedule, int(workers or 0), int(batch), int(total_q), int(total_kv), int(heads_q),
        int(heads_kv), left, right, bool(backward), int(q_ptr), int(kv_ptr), tuple(passes),  # type: ignore[arg-type]
    )


def offsets_fingerprint(offsets: torch.Tensor) -> torch.Tensor:
    """An int64 scalar on the offsets' device that changes when any offset does (a weighted
    sum mod 2**31-1 with per-position weights): compares offsets without a host sync."""
    o = offsets.to(torch.int64) % _FP_MOD
    w = (torch.arange(o.numel(), device=o.device, dtype=torch.int64) * 40503 + 12345) % _FP_MOD + 1
    return ((o * w) % _FP_MOD).sum() % _FP_MOD


def tile_costs(
    side: str,
    start: torch.Tensor,
    lq: torch.Tensor,
    lk: torch.Tensor,
    block_m: int,
    block_n: int,
    left: int,
    right: int,
) -> torch.Tensor:
    """Cost of tiles starting at row ``start`` of sequences with ``lq`` queries, ``lk`` keys:
    kv-tiles visited by a q-tile (``side="q"``: forward, dQ) or q-tiles visited by a kv-tile
    (``side="kv"``: dK/dV), int64."""
    if side == "q":
        lo, _, _, hi = kv_tile_ranges(start, lq, lk, block_m, block_n, left, right)
        return torch.div(hi - lo + block_n - 1, block_n, rounding_mode="floor")
    lo, _, _, hi = dkdv_q_ranges(start, lq, lk, block_m, block_n, left, right)
    return torch.div(hi - lo, block_m, rounding_mode="floor")


_TILE_COST_ROOM = 1 << 13  # grouped key: sequence cost * room + tile cost, below 2**31


def _seq_cost(lq: torch.Tensor, lk: torch.Tensor, block_m: int, block_n: int) -> torch.Tensor:
    """The ``grouped`` schedule's first sort key: a sequence's q-tiles times its kv-tiles
    (capped so that the key, with the tile's cost below it, stays under 2**31)."""
    tq = torch.div(lq.clamp(min=0) + block_m - 1, block_m, rounding_mode="floor")
    tk = torch.div(lk.clamp(min=0) + block_n - 1, block_n, rounding_mode="floor")
    return (tq * tk).clamp(max=(2**31 - 1) // _TILE_COST_ROOM - 1)


def _section(
    lengths: torch.Tensor, lq: torch.Tensor, lk: torch.Tensor, side: str, lay: PassLayout,
    left: int, right: int, sort: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass's rows ``[lay.rows, 3]`` int32 and its valid-tile count (a device scalar)."""
    dev = lengths.device
    batch = lengths.numel()
    block = lay.block_m if side == "q" else lay.block_n
    if batch == 0 or lay.tiles == 0:
        return torch.full((lay.rows, 3), -1, dtype=torch.int32, device=dev), torch.zeros((), dtype=torch.int64, device=dev)
    per_seq = torch.div(lengths.clamp(min=0) + block - 1, block, rounding_mode="floor")
    last = torch.cumsum(per_seq, 0)
    slot = torch.arange(lay.tiles, device=dev)
    seq = torch.searchsorted(last, slot, right=True)
    valid = seq < batch
    seq = seq.clamp(max=batch - 1)
    start = (slot - (last - per_seq)[seq]) * block
    cost = tile_costs(side, start, lq[seq], lk[seq], lay.block_m, lay.block_n, left, right)
    if sort == 2:  # grouped: the sequence's cost, q-tiles x kv-tiles, then the tile's
        cost = _seq_cost(lq[seq], lk[seq], lay.block_m, lay.block_n) * _TILE_COST_ROOM + cost.clamp(max=_TILE_COST_ROOM - 1)
    cost = torch.where(valid, cost, -1)
    if sort:
        order = torch.sort(cost, descending=True, stable=True).indices
        seq, start, valid = seq[order], start[order], valid[order]
    head = torch.arange(lay.heads, device=dev)
    rows = torch.stack(torch.broadcast_tensors(seq[:, None], head[None, :], start[:, None]), -1)
    rows = torch.where(valid[:, None, None], rows, -1).to(torch.int32).reshape(lay.rows, 3)
    count = torch.clamp(last[-1], max=lay.tiles) * lay.heads
    return rows, count


def _build_torch(q_offsets: torch.Tensor, kv_offsets: torch.Tensor, info: PlanInfo) -> tuple[torch.Tensor, torch.Tensor]:
    lq, lk = seq_lengths(q_offsets), seq_lengths(kv_offsets)
    dev = q_offsets.device
    tiles = torch.empty((info.rows, 3), dtype=torch.int32, device=dev)
    counts = []
    for name, lay in zip(PASSES, info.passes):
        if name == "dq" and lay.row0 == info.passes[0].row0 and lay.rows == info.passes[0].rows:
            counts.append(counts[0])
            continue
        side = _SIDE[name]
        rows, count = _section(lq if side == "q" else lk, lq, lk, side, lay, info.left, info.right, sort_kind(info.schedule_of(name)))
        tiles[lay.row0 : lay.row0 + lay.rows] = rows
        counts.append(count)
    meta = torch.stack([*counts, offsets_fingerprint(q_offsets), offsets_fingerprint(kv_offsets)])
    return tiles, meta


# The same build in Triton for GPUs: a prefix kernel (tiles per sequence, counts, fingerprints),
# a slots kernel (every pass's tiles, costs and sort keys), one sort, and a rows kernel: 4
# launches where the torch path above costs ~150 small ones. Both give identical tables (tested).
_KEY_COST = 1 << 28  # slots per pass stay below this (else the torch path builds the plan)


@triton.jit
def _plan_prefix_kernel(
    q_offsets, kv_offsets, PREFIX, META, batch,
    blk0, blk1, blk2, cap0, cap1, cap2, heads0, heads1, heads2,
    CHUNK: tl.constexpr,
):
    """Program p < 3: inclusive prefix sums over sequences of pass p's tiles per sequence (q
    side for fwd and dq, kv side for dkdv), and its row count (tiles, capped by the section's
    room, times heads); program 3: the offsets' fingerprints (see offsets_fingerprint)."""
    p = tl.program_id(0)
    offs = tl.arange(0, CHUNK)
    if p < 3:
        blk = tl.where(p == 0, blk0, tl.where(p == 1, blk1, blk2)).to(tl.int64)
        cap = tl.where(p == 0, cap0, tl.where(p == 1, cap1, cap2)).to(tl.int64)
        heads = tl.where(p == 0, heads0, tl.where(p == 1, heads1, heads2)).to(tl.int64)
        carry = tl.zeros([], dtype=tl.int64)
        for b0 in range(0, batch, CHUNK):
            b = b0 + offs
            m = b < batch
            if p == 2:
                length = tl.load(kv_offsets + b + 1, mask=m, other=0).to(tl.int64) - tl.load(kv_offsets + b, mask=m, other=0).to(tl.int64)
            else:
                length = tl.load(q_offsets + b + 1, mask=m, other=0).to(tl.int64) - tl.load(q_offsets + b, mask=m, other=0).to(tl.int64)
            n = (tl.maximum(length, 0) + blk - 1) // blk
            tl.store(PREFIX + p.to(tl.int64) * batch + b, tl.cumsum(n, 0) + carry, mask=m)
            carry += tl.sum(n, 0)
        tl.store(META + p, tl.minimum(carry, cap) * heads)
    else:
        for which in range(2):
            acc = tl.zeros([], dtype=tl.int64)
            for i0 in range(0, batch + 1, CHUNK):
                i = i0 + offs
                m = i < batch + 1
                if which == 0:
                    o = tl.load(q_offsets + i, mask=m, other=0).to(tl.int64)
                else:
                    o = tl.load(kv_offsets + i, mask=m, other=0).to(tl.int64)
                w = (i.to(tl.int64) * 40503 + 12345) % 2147483647 + 1
                acc += tl.sum(tl.where(m, (o % 2147483647) * w % 2147483647, 0), 0)
            tl.store(META + 3 + which, acc % 2147483647)


@triton.jit
def _pick(p, a, b, c):
    return tl.where(p == 0, a, tl.where(p == 1, b, c))


@triton.jit
def _plan_slots_kernel(
    q_offsets, kv_offsets, PREFIX, KEYS, SEQ, START, ROWS, batch, search_steps, left, right,
    t0, t1, t2, h0, h1, h2, bm0, bm1, bm2, bn0, bn1, bn2, kb0, kb1, kb2, rb0, rb1, rb2, s0, s1, s2,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, SLOTS: tl.constexpr,
    HEADS: tl.constexpr, ROOM: tl.constexpr,
):
    """Slot j of pass ``program_id(1)``: its sequence (binary search in the pass's PREFIX),
    first row and cost (kv-tiles a q-tile visits, q-tiles a kv-tile visits:
    ``jagflash.core.mask``'s ranges with run-time tile sizes). Sorted passes (s0..s2):
    the sort key
    (pass, largest cost first, then slot; -1 past the count; the cost is the sequence's for
    ``grouped``) and the slot's (sequence, start); else its table rows, in batch order."""
    p = tl.program_id(1)
    tiles = _pick(p, t0, t1, t2)
    heads = _pick(p, h0, h1, h2)
    bm = _pick(p, bm0, bm1, bm2)
    bn = _pick(p, bn0, bn1, bn2)
    kv_side = p == 2
    blk = tl.where(kv_side, bn, bm)
    j = tl.program_id(0) * SLOTS + tl.arange(0, SLOTS)
    jm = j < tiles
    jj = j.to(tl.int64)
    prefix = PREFIX + p.to(tl.int64) * batch
    seq = upper_bound(prefix, batch, jj, search_steps)  # the first sequence whose prefix exceeds j
    valid = jm & (seq < batch)
    b = tl.minimum(seq, batch - 1)
    first = tl.load(prefix + b - 1, mask=valid & (b > 0), other=0)
    start = ((jj - first) * blk).to(tl.int32)
    lq = (tl.load(q_offsets + b + 1, mask=valid, other=0) - tl.load(q_offsets + b, mask=valid, other=0)).to(tl.int32)
    lk = (tl.load(kv_offsets + b + 1, mask=valid, other=0) - tl.load(kv_offsets + b, mask=valid, other=0)).to(tl.int32)
    if _pick(p, s0, s1, s2) != 0:
        # the mask's ranges (jagflash.core.mask), with run-time tile sizes: kv-tiles a q-tile
        # visits (forward, dQ), q-tiles a kv-tile visits (dK/dV)
        k_lo, _, _, k_hi = kv_tile_range(start, lq, lk, left, right, bm, bn, BOUNDED_LEFT, BOUNDED_RIGHT)
        q_cost = (k_hi - k_lo + bn - 1) // bn
        r_lo, _, _, r_hi = dkdv_q_range(start, lq, lk, left, right, bm, bn, BOUNDED_LEFT, BOUNDED_RIGHT)
        kv_cost = (r_hi - r_lo) // bm
        cost = tl.where(kv_side, kv_cost, q_cost).to(tl.int64)
        if _pick(p, s0, s1, s2) == 2:  # grouped: the sequence's cost, then the tile's (_seq_cost)
            seq_cost = ((lq + bm - 1) // bm).to(tl.int64) * ((lk + bn - 1) // bn).to(tl.int64)
            seq_cost = tl.minimum(seq_cost, 2147483647 // ROOM - 1)
            cost = seq_cost * ROOM + tl.minimum(cost, ROOM - 1)
        cost = tl.where(valid, cost, -1)
        kb = _pick(p, kb0, kb1, kb2).to(tl.int64)
        tl.store(KEYS + kb + jj, p.to(tl.int64) * 1152921504606846976 + (2147483647 - cost) * 268435456 + jj, mask=jm)
        tl.store(SEQ + kb + jj, tl.where(valid, seq, -1), mask=jm)
        tl.store(START + kb + jj, tl.where(valid, start, -1), mask=jm)
    else:
        rb = _pick(p, rb0, rb1, rb2).to(tl.int64)
        h = tl.arange(0, HEADS)
        row = ROWS + (rb + jj[:, None] * heads + h[None, :]) * 3
        m = jm[:, None] & (h[None, :] < heads)
        ok = valid[:, None] & (h[None, :] >= 0)
        tl.store(row, tl.where(ok, seq[:, None], -1), mask=m)
        tl.store(row + 1, tl.where(ok, h[None, :], -1), mask=m)
        tl.store(row + 2, tl.where(ok, start[:, None], -1), mask=m)


@triton.jit
def _plan_rows_kernel(
    KEYS, SEQ, START, ROWS, total, h0, h1, h2, kb0, kb1, kb2, rb0, rb1, rb2,
    SLOTS: tl.constexpr, HEADS: tl.constexpr,
):
    """Table rows of the sorted slots: sorted position q holds the slot its key names, once per
    head, at its pass's section."""
    q = tl.program_id(0) * SLOTS + tl.arange(0, SLOTS)
    qm = q < total
    key = tl.load(KEYS + q, mask=qm, other=0)
    p = (key >> 60).to(tl.int32)
    j = key & 268435455
    kb = _pick(p, kb0, kb1, kb2).to(tl.int64)
    rb = _pick(p, rb0, rb1, rb2).to(tl.int64)
    heads = _pick(p, h0, h1, h2)
    seq = tl.load(SEQ + kb + j, mask=qm, other=-1)
    start = tl.load(START + kb + j, mask=qm, other=-1)
    h = tl.arange(0, HEADS)
    row = ROWS + (rb[:, None] + (q.to(tl.int64) - kb)[:, None] * heads[:, None] + h[None, :]) * 3
    m = qm[:, None] & (h[None, :] < heads[:, None])
    ok = (seq >= 0)[:, None] & (h[None, :] >= 0)
    tl.store(row, tl.where(ok, seq[:, None], -1), mask=m)
    tl.store(row + 1, tl.where(ok, h[None, :], -1), mask=m)
    tl.store(row + 2, tl.where(ok, start[:, None], -1), mask=m)


def _build_triton(q_offsets: torch.Tensor, kv_offsets: torch.Tensor, info: PlanInfo) -> tuple[torch.Tensor, torch.Tensor]:
    dev = q_offsets.device
    batch = info.batch
    lays = info.passes
    tiles = torch.empty((info.rows, 3), dtype=torch.int32, device=dev)
    meta = torch.empty(5, dtype=torch.int64, device=dev)
    prefix = torch.empty((3, max(batch, 1)), dtype=torch.int64, device=dev)
    blk = [lay.block_n if _SIDE[n] == "kv" else lay.block_m for n, lay in zip(PASSES, lays)]
    _plan_prefix_kernel[(4,)](
        q_offsets, kv_offsets, prefix, meta, batch, *blk, *(lay.tiles for lay in lays),
        *(lay.heads for lay in lays), CHUNK=1024,
    )
    # sections to fill: the dQ pass that shares the forward's rows is skipped
    work = [
        0 if lay.rows == 0 or (n == "dq" and lay.row0 == lays[0].row0 and lay.rows == lays[0].rows) else lay.tiles
        for n, lay in zip(PASSES, lays)
    ]
    if sum(work) == 0:
        return tiles, meta
    sort = [sort_kind(info.schedule_of(n)) for n in PASSES]
    sorted_work = [w if s else 0 for w, s in zip(work, sort)]
    total = sum(sorted_work)
    kbase = [sum(sorted_work[:k]) for k in range(3)]
    keys = torch.empty(max(total, 1), dtype=torch.int64, device=dev)
    seq = torch.empty(max(total, 1), dtype=torch.int32, device=dev)
    start = torch.empty_like(seq)
    slots = 256
    heads_p2 = triton.next_power_of_2(max(lay.heads for lay in lays))
    _plan_slots_kernel[(triton.cdiv(max(work), slots), 3)](
        q_offsets, kv_offsets, prefix, keys, seq, start, tiles, batch, max(batch, 1).bit_length(),
        info.left, info.right, *work, *(lay.heads for lay in lays), *(lay.block_m for lay in lays),
        *(lay.block_n for lay in lays), *kbase, *(lay.row0 for lay in lays), *sort,
        BOUNDED_LEFT=info.left >= 0, BOUNDED_RIGHT=info.right >= 0, SLOTS=slots, HEADS=heads_p2,
        ROOM=_TILE_COST_ROOM,
    )
    if total:
        keys = torch.sort(keys).values
        _plan_rows_kernel[(triton.cdiv(total, slots),)](
            keys, seq, start, tiles, total, *(lay.heads for lay in lays), *kbase,
            *(lay.row0 for lay in lays), SLOTS=slots, HEADS=heads_p2,
        )
    return tiles, meta


def _kernels_interpreted() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_plan_rows_kernel, InterpretedFunction)


def _build(q_offsets: torch.Tensor, kv_offsets: torch.Tensor, info: PlanInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """The plan's tensors: Triton kernels on a GPU, torch ops elsewhere."""
    if q_offsets.device.type == "cuda" and not _kernels_interpreted() and max(p.tiles for p in info.passes) < _KEY_COST:
        return _build_triton(q_offsets, kv_offsets, info)
    return _build_torch(q_offsets, kv_offsets, info)


@torch.library.custom_op("jagflash::build_plan", mutates_args=())
def build_plan(
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, info: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tiles, meta)`` of the plan ``info`` describes, built on the offsets' device with torch
    ops and no host sync. An op, so ``torch.compile`` keeps it as one opaque node."""
    return _build(q_offsets, kv_offsets, PlanInfo.from_ints(info))


@build_plan.register_fake
def _(q_offsets, kv_offsets, info):
    rows = PlanInfo.from_ints(info).rows
    return q_offsets.new_empty((rows, 3), dtype=torch.int32), q_offsets.new_empty((5,), dtype=torch.int64)


def _offsets_reasons(q_offsets: object, kv_offsets: object) -> list[str]:
    reasons = []
    for name, o in (("q_offsets", q_offsets), ("kv_offsets", kv_offsets)):
        if not isinstance(o, torch.Tensor) or o.dim() != 1 or o.numel() < 1 or o.dtype not in (torch.int32, torch.int64):
            reasons.append(f"{name} must be a 1-D int32/int64 tensor of B+1 offsets")
    if not reasons:
        if q_offsets.shape != kv_offsets.shape:  # type: ignore[union-attr]
            reasons.append(
                f"q_offsets and kv_offsets must both have B+1 entries, got {q_offsets.numel()} and "  # type: ignore[union-attr]
                f"{kv_offsets.numel()}"  # type: ignore[union-attr]
            )
        if q_offsets.device != kv_offsets.device:  # type: ignore[union-attr]
            reasons.append(f"q_offsets is on {q_offsets.device} but kv_offsets on {kv_offsets.device}")  # type: ignore[union-attr]
    return reasons


def _ptr(t: torch.Tensor) -> int:
    if torch.compiler.is_compiling():
        return PTR_UNKNOWN
    return int(t.data_ptr()) or PTR_UNKNOWN


def make_plan(
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    total_q: int,
    total_kv: int,
    heads_q: int,
    heads_kv: int,
    causal: bool = False,
    window: tuple[int, int] | None = None,
    block_m: int,
    block_n: int,
    dq_blocks: tuple[int, int] | None = None,
    dkdv_blocks: tuple[int, int] | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    workers: int | None = None,
    schedule: str = DEFAULT_SCHEDULE,
    backward_schedule: str | None = None,
    backward: bool = True,
) -> Plan:
    """Build the :class:`Plan` of one batch on the offsets' device, without a host sync.

    Args:
        q_offsets, kv_offsets: ``[B+1]`` int32/int64 offsets (see ``jagflash.core.jagged``).
            The plan keeps them; calls that pass other offsets are refused unless their values
            match (checked on the device).
        total_q, total_kv: rows of q and k (``q.shape[0]``, ``k.shape[0]``): with ``B`` they
            bound the tile count, so the table's size needs no read of the offsets.
        heads_q, heads_kv: query and kv heads (forward and dQ tiles are per query head, dK/dV
            tiles per kv head, summing their GQA group).
        causal, window: the mask (see :func:`jagflash.core.mask.mask_bounds`).
        block_m, block_n: the forward's tile sizes; ``dq_blocks``/``dkdv_blocks`` the backward
            passes' ``(block_m, block_n)`` (default: the forward's). A variant's own
            ``make_plan`` fills them in from its kernels' configuration.
        max_seqlen_q, max_seqlen_kv: optional upper bounds of the lengths; they tighten the
            table's size (never pass one below a length: tiles past the bound are dropped).
        workers: persistent programs per launch; ``None``: the device's SM count at launch
            (4 under the interpreter). Ignored by ``schedule="none"``.
        schedule: ``"grouped"`` (default: sequences cost-sorted, their tiles together, dealt
            zigzag), ``"static"`` (tiles cost-sorted, dealt zigzag / round-robin), ``"dynamic"``
            (cost-sorted, atomic tile counter) or ``"none"`` (batch order, one program a tile).
        backward_schedule: the backward passes' kind (default: ``schedule``'s).
        backward: also lay out the dQ and dK/dV passes (``False`` for inference only).
    """
    reasons = _offsets_reasons(q_offsets, kv_offsets)
    if reasons:
        raise InvalidInput("make_plan", reasons)
    blocks = {"fwd": (block_m, block_n)}
    if dq_blocks is not None:
        blocks["dq"] = tuple(dq_blocks)  # type: ignore[assignment]
    if dkdv_blocks is not None:
        blocks["dkdv"] = tuple(dkdv_blocks)  # type: ignore[assignment]
    info = plan_info(
        batch=q_offsets.numel() - 1, total_q=total_q, total_kv=total_kv, heads_q=heads_q,
        heads_kv=heads_kv, causal=causal, window=window, blocks=blocks,
        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, workers=workers,
        schedule=schedule, backward_schedule=backward_schedule, backward=backward,
        q_ptr=_ptr(q_offsets), kv_ptr=_ptr(kv_offsets),
    )
    tiles, meta = build_plan(q_offsets, kv_offsets, info.to_ints())
    return Plan(tiles, meta, info, q_offsets, kv_offsets)


# --- using a plan ------------------------------------------------------------------------


@functools.cache
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def default_workers(device: torch.device) -> int:
    """Persistent programs per launch: the SM count on a GPU (read at call time, cached), a
    handful on the CPU (the interpreter runs programs one after another anyway)."""
    if device.type == "cuda":
        return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 4


def check_plan(
    who: str,
    info: PlanInfo,
    *,
    tiles: torch.Tensor,
    meta: torch.Tensor,
    q_offsets: torch.Tensor | None,
    kv_offsets: torch.Tensor | None,
    batch: int,
    total_q: int,
    total_kv: int,
    heads_q: int,
    heads_kv: int,
    left: int,
    right: int,
    blocks: dict[str, tuple[int, int]],
    device: torch.device,
) -> None:
    """Refuse a plan built for another problem: :class:`InvalidInput` listing every mismatch of
    the ints (host only), then the offsets' values when they are not the plan's own tensors
    (compared on the host on a CPU, by ``torch._assert_async`` on a GPU: no sync).

    ``blocks`` holds the passes the call runs, with the tile sizes its kernels use.
    Offsets given as ``None`` get no value check: dense layouts have none, and broadcast-Q's
    output offsets are ``arange(B + 1) * Lq``, fixed by the ints checked here.
    """
    reasons = []

    def differ(what: str, planned: object, called: object) -> None:
        if planned != called:
            reasons.append(f"the plan was built for {what}={planned}, this call has {called}")

    differ("B", info.batch, batch)
    differ("Tq", info.total_q, total_q)
    differ("Tk", info.total_kv, total_kv)
    differ("heads_q", info.heads_q, heads_q)
    differ("heads_kv", info.heads_kv, heads_kv)
    differ("mask (left, right)", (info.left, info.right), (left, right))
    for name, (bm, bn) in blocks.items():
        if name != "fwd" and not info.backward:
            reasons.append(f"the plan has no {name} pass: build it with backward=True")
            continue
        lay = info.layout(name)
        differ(f"{name} tiles (block_m, block_n)", (lay.block_m, lay.block_n), (bm, bn))
    if tiles.device != device or meta.device != device:
        reasons.append(f"the plan is on {tiles.device}, this call on {device}")
    if tiles.dtype != torch.int32 or tiles.dim() != 2 or tiles.shape[0] != info.rows or meta.shape != (5,):
        reasons.append("plan tensors do not match their info (tiles int32 [rows, 3], meta [5])")
    if reasons:
        raise InvalidInput(who, reasons)
    if info.q_ptr == PTR_SAME_CALL:
        return
    # meta[3], meta[4]: the fingerprints of the q and kv offsets the plan was built from; a
    # tensor at the address it was built from is taken as the same offsets (no GPU work)
    todo = [
        (offsets, slot)
        for offsets, ptr, slot in ((q_offsets, info.q_ptr, 3), (kv_offsets, info.kv_ptr, 4))
        if offsets is not None and (ptr == PTR_UNKNOWN or _ptr(offsets) != ptr)
    ]
    if not todo:
        return
    got = torch.stack([offsets_fingerprint(offsets) for offsets, _ in todo])
    want = meta[[slot for _, slot in todo]]
    if device.type == "cpu":
        if not torch.equal(got, want):
            raise InvalidInput(who, ["the plan was built for other offsets (their values differ)"])
        return
    torch._assert_async(
        (got == want).all(), f"{who}: the plan was built for other offsets (their values differ)"
    )


def resolve_plan(
    who: str,
    plan_tiles: torch.Tensor | None,
    plan_meta: torch.Tensor | None,
    plan_info_ints: Sequence[int] | None,
    *,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    check_offsets: bool,
    derived_q: bool = False,
    total_q: int,
    total_kv: int,
    heads_q: int,
    heads_kv: int,
    left: int,
    right: int,
    blocks: dict[str, tuple[int, int]],
    passes: Sequence[str],
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
) -> Plan:
    """What an op does with its ``plan_*`` arguments: check the plan it was given against the
    call (:func:`check_plan`), or, called without one (only by code that calls the op
    directly), build one for ``passes`` with :data:`DEFAULT_SCHEDULE`. ``derived_q``: the
    q offsets follow from the ints (broadcast-Q's output rows), so only the kv offsets' values
    are checked."""
    batch = q_offsets.numel() - 1
    if plan_tiles is None or plan_meta is None or plan_info_ints is None:
        info = plan_info(
            batch=batch, total_q=total_q, total_kv=total_kv, heads_q=heads_q, heads_kv=heads_kv,
            window=(left, right), blocks=blocks, max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv, schedule=DEFAULT_SCHEDULE,
            backward_schedule=DEFAULT_BACKWARD_SCHEDULE, backward=any(p != "fwd" for p in passes),
            q_ptr=PTR_SAME_CALL, kv_ptr=PTR_SAME_CALL,
        )
        tiles, meta = _build(q_offsets, kv_offsets, info)
        return Plan(tiles, meta, info, q_offsets, kv_offsets)
    info = PlanInfo.from_ints(plan_info_ints)
    check_plan(
        who, info, tiles=plan_tiles, meta=plan_meta,
        q_offsets=q_offsets if check_offsets and not derived_q else None,
        kv_offsets=kv_offsets if check_offsets else None, batch=batch, total_q=total_q,
        total_kv=total_kv, heads_q=heads_q, heads_kv=heads_kv, left=left, right=right,
        blocks={p: blocks[p] for p in passes}, device=q_offsets.device,
    )
    return Plan(plan_tiles, plan_meta, info, q_offsets, kv_offsets)


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


# --- simulating a plan --------------------------------------------------------------------


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
    elif kind == "dynamic":
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


# --- the bench's jagged workloads, and a micro-benchmark ---------------------------------
# Core cannot import jagflash.bench (dependencies point inward), so the jagged workloads' length
# generators are mirrored here: same distributions, seeds and shapes as
# ``jagflash.bench.workloads.WORKLOADS`` (core/tests/test_schedule.py checks that they agree).


def _lognormal(rng: np.random.Generator) -> np.ndarray:
    return np.clip(np.rint(512 * np.exp(rng.standard_normal(128))), 1, 4096).astype(np.int64)


def _heavy_tail(rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(np.concatenate([np.full(2, 4096), rng.integers(32, 768, size=120)]))


def _tiny(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(1, 64, size=2048, dtype=np.int64)


def _bimodal(rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(np.concatenate([rng.integers(64, 256, size=112), rng.integers(2048, 4097, size=16)]))


@dataclass(frozen=True)
class JaggedWorkload:
    """A bench jagged workload: self-attention over ``lengths()``, shapes and mask."""

    name: str
    sample: object  # rng -> int64 lengths
    heads: int = 16
    kv_heads: int = 16
    head_dim: int = 128
    causal: bool = False
    seed: int = 0

    def lengths(self) -> list[int]:
        return [int(x) for x in self.sample(np.random.default_rng(self.seed))]  # type: ignore[operator]


BENCH_JAGGED = {
    w.name: w
    for w in (
        JaggedWorkload("jagged-lognormal-d128", _lognormal),
        JaggedWorkload("jagged-lognormal-causal-d128", _lognormal, causal=True),
        JaggedWorkload("jagged-heavytail-d128", _heavy_tail),
        JaggedWorkload("jagged-tiny-d128", _tiny),
        JaggedWorkload("jagged-bimodal-d128", _bimodal),
        JaggedWorkload("jagged-lognormal-d64", _lognormal, head_dim=64),
        JaggedWorkload("jagged-lognormal-causal-d64", _lognormal, head_dim=64, causal=True),
        JaggedWorkload("jagged-lognormal-gqa4-d128", _lognormal, kv_heads=4),
        JaggedWorkload("jagged-lognormal-causal-gqa4-d128", _lognormal, kv_heads=4, causal=True),
    )
}


def workload_plan_kwargs(
    w: JaggedWorkload, schedule: str, *, device: torch.device | str = "cpu", backend: str = "portable",
    workers: int | None = None, backward: bool = True,
) -> dict:
    """The :func:`make_plan` arguments of a bench workload (offsets on ``device``) with the
    portable kernels' tile sizes for ``backend``."""
    from jagflash.core.jagged import offsets_from_lengths
    from jagflash.core.tuning import plan_blocks

    lens = w.lengths()
    offsets = offsets_from_lengths(lens, device)
    bl = plan_blocks(backend, w.head_dim)
    return {
        "q_offsets": offsets, "kv_offsets": offsets, "total_q": sum(lens), "total_kv": sum(lens),
        "heads_q": w.heads, "heads_kv": w.kv_heads, "causal": w.causal, "block_m": bl["fwd"][0],
        "block_n": bl["fwd"][1], "dq_blocks": bl["dq"], "dkdv_blocks": bl["dkdv"],
        "max_seqlen_q": max(lens, default=0), "max_seqlen_kv": max(lens, default=0),
        "workers": workers, "schedule": schedule, "backward": backward,
    }


def workload_plan(w: JaggedWorkload, schedule: str, **kw) -> Plan:
    """The plan of a bench workload (see :func:`workload_plan_kwargs`)."""
    return make_plan(**workload_plan_kwargs(w, schedule, **kw))


def _bench(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m jagflash.core.schedule",
        description="Time make_plan (median µs) on a bench jagged workload, and print the "
        "simulated efficiency of each schedule on W workers.",
    )
    parser.add_argument("--bench", action="store_true", help="time the plan build")
    parser.add_argument("--simulate", action="store_true", help="print simulated efficiencies")
    parser.add_argument("--workload", default="jagged-lognormal-d128", choices=list(BENCH_JAGGED))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workers", type=int, default=132, help="W for --simulate")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--profile", action="store_true", help="also print where the host time of a build goes")
    args = parser.parse_args(argv)
    if not (args.bench or args.simulate):
        parser.print_help()
        return
    if args.simulate:
        print(f"simulated efficiency, W={args.workers} (fwd / dq / dkdv), and the forward's sequences in flight")
        for w in BENCH_JAGGED.values():
            cells = []
            for schedule in SCHEDULES:
                plan = workload_plan(w, schedule)
                sims = [simulate_plan(plan, p, args.workers) for p in PASSES]
                effs = "/".join(f"{x.efficiency:.3f}" for x in sims)
                cells.append(f"{schedule} {effs} [{sims[0].sequences_in_flight:.0f}]")
            print(f"  {w.name:36s} " + "  ".join(cells))
    if not args.bench:
        return
    device = torch.device(args.device)
    w = BENCH_JAGGED[args.workload]
    lens = w.lengths()
    backend = "portable" if device.type == "cuda" else "interpreter"
    print(
        f"make_plan on {w.name}: B={len(lens)}, T={sum(lens)}, Hq={w.heads}, Hkv={w.kv_heads}, "
        f"D={w.head_dim}, causal={w.causal}, device={device}"
    )
    for schedule in SCHEDULES:
        for backward in (False, True):
            kw = workload_plan_kwargs(w, schedule, device=device, backend=backend, backward=backward)
            wall, host, graph = _time(lambda kw=kw: make_plan(**kw), device, args.reps)
            print(
                f"  {schedule:8s} backward={backward!s:5s} rows={make_plan(**kw).info.rows:6d}  "
                f"median {wall:8.1f} us  (host enqueue {host:8.1f} us, CUDA-graph replay {graph:7.1f} us)"
            )
    if args.profile:
        import cProfile
        import pstats

        kw = workload_plan_kwargs(w, "static", device=device, backend=backend)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.reps):
            make_plan(**kw)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)


def _time(fn, device: torch.device, reps: int) -> tuple[float, float, float]:
    """Median µs per call: synchronised wall clock, host time to enqueue, and a graph replay."""
    for _ in range(5):
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    wall, host = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e6)
        wall.append((t2 - t0) * 1e6)
    graph = float("nan")
    if device.type == "cuda":
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            fn()
        g.replay()
        sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        sync()
        graph = start.elapsed_time(end) * 1e3 / reps
    return statistics.median(wall), statistics.median(host), graph


if __name__ == "__main__":
    _bench()
