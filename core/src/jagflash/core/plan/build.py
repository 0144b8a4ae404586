"""Building a Plan: :func:`make_plan` and the ``jagflash::build_plan`` op behind it.

Takes a batch's ``[B+1]`` offsets and the ints of :func:`jagflash.core.plan.model.plan_info`;
returns a :class:`~jagflash.core.plan.model.Plan` on the offsets' device, built without a host
sync. On a GPU four small Triton kernels and one sort build the table (``_build_triton``);
elsewhere torch ops do (``_build_torch``, the reference the Triton build is tested against).
Both give bit-for-bit the same ``tiles`` and ``meta``. The op is opaque to ``torch.compile``
and has a fake, so a compiled graph keeps it as one node.

A plan keeps the offsets it was built from and their addresses (``q_ptr``/``kv_ptr``), and
``meta`` holds their fingerprints (:func:`offsets_fingerprint`), so that
:func:`jagflash.core.plan.check.check_plan` can refuse other offsets without a sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jagflash.core.block_tiles import plan_grid
from jagflash.core.capability import InvalidInput
from jagflash.core.jagged import cdiv, next_pow2, seq_lengths
from jagflash.core.mask import dkdv_q_range, kv_tile_range
from jagflash.core.plan.cost import _TILE_COST_ROOM, _section
from jagflash.core.plan.model import (
    _SIDE,
    PASSES,
    PTR_UNKNOWN,
    Plan,
    PlanInfo,
    plan_info,
    sort_kind,
)
from jagflash.core.seqlen import upper_bound
from jagflash.core.tuning import DEFAULT_SCHEDULE

__all__ = ["build_plan", "build_plan_ints", "make_plan", "offsets_fingerprint"]


_FP_MOD = 2_147_483_647  # 2**31 - 1: keeps every product of the fingerprint inside int64


def offsets_fingerprint(offsets: torch.Tensor) -> torch.Tensor:
    """An int64 scalar on the offsets' device that changes when any offset does (a weighted
    sum mod 2**31-1 with per-position weights): compares offsets without a host sync."""
    o = offsets.to(torch.int64) % _FP_MOD
    w = (torch.arange(o.numel(), device=o.device, dtype=torch.int64) * 40503 + 12345) % _FP_MOD + 1
    return ((o * w) % _FP_MOD).sum() % _FP_MOD



def _build_torch(
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, info: PlanInfo, grid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    lq, lk = seq_lengths(q_offsets), seq_lengths(kv_offsets)
    dev = q_offsets.device
    tiles = torch.empty((info.rows, 3), dtype=torch.int32, device=dev)
    counts = []
    for name, lay in zip(PASSES, info.passes):
        if name == "dq" and lay.row0 == info.passes[0].row0 and lay.rows == info.passes[0].rows:
            counts.append(counts[0])
            continue
        side = _SIDE[name]
        listed = None if grid is None else (grid if side == "q" else grid.transpose(-1, -2))
        # a block-sparse plan's forward tiles are the mask's blocks; a pass with smaller partner
        # tiles (the TLX dK/dV pass's 64-query steps) visits several per listed block
        fwd = info.passes[0]
        sub = fwd.block_n // lay.block_n if side == "q" else fwd.block_m // lay.block_m
        rows, count = _section(
            lq if side == "q" else lk, lq, lk, side, lay, info.left, info.right, sort_kind(info.schedule_of(name)), listed,
            max(sub, 1), fwd.block_m if side == "q" else fwd.block_n,
        )
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
        cost = tl.maximum(tl.where(kv_side, kv_cost, q_cost), 1).to(tl.int64)  # cost.MIN_SORT_COST
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
    heads_p2 = next_pow2(max(lay.heads for lay in lays))
    _plan_slots_kernel[(cdiv(max(work), slots), 3)](
        q_offsets, kv_offsets, prefix, keys, seq, start, tiles, batch, max(batch, 1).bit_length(),
        info.left, info.right, *work, *(lay.heads for lay in lays), *(lay.block_m for lay in lays),
        *(lay.block_n for lay in lays), *kbase, *(lay.row0 for lay in lays), *sort,
        BOUNDED_LEFT=info.left >= 0, BOUNDED_RIGHT=info.right >= 0, SLOTS=slots, HEADS=heads_p2,
        ROOM=_TILE_COST_ROOM,
    )
    if total:
        keys = torch.sort(keys).values
        _plan_rows_kernel[(cdiv(total, slots),)](
            keys, seq, start, tiles, total, *(lay.heads for lay in lays), *kbase,
            *(lay.row0 for lay in lays), SLOTS=slots, HEADS=heads_p2,
        )
    return tiles, meta


def _kernels_interpreted() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_plan_rows_kernel, InterpretedFunction)


def _build(
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, info: PlanInfo, grid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plan's tensors: Triton kernels on a GPU, torch ops elsewhere and under a block mask
    (``grid``: its bool grid ``[B, Hm, nQ, nK]``, whose listed blocks cost the tiles)."""
    if grid is not None:
        return _build_torch(q_offsets, kv_offsets, info, grid)
    if q_offsets.device.type == "cuda" and not _kernels_interpreted() and max(p.tiles for p in info.passes) < _KEY_COST:
        return _build_triton(q_offsets, kv_offsets, info)
    return _build_torch(q_offsets, kv_offsets, info)


@torch.library.custom_op("jagflash::build_plan", mutates_args=())
def build_plan(
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, info: list[int], grid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tiles, meta)`` of the plan ``info`` describes, built on the offsets' device with torch
    ops and no host sync. An op, so ``torch.compile`` keeps it as one opaque node. ``grid``: a
    block mask's bool grid (``jagflash.core.block_mask.BlockMask.to_dense``): tiles cost its
    listed blocks."""
    return _build(q_offsets, kv_offsets, PlanInfo.from_ints(info), grid)


@build_plan.register_fake
def _(q_offsets, kv_offsets, info, grid=None):
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


def build_plan_ints(
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, block_mask=None, **info
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """``(tiles, meta, info ints)`` of the plan ``jagflash.core.plan.model.plan_info(**info)``
    over these offsets: what a call without ``plan=`` passes to its op; a ``block_mask``
    (``jagflash.core.block_mask.BlockMask``) costs its tiles by its listed blocks."""
    ints = plan_info(**info).to_ints()
    fwd = PlanInfo.from_ints(ints).passes[0]
    tiles, meta = build_plan(q_offsets, kv_offsets, ints, plan_grid(block_mask, (fwd.block_m, fwd.block_n)))
    return tiles, meta, ints


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
    block_mask=None,
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
            (cost-sorted, atomic tile counter), ``"dynamic-grouped"`` (grouped's table, atomic
            tile counter) or ``"none"`` (batch order, one program a tile).
        backward_schedule: the backward passes' kind (default: ``schedule``'s).
        backward: also lay out the dQ and dK/dV passes (``False`` for inference only).
        block_mask: a ``jagflash.core.block_mask.BlockMask``: tiles cost its listed blocks
            (its block size should be every pass's tile size).
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
    tiles, meta = build_plan(q_offsets, kv_offsets, info.to_ints(), plan_grid(block_mask, (block_m, block_n)))
    return Plan(tiles, meta, info, q_offsets, kv_offsets)
