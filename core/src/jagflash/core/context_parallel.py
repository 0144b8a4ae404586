"""Context parallelism: one jagged batch's tokens sharded over a process group, attention run
as a ring (``torch.distributed`` point-to-point: ``isend`` / ``irecv``).

Every rank holds some rows of the batch (a :class:`ShardLayout` says which: per rank, chunks
``(sequence, start, length)`` in local row order). Each rank's queries attend to every rank's
K/V: the K/V blocks travel round the ring, rank ``r`` sending its current block to ``r + 1``
while it runs its attention on that block, and the partial outputs are merged by their LSE
(:func:`jagflash.core.softmax.merge_partials`). The backward passes K/V round the ring again,
each block followed by its dK/dV accumulator, which arrives home after the last step.

Causal masks keep DESIGN.md's bottom-right semantics in global positions: query ``i`` of a
sequence with ``Lq`` queries and ``Lk`` keys sees key ``j`` iff ``j <= i + Lk - Lq``, whichever
ranks hold them. A (query chunk, key chunk) pair of one sequence splits into rows that see no
key of the chunk (skipped), rows that see part of it (a bottom-right causal call on a cut of
the chunk) and rows that see all of it (a call without mask), so the variant's own causal
kernels serve any sharding; several pairs run as one call whose offsets hold the pairs and
empty sequences over the rows between them (no data is copied). :func:`balanced_layout` deals
each sequence's ``2 * world`` chunks zigzag (rank ``r`` a head chunk ``r`` and a tail chunk
``2 * world - 1 - r``), which evens the causal work; :func:`contiguous_layout` cuts the token
axis into ``world`` ranges (sequences then span shards or lie wholly inside one).

The attention runs through an installed variant found by the registry
(:func:`jagflash.core.registry.variants`, ``jagged`` by default): its public function with
``return_lse=True`` forward, its ``Variant.backward`` at the merged output and LSE backward.
Core imports no variant; the registry is the run-time route to one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise

import torch
import torch.distributed as dist

from jagflash.core.capability import InvalidInput, UnsupportedProblem
from jagflash.core.ops import default_scale
from jagflash.core.registry import broken_variants, variants
from jagflash.core.softmax import merge_partials

__all__ = [
    "RingCall",
    "ShardLayout",
    "attend_block",
    "attend_block_backward",
    "balanced_layout",
    "contiguous_layout",
    "find_variant",
    "ring_attention",
    "ring_calls",
    "shard",
    "unshard",
]

Chunk = tuple[int, int, int]  # (sequence, start in the sequence, length)


@dataclass(frozen=True)
class ShardLayout:
    """Where every row of a jagged batch lives over ``world`` ranks.

    ``lengths[b]``: sequence ``b``'s length in the whole batch. ``chunks[r]``: rank ``r``'s
    rows in its local order, as ``(sequence, start, length)`` runs of consecutive positions
    of one sequence. Every position of every sequence is in exactly one chunk (checked at
    construction, :class:`InvalidInput` otherwise). Hashable: per-rank tables are cached on it.
    """

    world: int
    lengths: tuple[int, ...]
    chunks: tuple[tuple[Chunk, ...], ...]

    def __post_init__(self) -> None:
        reasons = []
        if self.world < 1 or len(self.chunks) != self.world:
            reasons.append(f"{len(self.chunks)} ranks' chunks for a world of {self.world}")
        seen: list[list[tuple[int, int]]] = [[] for _ in self.lengths]
        for r, chunks in enumerate(self.chunks):
            for b, start, n in chunks:
                if not 0 <= b < len(self.lengths) or start < 0 or n < 0 or start + n > self.lengths[b]:
                    reasons.append(f"rank {r}: chunk {(b, start, n)} outside the sequences {self.lengths}")
                elif n:
                    seen[b].append((start, start + n))
        for b, runs in enumerate(seen):
            runs.sort()
            pos = 0
            for a, e in runs:
                if a != pos:
                    reasons.append(f"sequence {b}: positions {min(a, pos)}..{max(a, pos)} held {'twice' if a < pos else 'by no rank'}")
                pos = max(pos, e)
            if pos < self.lengths[b]:
                reasons.append(f"sequence {b}: positions {pos}..{self.lengths[b]} held by no rank")
        if reasons:
            raise InvalidInput("ShardLayout", reasons)

    def rows(self, rank: int) -> int:
        """How many rows rank ``rank`` holds."""
        return sum(n for _, _, n in self.chunks[rank])

    def local_offsets(self, rank: int, device: torch.device | str | None = None) -> torch.Tensor:
        """``[B+1]`` int32 offsets of rank ``rank``'s rows as a jagged batch (per sequence, the
        rows it holds; zero where none): for row-wise ops on the local shard. Its chunks must
        be in sequence order (both layouts here are)."""
        per = [0] * len(self.lengths)
        last = -1
        for b, _, n in self.chunks[rank]:
            if b < last:
                raise InvalidInput("ShardLayout.local_offsets", [f"rank {rank}'s chunks are not in sequence order"])
            last = b
            per[b] += n
        return torch.tensor([0, *accumulate(per)], dtype=torch.int32, device=device)

    def index(self, rank: int, device: torch.device | str | None = None) -> torch.Tensor:
        """``[rows(rank)]`` int64: each local row's row in the whole batch."""
        starts = [0, *accumulate(self.lengths)]
        idx = [starts[b] + start + i for b, start, n in self.chunks[rank] for i in range(n)]
        return torch.tensor(idx, dtype=torch.int64, device=device)


