"""The Plan's model: schedule kinds, passes, the tile table's layout, and the ints that say it.

Takes only ints (no tensor is read) and guarantees that every shape follows from them: a Plan
passes through a ``torch.library`` op and a CUDA graph, and no grid depends on a value on the
GPU.

Schedule kinds (:data:`SCHEDULES`) and how each orders its table (:func:`sort_kind`; how the
programs then take the tiles is :mod:`jagflash.core.tile_scheduler`'s):

- ``"static"``: tiles sorted by cost, largest first (stable, so deterministic), dealt to the
  workers in zigzag rounds (LPT).
- ``"dynamic"``: the same sorted table, taken from an atomic counter.
- ``"dynamic-grouped"``: ``grouped``'s table taken from an atomic counter: the tiles that run at
  once stay within few sequences (the one-pass backward's dQ accumulator rows they add into
  stay in L2) with the counter's balance.
- ``"grouped"``: sequences sorted by cost (q-tiles x kv-tiles, largest first), each sequence's
  tiles together and heaviest first (sequences of equal cost share a group), dealt zigzag like
  static: the tiles that run at once share their sequence's K/V in L2 while the longest
  sequences still start first (measured in bench/NOTES.md).
- ``"none"``: batch order (sequence, tile, head), one program per tile and the hardware's block
  scheduler: the classic varlen launch.

``backward_schedule`` gives the backward passes (dQ, dK/dV) their own kind (default: the
forward's).

A :class:`Plan` is plain tensors and ints: ``tiles`` int32 ``[rows, 3]`` of ``(sequence, head,
first row)`` in sections per pass (:data:`PASSES`: ``fwd``, ``dq``, ``dkdv``; dq shares fwd's
rows when their tile sizes and order agree), ``meta`` int64 ``[5]`` (the valid tile count of
each pass, then fingerprints of the q and kv offsets), and :class:`PlanInfo` (schedule,
workers, batch, totals, heads, mask, per-pass tile sizes and sections). Each section is sized by
a bound known without reading the offsets (``min((T + B*(blk-1)) // blk, B * ceil(max_seqlen /
blk)) * heads``); rows past the count are ``-1``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from jagflash.core.capability import InvalidInput
from jagflash.core.jagged import cdiv
from jagflash.core.mask import mask_bounds

__all__ = [
    "DYNAMIC_SCHEDULES",
    "PASSES",
    "PTR_DENSE",
    "PTR_SAME_CALL",
    "PTR_UNKNOWN",
    "SCHEDULES",
    "PassLayout",
    "Plan",
    "PlanInfo",
    "plan_info",
    "sort_kind",
]


SCHEDULES = ("none", "static", "dynamic", "grouped", "dynamic-grouped")
#: The schedules whose tiles the kernels take from an atomic counter.
DYNAMIC_SCHEDULES = ("dynamic", "dynamic-grouped")


def sort_kind(schedule: str) -> int:
    """How a schedule orders its table: 0 batch order, 1 by tile cost, 2 by sequence cost then
    tile cost (``grouped``: a sequence's tiles stay together)."""
    return {"none": 0, "static": 1, "dynamic": 1, "grouped": 2, "dynamic-grouped": 2}[schedule]


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

    @functools.cached_property
    def rows(self) -> int:
        """Rows of the tile table (every plan check asks: computed once per info, which is frozen)."""
        return max((p.row0 + p.rows for p in self.passes), default=0)

    def layout(self, pass_: str) -> PassLayout:
        return self.passes[PASSES.index(pass_)]

    def schedule_of(self, pass_: str) -> str:
        return self.schedule if pass_ == "fwd" else self.backward_schedule

    def to_ints(self) -> list[int]:
        """The ints :meth:`from_ints` decodes (a new list each call, made from ones kept on this
        frozen info: every call with a plan passes them)."""
        return list(self._ints)

    @functools.cached_property
    def _ints(self) -> tuple[int, ...]:
        head = [
            _MAGIC, _VERSION, SCHEDULES.index(self.schedule),
            SCHEDULES.index(self.backward_schedule), self.workers, self.batch,
            self.total_q, self.total_kv, self.heads_q, self.heads_kv, self.left, self.right,
            int(self.backward), self.q_ptr, self.kv_ptr,
        ]
        return tuple(head + [x for p in self.passes for x in p._ints()])

    @classmethod
    def from_ints(cls, ints: Sequence[int]) -> PlanInfo:
        """The info a Plan's ``op_args`` carried (every call with a plan decodes it: the
        decoded, frozen infos of the last plans are kept, found without converting each int
        where the ints are those of a kept one: the list ``op_args`` made)."""
        try:
            return _decoded[tuple(ints)]
        except (KeyError, TypeError):  # not decoded yet, or unhashable items (SymInts)
            pass
        key = tuple(int(x) for x in ints)
        info = _info_from_ints(key)
        if len(_decoded) >= 64:
            _decoded.clear()
        _decoded[key] = info
        return info


#: :meth:`PlanInfo.from_ints`' decoded infos by their ints (Python ints; a sequence of equal
#: ints of other int types finds the same entry).
_decoded: dict[tuple[int, ...], PlanInfo] = {}


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
    """A schedule for one batch's tiles, built once (:func:`jagflash.core.plan.build.make_plan`) and reused by every
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


def _tile_bound(total: int, batch: int, block: int, max_seqlen: int | None) -> int:
    """Tiles per head a section needs room for, from ints only: sum_b ceil(L_b / block) is at
    most (T + B*(block-1)) // block, and at most B * ceil(max_seqlen / block)."""
    bound = (total + batch * (block - 1)) // block if batch else 0
    if max_seqlen is not None and max_seqlen >= 0:
        bound = min(bound, batch * cdiv(max_seqlen, block))
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
    backward passes take the forward's sizes. Every call without a plan lays one out: the infos
    are kept per arguments (all it reads; refusals are not kept), outside tracing.
    """
    args = (
        batch, total_q, total_kv, heads_q, heads_kv, causal, window, tuple(blocks.items()), max_seqlen_q,
        max_seqlen_kv, workers, schedule, backward_schedule, backward, q_ptr, kv_ptr,
    )
    if not torch.compiler.is_compiling():
        try:
            return _plan_info_kept(*args)
        except TypeError:  # unhashable (a list in blocks or window, a SymInt): not kept
            pass
    return _plan_info(*args)


@functools.lru_cache(maxsize=128, typed=True)
def _plan_info_kept(*args) -> PlanInfo:
    return _plan_info(*args)


def _plan_info(
    batch, total_q, total_kv, heads_q, heads_kv, causal, window, block_items, max_seqlen_q, max_seqlen_kv,
    workers, schedule, backward_schedule, backward, q_ptr, kv_ptr,
) -> PlanInfo:
    blocks = dict(block_items)
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
