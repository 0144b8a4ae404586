"""Block patterns of the block-sparse workloads (``bs-*``), and the same mask in each peer's form.

A :class:`BlockPattern` is seeded data, like a workload's lengths: on every machine and in every
process (the host-Triton worker rebuilds it) the same batch gets the same block grid. Grids are
``[B, 1, nQ, nK]`` bool (one list for every head), blocks counted from each sequence's first row
as in :class:`jagflash.core.block_mask.BlockMask`. Under ``causal`` a pattern lists only blocks
that the (bottom-right aligned) causal band reaches, so ``density`` is a share of the blocks a
causal dense call computes and the ideal speed-up over it is ``1 / density``.

Kinds:

* ``random``: each band block listed with probability ``density`` (``torch.Generator`` on the
  CPU seeded with ``seed``, then moved: the same grid on every device);
* ``local_global``: :func:`jagflash.core.block_mask.local_global` (``before`` blocks back, the
  diagonal, ``sinks`` global blocks);
* ``top_k``: per q-block the ``k`` band blocks of highest random scores
  (:func:`jagflash.core.block_mask.top_k`).

The mask in each peer's form: :func:`mask_mod` (FlexAttention's contract, per-sequence
coordinates: what ``BlockMask.from_mask_mod`` is timed on), :func:`fa4_block_sparse`
(FlashAttention-4's varlen block-sparse tensors); FlexAttention's document + block mask_mod is
the flex provider's (``jagflash.bench.providers``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "PATTERN_KINDS", "BlockPattern", "band_density", "document_mask_mod", "fa4_block_sparse", "grid", "make_block_mask", "mask_mod",
    "mask_mod_reads_b",
]

PATTERN_KINDS = ("random", "local_global", "top_k")


@dataclass(frozen=True)
class BlockPattern:
    """Which blocks a ``bs-*`` workload lists (module docstring); ``block`` is the square block
    size (128: the TLX kernels' size; smoke workloads use 64)."""

    kind: str
    density: float = 0.0
    before: int = 0
    sinks: int = 1
    k: int = 0
    block: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if self.kind not in PATTERN_KINDS:
            problems.append(f"kind {self.kind!r} not in {PATTERN_KINDS}")
        if self.kind == "random" and not 0.0 <= self.density <= 1.0:
            problems.append(f"density {self.density} not in [0, 1]")
        if self.kind == "top_k" and self.k < 1:
            problems.append(f"top_k needs k >= 1, got {self.k}")
        if problems:
            raise ValueError("BlockPattern: " + "; ".join(problems))

    def describe(self) -> str:
        if self.kind == "random":
            what = f"random {self.density:.0%} of blocks"
        elif self.kind == "local_global":
            what = f"local {self.before} blocks back + {self.sinks} sink block(s)"
        else:
            what = f"top-{self.k} blocks per q-block"
        return f"{what}, {self.block}x{self.block} blocks"


def _band(nq: int, nk: int, q_lens: torch.Tensor, kv_lens: torch.Tensor, block: int) -> torch.Tensor:
    """``[B, 1, nQ, nK]``: blocks the bottom-right causal band reaches (some pair ``j <= i + lk - lq``)."""
    i = torch.arange(nq)[None, :, None]
    j = torch.arange(nk)[None, None, :]
    shift = (kv_lens - q_lens).view(-1, 1, 1)
    return (j * block <= (i + 1) * block - 1 + shift)[:, None]


def grid(pattern: BlockPattern, q_lens, kv_lens, causal: bool) -> torch.Tensor:
    """The pattern's bool grid ``[B, 1, nQ, nK]`` on the CPU (entries past a sequence's blocks
    may be set: ``BlockMask.from_dense`` ignores them)."""
    from jagflash.core import block_mask as bmod

    lq = torch.as_tensor(list(q_lens), dtype=torch.int64)
    lk = torch.as_tensor(list(kv_lens), dtype=torch.int64)
    bs = pattern.block
    nq = max(1, -(-int(lq.max()) // bs)) if lq.numel() else 1
    nk = max(1, -(-int(lk.max()) // bs)) if lk.numel() else 1
    band = _band(nq, nk, lq, lk, bs) if causal else torch.ones(len(lq), 1, nq, nk, dtype=torch.bool)
    gen = torch.Generator().manual_seed(pattern.seed)
    if pattern.kind == "random":
        g = torch.rand(len(lq), 1, nq, nk, generator=gen) < pattern.density
    elif pattern.kind == "local_global":
        qo, ko = _offsets(lq), _offsets(lk)
        m = bmod.local_global(
            qo, ko, before=pattern.before, after=0, sinks=pattern.sinks, block_size=(bs, bs),
            max_seqlen_q=nq * bs, max_seqlen_kv=nk * bs,
        )
        g = m.to_dense()
    else:
        scores = torch.rand(len(lq), 1, nq, nk, generator=gen).masked_fill(~band, -1.0)
        g = bmod.top_k(scores, pattern.k, _offsets(lq), _offsets(lk), (bs, bs)).to_dense()
    return g & band


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)


def make_block_mask(pattern: BlockPattern, q_lens, kv_lens, causal: bool, q_offsets, kv_offsets):
    """The workload's ``BlockMask`` on the offsets' device (``from_dense`` of :func:`grid`)."""
    from jagflash.core.block_mask import BlockMask

    g = grid(pattern, q_lens, kv_lens, causal).to(q_offsets.device)
    return BlockMask.from_dense(g, q_offsets, kv_offsets, (pattern.block, pattern.block))


def band_density(block_mask, causal: bool) -> float:
    """Listed blocks over the blocks of every sequence that the band reaches (all of them
    without ``causal``): the ``density`` a pattern was drawn at, as realised."""
    bm, bn = block_mask.block_size
    lq = block_mask.q_offsets[1:] - block_mask.q_offsets[:-1]
    lk = block_mask.kv_offsets[1:] - block_mask.kv_offsets[:-1]
    nq, nk = block_mask.grid
    i = torch.arange(nq, device=lq.device)[None, :, None]
    j = torch.arange(nk, device=lq.device)[None, None, :]
    inside = (i * bm < lq.view(-1, 1, 1)) & (j * bn < lk.view(-1, 1, 1))
    if causal:
        inside &= j * bn <= (i + 1) * bm - 1 + (lk - lq).view(-1, 1, 1)
    total = int(inside.sum()) * block_mask.heads
    return int(block_mask.kv_counts.sum()) / total if total else 0.0


def mask_mod(pattern: BlockPattern, block_mask):
    """FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)`` of the workload's mask, per-sequence
    coordinates: the local + global rule itself for ``local_global`` (block arithmetic), a
    lookup of the listed grid otherwise (the form a user holding a random or top-k grid writes).
    ``BlockMask.from_mask_mod`` of it lists exactly ``block_mask``'s blocks (blocks a causal
    band does not reach are dropped by the kernels and the reference alike: see :func:`grid`)."""
    bs = pattern.block
    dense = block_mask.to_dense()[:, 0]  # [B, nQ, nK]
    nq, nk = dense.shape[1], dense.shape[2]
    if pattern.kind == "local_global":
        before, sinks = pattern.before, pattern.sinks

        def local_global(b, h, q_idx, kv_idx):
            qb, kb = q_idx // bs, kv_idx // bs
            return ((kb <= qb) & (kb >= qb - before)) | (kb < sinks)

        return local_global

    def lookup(b, h, q_idx, kv_idx):
        return dense[b, (q_idx // bs).clamp(0, nq - 1), (kv_idx // bs).clamp(0, nk - 1)]

    return lookup


def mask_mod_reads_b(pattern: BlockPattern) -> bool:
    """Whether :func:`mask_mod` of ``pattern`` reads its ``b`` (the lookups do; the local +
    global rule is the same in every sequence): ``per_sequence`` of ``BlockMask.from_mask_mod``."""
    return pattern.kind != "local_global"


def document_mask_mod(batch, median: int = 200, seed: int = 0):
    """Causal documents inside each sequence: token ``t`` of the packed batch has a document id
    (lognormal document lengths, median ``median``, restarted at every sequence), q and k of one
    sequence see each other where they share a document and ``kv_idx <= q_idx``."""
    gen = torch.Generator().manual_seed(seed)
    ids = []
    for n in batch.q_lens:
        lengths = (torch.randn(max(1, n // 8 + 1), generator=gen) + float(torch.tensor(median).log())).exp().long().clamp(min=1)
        ids.append(torch.repeat_interleave(torch.arange(lengths.numel()), lengths)[:n])
    dev = batch.q_offsets.device
    doc = torch.cat([*ids, torch.zeros(1, dtype=torch.int64)]).to(dev)
    last = doc.numel() - 1
    start = batch.q_offsets.to(torch.int64)

    def documents(b, h, q_idx, kv_idx):
        qd = doc[(start[b] + q_idx).clamp(max=last)]
        kd = doc[(start[b] + kv_idx).clamp(max=last)]
        return (qd == kd) & (kv_idx <= q_idx)

    return documents


def fa4_block_sparse(block_mask, tensors_type, *, causal: bool):
    """``block_mask`` as FlashAttention-4's varlen block-sparse forward tensors
    (``flash_attn.cute.block_sparsity.BlockSparseTensorsTorch``, passed as ``tensors_type``),
    each q-block's listed kv-blocks split into FA4's two lists:

    * "full" (``full_block_cnt`` / ``full_block_idx``): every pair of the block visible, so
      FA4 may run it without a score mask: q-block ``i``'s rows ``[i·bm, (i+1)·bm)`` all below
      ``Lq``, kv-block ``j``'s keys ``[j·bn, (j+1)·bn)`` all below ``Lk`` and, with ``causal``,
      inside the bottom-right causal band (``(j+1)·bn - 1 <= i·bm + Lk - Lq``, FA4's convention
      and jagflash's): the unmasked body of :func:`jagflash.core.mask.kv_tile_ranges`;
    * "mask" (``mask_block_cnt`` / ``mask_block_idx``): every other listed block (FA4 applies
      causal and the sequence's end inside it).

    Both lists in one varlen layout, per head (``Hm`` of the mask: 1, broadcast, or the query
    heads): the counts of every q-block of every sequence back to back (``[Hm, Σ nQ_b]``,
    sequence ``b`` from ``cu_total_m_blocks[b]``, ``[B+1]``) and, per q-block, a row of the
    sequence's own ``nK_b`` slots (``[Hm, Σ nQ_b·nK_b]``, q-block ``i`` of sequence ``b`` at
    ``cu_block_idx_offsets[b] + i·nK_b``, ``[B+1]``) holding the list's blocks first, ascending,
    the other slots 0. Ascending matters: FA4 walks each list from its end and bounds the keys
    by ``Lk`` only in the first block it walks, so a sequence's last (partial) kv-block must be
    its list's last entry. int32, on the mask's device; ``block_size`` the mask's. No window
    (the FA4 provider refuses one). Reads the lengths on the host: for a prepare step, outside
    any timing."""
    from jagflash.core.mask import kv_tile_ranges, mask_bounds

    bm, bn = block_mask.block_size
    left, right = mask_bounds(causal)
    dev = block_mask.kv_counts.device
    lq = (block_mask.q_offsets[1:] - block_mask.q_offsets[:-1]).tolist()
    lk = (block_mask.kv_offsets[1:] - block_mask.kv_offsets[:-1]).tolist()
    lists = {"mask": ([], []), "full": ([], [])}
    cu_m, cu_idx = [0], [0]
    for b, (n, m) in enumerate(zip(lq, lk)):
        nqb, nkb = -(-n // bm), -(-m // bn)
        index = block_mask.kv_indices[b, :, :nqb, :nkb].long()  # [Hm, nqb, nkb]
        listed = torch.arange(nkb, device=dev) < block_mask.kv_counts[b, :, :nqb, None]
        m0 = torch.arange(nqb, device=dev) * bm
        lens = (torch.full_like(m0, n), torch.full_like(m0, m))  # shaped as m0: an unbounded side returns lk itself
        _, full_lo, full_hi, _ = kv_tile_ranges(m0, *lens, bm, bn, left, right)
        rows_in = (m0 + bm <= n)[:, None]
        full = listed & rows_in & (index * bn >= full_lo[:, None]) & ((index + 1) * bn <= full_hi[:, None])
        for name, keep in (("mask", listed & ~full), ("full", full)):
            counts, indices = _kept_first(index, keep)
            lists[name][0].append(counts)
            lists[name][1].append(indices.reshape(indices.shape[0], -1))
        cu_m.append(cu_m[-1] + nqb)
        cu_idx.append(cu_idx[-1] + nqb * nkb)
    i32 = dict(dtype=torch.int32, device=dev)
    cat = {name: [torch.cat(part, 1).to(torch.int32).contiguous() for part in parts] for name, parts in lists.items()}
    return tensors_type(
        mask_block_cnt=cat["mask"][0],
        mask_block_idx=cat["mask"][1],
        full_block_cnt=cat["full"][0],
        full_block_idx=cat["full"][1],
        cu_total_m_blocks=torch.tensor(cu_m, **i32),
        cu_block_idx_offsets=torch.tensor(cu_idx, **i32),
        block_size=(bm, bn),
    )


def _kept_first(index: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts ``[...]`` and rows ``[..., n]`` of ``index [..., n]`` holding its ``keep`` slots
    first, in their order, the other slots 0."""
    order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices
    return keep.sum(-1), torch.gather(index * keep, -1, order)