def _lengths(offsets: torch.Tensor | Sequence[int]) -> tuple[int, ...]:
    offs = offsets.tolist() if isinstance(offsets, torch.Tensor) else list(offsets)
    return tuple(int(b) - int(a) for a, b in pairwise(offs))


def _check_world(who: str, world: int) -> None:
    if not isinstance(world, int) or world < 1:
        raise InvalidInput(who, [f"world must be a positive int, got {world!r}"])


def contiguous_layout(offsets: torch.Tensor | Sequence[int], world: int) -> ShardLayout:
    """The token axis cut into ``world`` consecutive ranges of ``ceil(T / world)`` rows (the
    last ones shorter or empty): sequences span shards or lie wholly inside one."""
    _check_world("contiguous_layout", world)
    lengths = _lengths(offsets)
    total = sum(lengths)
    per = math.ceil(total / world) if total else 0
    chunks: list[list[Chunk]] = [[] for _ in range(world)]
    starts = [0, *accumulate(lengths)]
    for r in range(world):
        lo, hi = min(r * per, total), min((r + 1) * per, total)
        for b, n in enumerate(lengths):
            a, e = max(lo, starts[b]), min(hi, starts[b] + n)
            if e > a:
                chunks[r].append((b, a - starts[b], e - a))
    return ShardLayout(world, lengths, tuple(tuple(c) for c in chunks))


