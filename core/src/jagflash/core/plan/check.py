"""Checking a Plan against the call that uses it, or building one for a call given none.

:func:`check_plan` refuses a plan built for another problem (:class:`InvalidInput` listing every
mismatch): the ints are compared on the host, the offsets by identity (the address the plan was
built from), else by fingerprint on the device (``torch._assert_async``, no sync).
:func:`resolve_plan` is what an op does with its ``plan_*`` arguments: check the plan it was
given, or build one with the default schedules when it was given none.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from jagflash.core.block_tiles import plan_grid
from jagflash.core.capability import InvalidInput
from jagflash.core.plan.build import _build, _ptr, offsets_fingerprint
from jagflash.core.plan.model import (
    PTR_SAME_CALL,
    PTR_UNKNOWN,
    Plan,
    PlanInfo,
    plan_info,
)
from jagflash.core.tuning import DEFAULT_BACKWARD_SCHEDULE, DEFAULT_SCHEDULE

__all__ = ["check_plan", "resolve_plan"]


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
    ints = (batch, total_q, total_kv, heads_q, heads_kv, left, right, blocks)
    reasons = [] if _ints_fit(info, *ints) else _int_reasons(info, *ints)
    if tiles.device != device or meta.device != device:
        reasons.append(f"the plan is on {tiles.device}, this call on {device}")
    if tiles.dtype != torch.int32 or tiles.dim() != 2 or tiles.shape[0] != info.rows or meta.shape != (5,):
        reasons.append("plan tensors do not match their info (tiles int32 [rows, 3], meta [5])")
    if reasons:
        raise InvalidInput(who, reasons)
    _check_offsets(who, info, meta, q_offsets, kv_offsets, device)


def _ints_fit(info: PlanInfo, batch, total_q, total_kv, heads_q, heads_kv, left, right, blocks) -> bool:
    """Whether the ints of :func:`check_plan` all agree (the common case, told without
    formatting a reason); :func:`_int_reasons` lists what does not."""
    if (info.batch, info.total_q, info.total_kv, info.heads_q, info.heads_kv, info.left, info.right) != (
        batch, total_q, total_kv, heads_q, heads_kv, left, right
    ):
        return False
    for name, bl in blocks.items():
        if name != "fwd" and not info.backward:
            return False
        lay = info.layout(name)
        if (lay.block_m, lay.block_n) != tuple(bl):
            return False
    return True


def _int_reasons(info: PlanInfo, batch, total_q, total_kv, heads_q, heads_kv, left, right, blocks) -> list[str]:
    """Every int of ``info`` that differs from the call's, as a reason."""
    reasons: list[str] = []

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
    return reasons


def _check_offsets(who: str, info: PlanInfo, meta, q_offsets, kv_offsets, device) -> None:
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
    block_mask=None,
) -> Plan:
    """What an op does with its ``plan_*`` arguments: check the plan it was given against the
    call (:func:`check_plan`), or, called without one (only by code that calls the op
    directly), build one for ``passes`` with :data:`DEFAULT_SCHEDULE`. ``derived_q``: the
    q offsets follow from the ints (broadcast-Q's output rows), so only the kv offsets' values
    are checked. A plan built here under a ``block_mask`` costs its listed blocks."""
    batch = q_offsets.numel() - 1
    if plan_tiles is None or plan_meta is None or plan_info_ints is None:
        info = plan_info(
            batch=batch, total_q=total_q, total_kv=total_kv, heads_q=heads_q, heads_kv=heads_kv,
            window=(left, right), blocks=blocks, max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv, schedule=DEFAULT_SCHEDULE,
            backward_schedule=DEFAULT_BACKWARD_SCHEDULE, backward=any(p != "fwd" for p in passes),
            q_ptr=PTR_SAME_CALL, kv_ptr=PTR_SAME_CALL,
        )
        fwd = info.passes[0]
        tiles, meta = _build(q_offsets, kv_offsets, info, plan_grid(block_mask, (fwd.block_m, fwd.block_n)))
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