def balanced_layout(offsets: torch.Tensor | Sequence[int], world: int) -> ShardLayout:
    """Load-balanced causal sharding: each sequence cut into ``2 * world`` chunks (lengths
    differ by at most one, the longer first), rank ``r`` holding chunk ``r`` (a head) and chunk
    ``2 * world - 1 - r`` (a tail), so every rank has about the same causal work on every
    sequence. Local rows: sequence by sequence, head chunk then tail chunk."""
    _check_world("balanced_layout", world)
    lengths = _lengths(offsets)
    parts = 2 * world
    chunks: list[list[Chunk]] = [[] for _ in range(world)]
    for b, n in enumerate(lengths):
        size = [n // parts + (1 if c < n % parts else 0) for c in range(parts)]
        start = [0, *accumulate(size)]
        for r in range(world):
            for c in (r, parts - 1 - r):
                if size[c]:
                    chunks[r].append((b, start[c], size[c]))
    return ShardLayout(world, lengths, tuple(tuple(c) for c in chunks))


def shard(x: torch.Tensor, layout: ShardLayout, rank: int) -> torch.Tensor:
    """Rank ``rank``'s rows of the whole batch's ``x [T, ...]`` (a copy, in local order)."""
    if x.shape[0] != sum(layout.lengths):
        raise InvalidInput("shard", [f"x has {x.shape[0]} rows, the layout's batch {sum(layout.lengths)}"])
    return x.index_select(0, layout.index(rank, x.device))


def unshard(parts: Sequence[torch.Tensor], layout: ShardLayout, *, dim: int = 0) -> torch.Tensor:
    """The whole batch from every rank's local rows (``parts[r]``, as :func:`shard` gave
    them; rows along ``dim``, e.g. ``dim=1`` for an LSE ``[H, T]``)."""
    reasons = [] if len(parts) == layout.world else [f"{len(parts)} parts for a world of {layout.world}"]
    reasons += [
        f"part {r} has {p.shape[dim]} rows along dim {dim}, the layout gives it {layout.rows(r)}"
        for r, p in enumerate(parts[: layout.world]) if p.shape[dim] != layout.rows(r)
    ]
    if reasons:
        raise InvalidInput("unshard", reasons)
    stacked = torch.cat(list(parts), dim)
    index = torch.cat([layout.index(r, stacked.device) for r in range(layout.world)])
    out = torch.empty_like(stacked)
    out.index_copy_(dim, index, stacked)
    return out


# --- the ring's calls ---------------------------------------------------------------------


@dataclass(frozen=True)
class RingCall:
    """One variant call of a ring step: the step's queries (all local rows) against the K/V
    block at hand, as a jagged batch of (query rows, key rows) pairs with empty sequences over
    the rows between them. ``q_offsets`` / ``kv_offsets`` are host ints; ``max_q`` /
    ``max_kv`` their longest sequences."""

    causal: bool
    q_offsets: tuple[int, ...]
    kv_offsets: tuple[int, ...]
    max_q: int
    max_kv: int


def _pairs(q_layout: ShardLayout, kv_layout: ShardLayout, rank: int, source: int, causal: bool):
    """(causal, q row, q rows, kv row, kv rows) of rank ``rank``'s queries against rank
    ``source``'s keys, in local rows of each: rows that see none of a key chunk are left out,
    rows that see all of it pair without mask, the rest with a bottom-right causal cut."""
    kv_rows: dict[int, list[tuple[int, int, int]]] = {}
    row = 0
    for b, start, n in kv_layout.chunks[source]:
        kv_rows.setdefault(b, []).append((start, n, row))
        row += n
    out = []
    qrow = 0
    for b, qa, nq in q_layout.chunks[rank]:
        for ka, nk, krow in kv_rows.get(b, ()):
            if nq == 0 or nk == 0:
                continue
            if not causal:
                out.append((False, qrow, nq, krow, nk))
                continue
            # local query i sees local key j iff j <= i + d (global bottom-right rule)
            d = qa - ka + kv_layout.lengths[b] - q_layout.lengths[b]
            r0 = min(max(-d, 0), nq)
            r1 = min(max(nk - 1 - d, 0), nq)
            if r1 > r0:  # rows r0..r1 see keys 0..i+d: bottom-right causal over keys 0..r1+d
                out.append((True, qrow + r0, r1 - r0, krow, r1 + d))
            if nq > r1:
                out.append((False, qrow + r1, nq - r1, krow, nk))
        qrow += nq
    return out


def _chains(pairs, causal: bool):
    """Pairs grouped into calls whose query rows and key rows both increase (a jagged batch);
    unmasked pairs that continue the previous one on the same keys (or the same queries) are
    joined into one."""
    calls: list[list[list[int]]] = []
    for p in sorted(pairs, key=lambda p: (p[1], p[3])):
        _, q0, nq, k0, nk = p
        for call in calls:
            last = call[-1]
            if not causal and last[2] == k0 and last[3] == nk and last[0] + last[1] == q0:
                last[1] += nq
                break
            if not causal and last[0] == q0 and last[1] == nq and last[2] + last[3] == k0:
                last[3] += nk
                break
            if last[0] + last[1] <= q0 and last[2] + last[3] <= k0:
                call.append([q0, nq, k0, nk])
                break
        else:
            calls.append([[q0, nq, k0, nk]])
    return calls


def _offsets(call: list[list[int]], total_q: int, total_kv: int, causal: bool) -> RingCall:
    qo, ko = [0], [0]

    def seq(nq: int, nk: int) -> None:
        qo.append(qo[-1] + nq)
        ko.append(ko[-1] + nk)

    for q0, nq, k0, nk in [*call, [total_q, 0, total_kv, 0]]:
        if q0 > qo[-1]:
            seq(q0 - qo[-1], 0)  # queries of no pair here: no key, output 0, LSE -inf
        if k0 > ko[-1]:
            seq(0, k0 - ko[-1])  # keys of no pair here: no query
        if nq or nk:
            seq(nq, nk)
    lq = [b - a for a, b in pairwise(qo)]
    lk = [b - a for a, b in pairwise(ko)]
    return RingCall(causal, tuple(qo), tuple(ko), max(lq, default=0), max(lk, default=0))


@functools.lru_cache(maxsize=64)
def ring_calls(
    q_layout: ShardLayout, kv_layout: ShardLayout, rank: int, causal: bool
) -> tuple[tuple[RingCall, ...], ...]:
    """Rank ``rank``'s calls for each ring step ``t`` (the K/V block of rank
    ``(rank - t) % world``): host tables, built once per layout, rank and mask. A step whose
    keys no local query sees has no call."""
    world = q_layout.world
    steps = []
    for t in range(world):
        source = (rank - t) % world
        pairs = _pairs(q_layout, kv_layout, rank, source, causal)
        calls = []
        for masked in (True, False):
            group = [p for p in pairs if p[0] == masked]
            for chain in _chains(group, masked):
                calls.append(_offsets(chain, q_layout.rows(rank), kv_layout.rows(source), masked))
        steps.append(tuple(calls))
    return tuple(steps)


# --- the ring -----------------------------------------------------------------------------


class _Ring:
    """The process group as a ring: rank ``r`` sends to ``r + 1`` and receives from ``r - 1``
    (global ranks for torch.distributed's point-to-point calls)."""

    def __init__(self, group) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world) if group is not None else (self.rank + 1) % self.world
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world) if group is not None else (self.rank - 1) % self.world
        self.pending: list = []

    def shift(self, tensors: Sequence[torch.Tensor], shapes: Sequence[tuple[int, ...]], tag: int) -> list[torch.Tensor]:
        """Post the sends of ``tensors`` to the next rank and the receives of buffers shaped
        ``shapes`` from the previous; returns the buffers (valid after :meth:`wait`). Empty
        tensors travel without a message (both sides know the sizes)."""
        bufs, ops = [], []
        for i, (t, shape) in enumerate(zip(tensors, shapes)):
            if t.numel():
                ops.append(dist.P2POp(dist.isend, t.contiguous(), self.next, self.group, tag + i))
            buf = t.new_empty(shape)
            if buf.numel():
                ops.append(dist.P2POp(dist.irecv, buf, self.prev, self.group, tag + i))
            bufs.append(buf)
        if ops:  # one group: NCCL would deadlock on a send and a receive posted one by one
            self.pending.extend(dist.batch_isend_irecv(ops))
        return bufs

    def wait(self) -> None:
        for work in self.pending:
            work.wait()
        self.pending.clear()


_KV, _DKV = 0, 2  # message tags: k, v; dk, dv


def _kv_shape(t: torch.Tensor, layout: ShardLayout, rank: int) -> tuple[int, ...]:
    return (layout.rows(rank), *t.shape[1:])


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q_layout, kv_layout, group, causal, scale, variant, backend):
        ring = _Ring(group)
        steps = ring_calls(q_layout, kv_layout, ring.rank, causal)
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
        q, k, v = q.detach(), k.detach(), v.detach()  # the blocks' calls pose no backward
        kc, vc = k, v
        for t, calls in enumerate(steps):
            if t + 1 < ring.world:
                src = (ring.rank - t - 1) % ring.world
                nxt = ring.shift((kc, vc), [_kv_shape(k, kv_layout, src)] * 2, _KV)
            out, lse = attend_block(variant, q, kc, vc, calls, out, lse, scale=scale, backend=backend)
            if t + 1 < ring.world:
                ring.wait()
                kc, vc = nxt
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (q_layout, kv_layout, group, scale, variant, backend, steps)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        _q_layout, kv_layout, group, scale, variant, backend, steps = ctx.args
        ring = _Ring(group)
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kc, vc = k, v
        acc = None  # the dK/dV accumulator of the block at hand, arriving from the previous rank
        for t, calls in enumerate(steps):
            source = (ring.rank - t) % ring.world
            if t + 1 < ring.world:
                src = (source - 1) % ring.world
                nxt = ring.shift((kc, vc), [_kv_shape(k, kv_layout, src)] * 2, _KV)
            dk, dv = attend_block_backward(variant, dout, q, kc, vc, out, lse, calls, dq, scale=scale, backend=backend)
            ring.wait()  # this step's K/V prefetch, and the accumulator sent at the last step
            if acc is not None:
                dk += acc[0]
                dv += acc[1]
            if ring.world > 1:
                # on to the next rank; from the previous comes the block of the next step (after
                # the last step: this rank's own, complete)
                acc = ring.shift((dk, dv), [_kv_shape(dk, kv_layout, (source - 1) % ring.world)] * 2, _DKV)
            else:
                acc = (dk, dv)
            if t + 1 < ring.world:
                kc, vc = nxt
        ring.wait()
        dk, dv = acc
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None


def attend_block(variant, q, k, v, calls, out, lse, *, scale: float, backend: str | None):
    """One ring step forward: ``calls`` (of :func:`ring_calls`) of this rank's queries ``q``
    over the K/V block at hand, merged into the running ``out`` (fp32) and ``lse``; returns the
    new pair. ``variant``: a :class:`~jagflash.core.registry.Variant` (:func:`find_variant`)."""
    for call in calls:
        part, part_lse = variant.run(
            q, k, v, **_call_args(call, q.device), causal=call.causal, scale=scale,
            return_lse=True, backend=backend,
        )
        out, lse = merge_partials(out, lse, part, part_lse)
    return out, lse


def attend_block_backward(variant, dout, q, k, v, out, lse, calls, dq, *, scale: float, backend: str | None):
    """One ring step backward at the merged ``out``/``lse``: adds the block's dQ share to
    ``dq`` (fp32, in place) and returns the block's own ``(dk, dv)`` (fp32)."""
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for call in calls:
        gq, gk, gv = variant.backward(
            dout, q, k, v, out, lse, **_call_args(call, q.device), causal=call.causal,
            scale=scale, backend=backend,
        )
        dq += gq
        dk += gk
        dv += gv
    return dk, dv


def _call_args(call: RingCall, device: torch.device) -> dict:
    qo, ko = _device_offsets(call, device)
    return {"q_offsets": qo, "kv_offsets": ko, "max_seqlen_q": call.max_q, "max_seqlen_kv": call.max_kv}


@functools.lru_cache(maxsize=256)
def _device_offsets(call: RingCall, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.tensor(call.q_offsets, dtype=torch.int32, device=device),
        torch.tensor(call.kv_offsets, dtype=torch.int32, device=device),
    )


def find_variant(name: str = "jagged"):
    """The installed variant ``name`` if it can serve a ring (the jagged layout and a
    ``Variant.backward``), else :class:`UnsupportedProblem` with every reason."""

    found = variants()
    var = found.get(name)
    if var is None:
        why = broken_variants().get(name, f"not installed (installed: {sorted(found) or 'none'})")
        raise UnsupportedProblem("ring_attention", [f"variant {name!r}: {why}"])
    reasons = []
    if "jagged" not in var.spec.layouts:
        reasons.append(f"variant {name!r} does not take the jagged layout")
    if var.backward is None:
        reasons.append(f"variant {name!r} has no backward at a given output and LSE (Variant.backward)")
    if reasons:
        raise UnsupportedProblem("ring_attention", reasons)
    return var


@torch.compiler.disable  # host tables and point-to-point calls: a graph break under torch.compile
def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: ShardLayout,
    *,
    kv_layout: ShardLayout | None = None,
    group: dist.ProcessGroup | None = None,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    variant: str = "jagged",
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of a jagged batch sharded over ``group`` (default: the world), with autograd.

    Args:
        q: ``[rows(rank), Hq, D]`` this rank's query rows (``layout.chunks[rank]``, e.g.
            :func:`shard` of the whole batch's q).
        k, v: ``[kv_layout.rows(rank), Hkv, D]`` this rank's key/value rows; ``Hq % Hkv == 0``.
        layout: where the queries live (:func:`balanced_layout`, :func:`contiguous_layout`, or
            any :class:`ShardLayout` of ``world`` = the group's size); the same on every rank.
        kv_layout: where the keys live, default ``layout`` (self-attention). Its sequences
            may have other lengths (cross-attention).
        causal: bottom-right aligned in each sequence's global positions (DESIGN.md): query
            ``i`` of a sequence with ``Lq`` queries and ``Lk`` keys sees key ``j <= i + Lk - Lq``.
        scale: default ``1/sqrt(D)``.
        return_lse: also return this rank's LSE ``[Hq, rows]`` fp32 (no gradient).
        variant, backend: the installed variant that runs each block (its public function
            forward, its ``Variant.backward`` backward) and its backend (``None``: its choice).

    Returns:
        ``out [rows, Hq, D]`` in q's dtype: for each local query, attention over every key of
        its sequence on every rank (rows that see no key: 0, LSE -inf, zero gradients), equal
        to the single-process :func:`unshard`-ed call. dK/dV come back to the rank that holds
        the keys. Every rank must call it (it communicates); K/V move ``world - 1`` times
        forward and backward, dK/dV ``world`` times.
    """
    kv_layout = layout if kv_layout is None else kv_layout
    world = dist.get_world_size(group) if dist.is_initialized() else None
    reasons = []
    if world is None:
        reasons.append("torch.distributed is not initialised (init_process_group)")
    else:
        rank = dist.get_rank(group)
        for name, lay in (("layout", layout), ("kv_layout", kv_layout)):
            if lay.world != world:
                reasons.append(f"{name} is for {lay.world} ranks, the group has {world}")
        if len(layout.lengths) != len(kv_layout.lengths):
            reasons.append(f"layout has {len(layout.lengths)} sequences, kv_layout {len(kv_layout.lengths)}")
        if not reasons:
            for name, t, lay in (("q", q, layout), ("k", k, kv_layout), ("v", v, kv_layout)):
                if t.dim() != 3 or t.shape[0] != lay.rows(rank):
                    reasons.append(f"{name} must be [{lay.rows(rank)}, H, D] (rank {rank}'s rows), got {tuple(t.shape)}")
    if q.dim() == 3 and k.dim() == 3 and (k.shape[1] == 0 or q.shape[1] % k.shape[1] or q.shape[2] != k.shape[2]):
        reasons.append(f"q [.., {q.shape[1]}, {q.shape[2]}] and k [.., {k.shape[1]}, {k.shape[2]}]: Hq % Hkv == 0 and equal head dims needed")
    if reasons:
        raise InvalidInput("ring_attention", reasons)
    var = find_variant(variant)
    out, lse = _RingAttention.apply(
        q, k, v, layout, kv_layout, group, bool(causal), default_scale(scale, q.shape[-1]), var, backend
    )
    return (out, lse) if return_lse else out
