"""Block sparsity over jagged batches: :class:`BlockMask`, the visible kv-blocks of every q-block.

Sequence ``b`` of a jagged batch (``q_offsets``, ``kv_offsets``) is cut into q-blocks of
``block_m`` rows and kv-blocks of ``block_n`` keys, counted from each sequence's first row
(top-left). A :class:`BlockMask` lists, per sequence, per head (or one list for every head)
and per q-block, the kv-blocks the q-block may see, as compressed rows::

    kv_counts  [B, Hm, nQ]      int32   how many kv-blocks q-block i of sequence b lists
    kv_indices [B, Hm, nQ, nK]  int32   their indices, ascending, in the first kv_counts slots

and the transpose for the backward (per kv-block the q-blocks that list it)::

    q_counts   [B, Hm, nK]      int32
    q_indices  [B, Hm, nK, nQ]  int32

``Hm`` is 1 (every head shares the list) or the number of query heads; ``nQ`` / ``nK`` cover
the longest sequence (``ceil(max_L / block)``); slots past a sequence's own block count are
never listed. Everything lives on the offsets' device and is built there without a host sync
(given the max lengths, else one sync reads them). Element masks (causal, window) still apply
inside the listed blocks they cut; a block listed but outside the band is skipped.

Builders: :meth:`BlockMask.from_dense` (a bool grid), :meth:`BlockMask.from_lists` (the
compressed rows themselves, validated), :meth:`BlockMask.from_mask_mod`
(FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)``: a block is listed when any pair in it is
visible), :meth:`BlockMask.from_flex` (a ``torch.nn.attention.flex_attention.BlockMask``'s
block structure) and the named patterns :func:`local_global`, :func:`strided`, :func:`sessions`
and :func:`top_k`. The kernels read the lists through ``jagflash.core.mask``'s block iterator.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from jagflash.core.capability import InvalidInput, UnsupportedProblem
from jagflash.core.jagged import cdiv, seq_lengths
from jagflash.core.mask_mod import compile_supported, compiled_part, evaluate, function_of
from jagflash.core.mask_mod_kernel import Untraceable, build_lists, kernel_reasons

__all__ = ["BLOCK_SIZES", "BLOCK_SIZE_FEATURES", "BlockMask", "local_global", "mask_features", "sessions", "strided", "top_k"]

#: The block sizes ``(block_m, block_n)`` a BlockMask may have (the kernels tile by them).
BLOCK_SIZES = frozenset({(64, 64), (128, 128)})


def mask_features(block_size: tuple[int, int]) -> frozenset[str]:
    """The problem features (``jagflash.core.capability``) a call with a block mask of
    ``block_size`` poses: ``block_sparse`` and ``block_size_<bm>x<bn>``, so that a backend can
    take some block sizes only."""
    return frozenset({"block_sparse", f"block_size_{int(block_size[0])}x{int(block_size[1])}"})


#: The features of every block size: what a backend that takes them all declares.
BLOCK_SIZE_FEATURES = frozenset().union(*(mask_features(b) for b in BLOCK_SIZES))

_WHO = "BlockMask"


def _block_size(block_size: object) -> tuple[list[str], tuple[int, int]]:
    try:
        bm, bn = (int(x) for x in block_size)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return [f"block_size must be a pair of ints, got {block_size!r}"], (0, 0)
    if (bm, bn) not in BLOCK_SIZES:
        return [f"block_size {(bm, bn)} not in {sorted(BLOCK_SIZES)}"], (bm, bn)
    return [], (bm, bn)


_OFFSET_DTYPES = (torch.int32, torch.int64)


def _offsets_reasons(q_offsets: object, kv_offsets: object) -> list[str]:
    out = []
    for name, o in (("q_offsets", q_offsets), ("kv_offsets", kv_offsets)):
        if not isinstance(o, torch.Tensor) or o.dim() != 1 or o.numel() < 1 or o.dtype not in _OFFSET_DTYPES:
            out.append(f"{name} must be a 1-D int32/int64 tensor [B+1]")
    if not out and q_offsets.numel() != kv_offsets.numel():  # type: ignore[union-attr]
        out.append(f"q_offsets and kv_offsets have {q_offsets.numel() - 1} and {kv_offsets.numel() - 1} sequences")  # type: ignore[union-attr]
    if not out and q_offsets.device != kv_offsets.device:  # type: ignore[union-attr]
        out.append(f"q_offsets on {q_offsets.device}, kv_offsets on {kv_offsets.device}")  # type: ignore[union-attr]
    return out


def _block_counts(offsets: torch.Tensor, block: int) -> torch.Tensor:
    """Blocks of each sequence, int64 ``[B]``."""
    return torch.div(seq_lengths(offsets).clamp(min=0) + block - 1, block, rounding_mode="floor")


def _grid_blocks(offsets: torch.Tensor, block: int, max_seqlen: int | None) -> int:
    """Blocks of the longest sequence: from ``max_seqlen`` (no sync) or read (one sync)."""
    if max_seqlen is None:
        lengths = offsets[1:] - offsets[:-1]
        max_seqlen = int(lengths.max()) if lengths.numel() else 0
    return math.ceil(max(int(max_seqlen), 0) / block)


def _compress(grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts ``[...]`` and ascending indices ``[..., n]`` (int32) of a bool grid ``[..., n]``."""
    n = grid.shape[-1]
    counts = grid.sum(-1, dtype=torch.int32)
    slot = torch.where(grid, grid.cumsum(-1) - 1, n)  # a listed j's place in its row; the rest: a spare column
    indices = torch.zeros(*grid.shape[:-1], n + 1, dtype=torch.int32, device=grid.device)
    indices.scatter_(-1, slot, torch.arange(n, dtype=torch.int32, device=grid.device).expand(grid.shape))
    return counts.contiguous(), indices[..., :n].contiguous()


def _lists(grid: torch.Tensor, nq_b: torch.Tensor, nk_b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The four lists (kv counts, kv indices, q counts, q indices) of a bool grid
    ``[B, Hm, nQ, nK]``, its entries past each sequence's block counts ``nq_b`` / ``nk_b``
    dropped."""
    rows = torch.arange(grid.shape[2], device=grid.device)
    cols = torch.arange(grid.shape[3], device=grid.device)
    inside = (rows[None, :, None] < nq_b[:, None, None]) & (cols[None, None, :] < nk_b[:, None, None])
    grid = grid & inside[:, None]
    return (*_compress(grid), *_compress(grid.transpose(-1, -2)))


def _hit_lists(hits: torch.Tensor, nq: int, nk: int, nq_b: torch.Tensor, nk_b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:func:`_lists` of from_mask_mod's ``hits [heads, B * nq * nk + 1]`` (the last column: the
    invalid slots'), the grid's sizes passed as ints (compiled, two equal tensor sizes would be
    taken for one: a recompile whenever they part)."""
    grid = hits[:, :-1].view(hits.shape[0], nq_b.shape[0], nq, nk).transpose(0, 1)
    return _lists(grid, nq_b, nk_b)


#: Codes of the mask_mods whose fallback from the generated kernel was already reported.
_WARNED: set = set()


def _warn_fallback(mask_mod, reasons: list[str]) -> None:
    """Say once per mask_mod function why the generated kernel did not evaluate it."""
    code = getattr(function_of(mask_mod), "__code__", type(mask_mod))
    if code not in _WARNED:
        _WARNED.add(code)
        other = "torch.compile" if compile_supported() else "eager torch ops"
        warnings.warn(
            f"BlockMask.from_mask_mod: the generated kernel cannot evaluate this mask_mod ({'; '.join(reasons)}); "
            f"evaluating it with {other}, slower (pass evaluator= to choose)", stacklevel=3,
        )


def _plain_mask_mod_call(mask_mod, q_offsets, kv_offsets, heads, block_size, bounds, per_sequence, index_dtype, evaluator) -> bool:
    """The common call of :meth:`BlockMask.from_mask_mod`, valid at a glance (a few attribute
    reads: its host time is a build's); anything else goes through :func:`_mask_mod_reasons`."""
    return (
        type(q_offsets) is torch.Tensor and type(kv_offsets) is torch.Tensor and q_offsets.dtype in _OFFSET_DTYPES
        and kv_offsets.dtype in _OFFSET_DTYPES and q_offsets.dim() == 1 == kv_offsets.dim()
        and q_offsets.numel() == kv_offsets.numel() >= 1 and q_offsets.device == kv_offsets.device
        and type(block_size) is tuple and block_size in BLOCK_SIZES and type(heads) is int and heads >= 1
        and callable(mask_mod) and all(v is None or (type(v) is int and v >= 0) for v in bounds)
        and per_sequence in (True, False) and index_dtype in (torch.int32, torch.int64) and evaluator in (None, "kernel", "eager")
    )


def _mask_mod_reasons(mask_mod, q_offsets, kv_offsets, heads, block_size, bounds, per_sequence, index_dtype, evaluator) -> list[str]:
    """Every reason :meth:`BlockMask.from_mask_mod` refuses its arguments."""
    reasons = _offsets_reasons(q_offsets, kv_offsets)
    reasons += _block_size(block_size)[0]
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        reasons.append(f"heads must be an int >= 1, got {heads!r}")
    if not callable(mask_mod):
        reasons.append("mask_mod must be callable")
    for name, v in zip(("max_seqlen_q", "max_seqlen_kv", "total_q", "total_kv"), bounds):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            reasons.append(f"{name} must be an int >= 0 or None, got {v!r}")
    if per_sequence not in (True, False):
        reasons.append(f"per_sequence must be True or False, got {per_sequence!r}")
    if index_dtype not in (torch.int32, torch.int64):
        reasons.append(f"index_dtype must be torch.int32 or torch.int64, got {index_dtype!r}")
    if evaluator not in (None, "kernel", "compiled", "eager"):
        reasons.append(f"evaluator must be 'kernel', 'compiled', 'eager' or None, got {evaluator!r}")
    elif evaluator == "compiled" and not compile_supported():
        reasons.append("evaluator='compiled', but torch.compile is not supported in this Python (torch._dynamo.is_dynamo_supported())")
    return reasons


@dataclass(frozen=True, eq=False)
class BlockMask:
    """The visible kv-blocks of every q-block of a jagged batch (module docstring: layout).

    Build one with a builder, not the constructor; ``q_offsets`` / ``kv_offsets`` are the
    batch's (a call on other offsets is refused), ``block_size`` is ``(block_m, block_n)``.
    """

    kv_counts: torch.Tensor
    kv_indices: torch.Tensor
    q_counts: torch.Tensor
    q_indices: torch.Tensor
    q_offsets: torch.Tensor
    kv_offsets: torch.Tensor
    block_size: tuple[int, int]
    #: With a 64 x 64 mask's 128 x 128 tiles (``jagflash.core.block_tiles.tiled``): each listed tile's bits, beside the indices.
    kv_codes: torch.Tensor | None = None
    q_codes: torch.Tensor | None = None

    @property
    def heads(self) -> int:
        """1 (one list for every head) or the number of query heads."""
        return int(self.kv_counts.shape[1])

    @property
    def batch(self) -> int:
        return int(self.kv_counts.shape[0])

    @property
    def grid(self) -> tuple[int, int]:
        """``(nQ, nK)``: q-blocks and kv-blocks of the grid."""
        return int(self.kv_counts.shape[2]), int(self.q_counts.shape[2])

    # --- builders -------------------------------------------------------------------------

    @classmethod
    def from_dense(
        cls, blocks: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
        block_size: tuple[int, int] = (128, 128),
    ) -> BlockMask:
        """From a bool grid ``blocks [B, Hm, nQ, nK]`` (``Hm`` 1 or the query heads): q-block
        ``i`` of sequence ``b`` sees kv-block ``j`` where ``blocks[b, h, i, j]``. Entries past a
        sequence's own block counts are ignored; the grid must cover the longest sequence
        (checked: on a GPU on the device, without a sync). No host sync."""
        reasons = _offsets_reasons(q_offsets, kv_offsets)
        size_reasons, (bm, bn) = _block_size(block_size)
        reasons += size_reasons
        if not isinstance(blocks, torch.Tensor) or blocks.dim() != 4:
            reasons.append("blocks must be a 4-D tensor [B, H or 1, nQ, nK]")
        elif not reasons:
            if blocks.shape[0] != q_offsets.numel() - 1:
                reasons.append(f"blocks has {blocks.shape[0]} sequences, the offsets {q_offsets.numel() - 1}")
            if blocks.device != q_offsets.device:
                reasons.append(f"blocks on {blocks.device}, the offsets on {q_offsets.device}")
            if blocks.dtype != torch.bool:
                reasons.append(f"blocks must be bool, got {blocks.dtype}")
        if reasons:
            raise InvalidInput(_WHO, reasons)
        cls._check_cover(blocks.shape[2], blocks.shape[3], q_offsets, kv_offsets, bm, bn)
        lists = _lists(blocks, _block_counts(q_offsets, bm), _block_counts(kv_offsets, bn))
        return cls(*lists, q_offsets, kv_offsets, (bm, bn))

    @staticmethod
    def _check_cover(nq: int, nk: int, q_offsets, kv_offsets, bm: int, bn: int) -> None:
        """The grid covers every sequence: on the CPU read (reasons), on a GPU asserted on the
        device (a broken check fails the stream)."""
        need_q, need_k = _block_counts(q_offsets, bm), _block_counts(kv_offsets, bn)
        if q_offsets.device.type == "cpu":
            mq = int(need_q.max()) if need_q.numel() else 0
            mk = int(need_k.max()) if need_k.numel() else 0
            reasons = [f"the grid has {n} {what}-blocks, a sequence needs {m}" for n, m, what in ((nq, mq, "q"), (nk, mk, "kv")) if m > n]
            if reasons:
                raise InvalidInput(_WHO, reasons)
        elif need_q.numel():
            torch._assert_async((need_q.max() <= nq) & (need_k.max() <= nk), "BlockMask grid smaller than a sequence")

    @classmethod
    def from_lists(
        cls, kv_counts: torch.Tensor, kv_indices: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
        block_size: tuple[int, int] = (128, 128), *, max_seqlen_kv: int | None = None,
    ) -> BlockMask:
        """From compressed rows as the kernels read them: ``kv_counts [B, Hm, nQ]`` and
        ``kv_indices [B, Hm, nQ, W]`` (integers; the first ``kv_counts`` slots of each row
        strictly ascending, each below its sequence's kv-block count). The transpose is built
        on the device. On the CPU a broken list is refused with every reason; on a GPU it is
        asserted on the device (no sync; a broken list fails the stream). ``max_seqlen_kv``
        bounds the kv lengths (else one sync reads them)."""
        reasons = _offsets_reasons(q_offsets, kv_offsets)
        reasons += _block_size(block_size)[0]
        ok_shapes = (
            isinstance(kv_counts, torch.Tensor) and isinstance(kv_indices, torch.Tensor) and kv_counts.dim() == 3
            and kv_indices.dim() == 4 and kv_indices.shape[:3] == kv_counts.shape
        )
        if not ok_shapes:
            reasons.append("kv_counts must be [B, Hm, nQ] and kv_indices [B, Hm, nQ, W] with the same B, Hm, nQ")
        elif kv_counts.is_floating_point() or kv_indices.is_floating_point() or torch.bool in (kv_counts.dtype, kv_indices.dtype):
            reasons.append(f"kv_counts and kv_indices must be integers, got {kv_counts.dtype} and {kv_indices.dtype}")
        if reasons:
            raise InvalidInput(_WHO, reasons)
        bm, bn = (int(x) for x in block_size)
        dev = kv_counts.device
        nk = _grid_blocks(kv_offsets, bn, max_seqlen_kv)
        counts, indices = kv_counts.to(torch.int64), kv_indices.to(torch.int64)
        width = indices.shape[-1]
        slot = torch.arange(width, device=dev)
        used = slot < counts[..., None]
        own = _block_counts(kv_offsets, bn).to(dev).view(-1, 1, 1, 1)
        bad_count = (counts < 0) | (counts > width)
        bad_range = used & ((indices < 0) | (indices >= own))
        bad_order = used[..., 1:] & (indices[..., 1:] <= indices[..., :-1])
        checks = (
            (bad_count, "a count below 0 or above the list width"),
            (bad_range, "an index outside its sequence's kv-blocks"),
            (bad_order, "indices not strictly ascending (unsorted or duplicate)"),
        )
        if dev.type == "cpu":
            reasons = [f"kv_counts/kv_indices: {what}" for bad, what in checks if bool(bad.any())]
            if reasons:
                raise InvalidInput(_WHO, reasons)
        else:
            ok = ~(bad_count.any() | bad_range.any() | bad_order.any())
            torch._assert_async(ok, "BlockMask.from_lists: broken lists (counts, range or order)")
        grid = torch.zeros(*counts.shape, nk + 1, dtype=torch.bool, device=dev)
        grid.scatter_(-1, torch.where(used, indices, nk).clamp(0, nk), True)
        return cls.from_dense(grid[..., :nk], q_offsets, kv_offsets, (bm, bn))

    @classmethod
    def from_mask_mod(
        cls, mask_mod: Callable, q_offsets: torch.Tensor, kv_offsets: torch.Tensor, heads: int = 1,
        block_size: tuple[int, int] = (128, 128), *, max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None, total_q: int | None = None, total_kv: int | None = None,
        evaluator: str | None = None, per_sequence: bool = True, index_dtype: torch.dtype = torch.int32,
    ) -> BlockMask:
        """From FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (vectorised over
        broadcastable index tensors of ``index_dtype``; ``b`` the sequence, ``h`` the head,
        ``q_idx``, ``kv_idx`` positions counted from each sequence's first row): a block is listed when any
        of its in-range pairs is visible. ``heads``: 1 (``h`` is always 0) or the query heads.

        Only each sequence's own blocks are evaluated: the (sequence, q-block, kv-block) triples
        are enumerated on the device, sequence-major, and each block's ``bm x bn`` pairs are
        evaluated and reduced with ``any``. ``mask_mod`` sees ``q_idx < ceil(Lq_b / bm) * bm`` and
        ``kv_idx < ceil(Lk_b / bn) * bn`` (pairs past the lengths are evaluated, then dropped), and
        ``b``, ``h``, ``q_idx``, ``kv_idx`` shaped ``[C, 1, 1, 1]``, ``[1, heads, 1, 1]``,
        ``[C, 1, bm, 1]``, ``[C, 1, 1, bn]`` for a chunk of ``C`` blocks.

        ``evaluator``: how the pairs are evaluated; all three list the same blocks.

        * ``"kernel"``: jagflash's own Triton kernel generated from the mask_mod
          (:mod:`jagflash.core.mask_mod_kernel`: traced once with ``torch.fx``; a program per
          q-block row and per kv-block column decides every block along its list at once from
          bounds of the mask_mod's values over the block's pairs, and only a block the bounds
          leave open evaluates its pairs, in-range pairs only, so a tensor it reads may be
          sized to the lengths; each program writes its list: one launch, launched directly
          after the first call, nothing enumerated on the host). On
          CUDA, or on the CPU under ``TRITON_INTERPRET=1``. A mask_mod it cannot trace is
          refused with the reasons.
        * ``"compiled"``: ``torch.compile`` (per chunk, the blocks' positions and lengths are
          enumerated first, a few small ops, then one fused kernel evaluates the mask_mod and
          reduces with ``any`` reading them, the ``bm x bn`` pairs never stored; dynamic shapes,
          so a new batch does not recompile; cached per ``mask_mod`` object).
        * ``"eager"``: torch ops in chunks of at most ``2**24`` pairs.

        Default: ``"kernel"`` on CUDA, falling back (with a warning that gives the reasons, once
        per mask_mod) to ``"compiled"`` where ``torch.compile`` is supported and ``"eager"``
        elsewhere; ``"eager"`` on the CPU.

        ``per_sequence=False`` declares that ``mask_mod`` does not read ``b`` (as FlexAttention's
        ``B=None``; it is called with ``b = 0``): the longest sequence's grid is evaluated once
        for the full blocks of every sequence, and only each sequence's partial last q-block row
        and kv-block column on their own, so a batch costs about one long sequence's pairs and
        its edges instead of every sequence's pairs. The same blocks as the default wherever the
        declaration holds.

        ``index_dtype``: int32 (the default, as FlexAttention's kernels hand a mask_mod its
        indices; 1.07-1.43x faster to evaluate than int64 on the H200) or int64, for a mask_mod
        whose arithmetic on the indices may pass ``2**31``.

        Host syncs: none when both ``max_seqlen_*`` are given; ``total_q`` / ``total_kv`` (the
        rows of q and k) then tighten the enumeration's room from ``B * nQ * nK`` blocks to
        ``min(B nQ nK, Sq nK, Sk nQ)`` (``S``: the bound of the batch's q- or kv-blocks from the
        totals). Without the max lengths one sync reads them and the exact block count.
        """
        bounds = (max_seqlen_q, max_seqlen_kv, total_q, total_kv)
        if not _plain_mask_mod_call(mask_mod, q_offsets, kv_offsets, heads, block_size, bounds, per_sequence, index_dtype, evaluator):
            reasons = _mask_mod_reasons(mask_mod, q_offsets, kv_offsets, heads, block_size, bounds, per_sequence, index_dtype, evaluator)
            if reasons:
                raise InvalidInput(_WHO, reasons)
        dev = q_offsets.device
        unsupported = kernel_reasons(dev) if evaluator == "kernel" else []
        if unsupported:
            raise UnsupportedProblem(f"{_WHO}.from_mask_mod (evaluator='kernel')", unsupported)
        bm, bn = int(block_size[0]), int(block_size[1])
        batch = q_offsets.numel() - 1
        if max_seqlen_q is not None and max_seqlen_kv is not None:  # no sync, and no device op yet
            nq, nk = _grid_blocks(q_offsets, bm, max_seqlen_q), _grid_blocks(kv_offsets, bn, max_seqlen_kv)
            counts = None
        else:  # one sync: the max lengths and the block count
            counts = _block_counts(q_offsets, bm), _block_counts(kv_offsets, bn)
            nq_b, nk_b = counts
            read = torch.stack([nq_b.max(), nk_b.max(), (nq_b * nk_b).sum(), (nq_b + nk_b).sum()]) if batch else torch.zeros(4, dtype=torch.int64)
            mq, mk, room, edge_room = read.tolist()
            nq = mq if max_seqlen_q is None else _grid_blocks(q_offsets, bm, max_seqlen_q)
            nk = mk if max_seqlen_kv is None else _grid_blocks(kv_offsets, bn, max_seqlen_kv)
        if evaluator == "kernel" or (evaluator is None and dev.type == "cuda"):
            try:
                lists = build_lists(mask_mod, heads, (bm, bn), q_offsets, kv_offsets, nq, nk, per_sequence=per_sequence, index_dtype=index_dtype)
                return cls(*lists, q_offsets, kv_offsets, (bm, bn))
            except Untraceable as e:
                if evaluator:
                    raise UnsupportedProblem(f"{_WHO}.from_mask_mod (evaluator='kernel')", e.reasons) from None
                _warn_fallback(mask_mod, e.reasons)
        if counts is None:  # the other evaluators' room, from the host's bounds
            counts = _block_counts(q_offsets, bm), _block_counts(kv_offsets, bn)
            room, edge_room = batch * nq * nk, batch * (nq + nk)
            if total_q is not None:
                room = min(room, (total_q + batch * (bm - 1)) // bm * nk)
            if total_kv is not None:
                room = min(room, (total_kv + batch * (bn - 1)) // bn * nq)
            if total_q is not None and total_kv is not None:
                edge_room = min(edge_room, (total_q + batch * (bm - 1)) // bm + (total_kv + batch * (bn - 1)) // bn)
        nq_b, nk_b = counts
        use_compile = evaluator == "compiled" or (evaluator is None and dev.type == "cuda" and compile_supported())
        hits = evaluate(
            mask_mod, heads, (bm, bn), nq_b, nk_b, seq_lengths(q_offsets), seq_lengths(kv_offsets), nq, nk,
            room, edge_room, per_sequence=per_sequence, compiled=use_compile, index_dtype=index_dtype,
        )
        # the grid covers every sequence by construction: no from_dense checks
        lists = compiled_part("lists", _hit_lists) if use_compile and batch > 1 and nq > 1 and nk > 1 else _hit_lists
        return cls(*lists(hits, nq, nk, nq_b, nk_b), q_offsets, kv_offsets, (bm, bn))

    @classmethod
    def from_flex(cls, flex_mask, q_offsets: torch.Tensor, kv_offsets: torch.Tensor) -> BlockMask:
        """The block structure of a ``torch.nn.attention.flex_attention.BlockMask`` laid out
        per sequence (its batch ``b`` is sequence ``b``, its positions count from the
        sequence's first row; batch 1 is broadcast): every block it computes, partial or full,
        is listed. The element mask inside its partial blocks is not carried: causal and
        window are the element masks this mask applies."""
        dense = flex_mask.to_dense()  # [B, H, nQ, nK]: 1 where a block is computed
        bs = tuple(int(x) for x in flex_mask.BLOCK_SIZE)
        batch = q_offsets.numel() - 1 if isinstance(q_offsets, torch.Tensor) else 0
        if dense.shape[0] == 1 and batch != 1:
            dense = dense.expand(batch, *dense.shape[1:])
        return cls.from_dense(dense.to(q_offsets.device).bool(), q_offsets, kv_offsets, bs)

    # --- views ----------------------------------------------------------------------------

    def to_dense(self) -> torch.Tensor:
        """The bool grid ``[B, Hm, nQ, nK]`` (past a sequence's blocks: False)."""
        _nq, nk = self.grid
        slots = torch.arange(nk, device=self.kv_indices.device)
        listed = slots < self.kv_counts[..., None]
        grid = torch.zeros(*self.kv_counts.shape, nk + 1, dtype=torch.bool, device=self.kv_counts.device)
        grid.scatter_(-1, torch.where(listed, self.kv_indices.long(), nk), True)
        return grid[..., :nk]

    def density(self) -> torch.Tensor:
        """Listed blocks over the blocks of every sequence (fp32 scalar on the device; 0 for an
        empty batch)."""
        nq_b, nk_b = _block_counts(self.q_offsets, self.block_size[0]), _block_counts(self.kv_offsets, self.block_size[1])
        total = (nq_b * nk_b).sum() * self.heads
        return self.kv_counts.sum().float() / total.clamp(min=1).float()

    def picture(self, path, sequence: int = 0, head: int = 0, scale: int = 8) -> None:
        """Write sequence ``sequence``'s block grid (mask head ``head``) as a grayscale PNG:
        one ``scale`` x ``scale`` square per block, rows q-blocks, columns kv-blocks; listed
        black, unlisted white, blocks past the sequence's own grey. Standard library only."""
        import struct
        import zlib

        bm, bn = self.block_size
        lq = int(self.q_offsets[sequence + 1] - self.q_offsets[sequence])
        lk = int(self.kv_offsets[sequence + 1] - self.kv_offsets[sequence])
        grid = self.to_dense()[sequence, head].cpu()
        shade = torch.full(grid.shape, 160, dtype=torch.uint8)
        shade[: cdiv(lq, bm), : cdiv(lk, bn)] = 255
        shade[grid] = 0
        img = shade.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
        h, w = img.shape
        raw = b"".join(b"\x00" + bytes(row) for row in img.tolist())

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
        png += chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
        with open(path, "wb") as f:
            f.write(png)

    def element_mask(self, b: int, lq: int, lk: int) -> torch.Tensor:
        """Sequence ``b``'s ``[Hm, lq, lk]`` bool mask (the reference's): pair ``(i, j)``
        visible where block ``(i // bm, j // bn)`` is listed."""
        bm, bn = self.block_size
        grid = self.to_dense()[b]
        rows = torch.arange(lq, device=grid.device) // bm
        cols = torch.arange(lk, device=grid.device) // bn
        return grid[:, rows][:, :, cols]

    def kernel_lists(self) -> tuple[tuple, tuple]:
        """The lists as the kernels read them: ``(counts, indices, head_stride, seq_stride,
        width)`` of the forward (per q-block) and of the transpose (per kv-block);
        ``head_stride`` is 0 where every head shares one list; a tiled mask's also its bits
        (``jagflash.core.block_tiles``), in the indices' layout."""
        nq, nk = self.grid
        hm = self.heads

        def lists(counts, indices, rows, width, codes):
            return (counts, indices, rows if hm > 1 else 0, hm * rows, width, *(() if codes is None else (codes,)))

        return lists(self.kv_counts, self.kv_indices, nq, nk, self.kv_codes), lists(self.q_counts, self.q_indices, nk, nq, self.q_codes)

    def call_reasons(self, q_offsets: torch.Tensor, kv_offsets: torch.Tensor, heads_q: int) -> list[str]:
        """Why this mask cannot serve a call on these offsets with ``heads_q`` query heads
        (other offsets' objects are compared by value: one host sync on a GPU)."""
        out = []
        if self.heads not in (1, heads_q):
            out.append(f"block_mask has {self.heads} heads, the call {heads_q} query heads (1 or {heads_q})")
        if self.kv_counts.device != q_offsets.device:
            out.append(f"block_mask on {self.kv_counts.device}, the offsets on {q_offsets.device}")
            return out
        for mine, theirs, name in ((self.q_offsets, q_offsets, "q_offsets"), (self.kv_offsets, kv_offsets, "kv_offsets")):
            if mine is theirs:
                continue
            if mine.shape != theirs.shape or not torch.equal(mine.to(torch.int64), theirs.to(torch.int64)):
                out.append(f"block_mask was built for other {name} (another batch)")
        return out


# --- named patterns ---------------------------------------------------------------------


def _grid_indices(q_offsets, kv_offsets, block_size, max_seqlen_q, max_seqlen_kv):
    bm, bn = (int(x) for x in block_size)
    nq, nk = _grid_blocks(q_offsets, bm, max_seqlen_q), _grid_blocks(kv_offsets, bn, max_seqlen_kv)
    i = torch.arange(nq, device=q_offsets.device)[:, None]
    j = torch.arange(nk, device=q_offsets.device)[None, :]
    return i, j


def _from_grid(grid: torch.Tensor, q_offsets, kv_offsets, block_size) -> BlockMask:
    batch = q_offsets.numel() - 1
    return BlockMask.from_dense(grid.expand(batch, 1, *grid.shape[-2:]), q_offsets, kv_offsets, block_size)


def local_global(
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, *, before: int, after: int = 0, sinks: int = 1,
    block_size: tuple[int, int] = (128, 128), max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None,
) -> BlockMask:
    """Local + global: q-block ``i`` sees kv-blocks ``[i - before, i + after]`` and the first
    ``sinks`` kv-blocks (global sink tokens), in block coordinates from each sequence's start."""
    i, j = _grid_indices(q_offsets, kv_offsets, block_size, max_seqlen_q, max_seqlen_kv)
    grid = ((j >= i - before) & (j <= i + after)) | (j < sinks)
    return _from_grid(grid, q_offsets, kv_offsets, block_size)


def strided(
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, *, stride: int, local: int = 0,
    block_size: tuple[int, int] = (128, 128), max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None,
) -> BlockMask:
    """Strided (Sparse Transformer's fixed pattern in blocks): q-block ``i`` sees the kv-blocks
    ``j <= i`` with ``(i - j) % stride == 0`` and the ``local`` blocks just before it."""
    i, j = _grid_indices(q_offsets, kv_offsets, block_size, max_seqlen_q, max_seqlen_kv)
    grid = (j <= i) & ((((i - j) % stride) == 0) | (i - j <= local))
    return _from_grid(grid, q_offsets, kv_offsets, block_size)


def sessions(
    q_sessions: torch.Tensor, kv_sessions: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    *, block_size: tuple[int, int] = (128, 128), max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None,
) -> BlockMask:
    """Block-diagonal sessions inside a history: ``q_sessions [Tq]`` / ``kv_sessions [Tk]`` give
    each token's session id; a block is listed where a query and a key in it share one
    (:meth:`BlockMask.from_mask_mod` on a padded lookup)."""
    bm, bn = (int(x) for x in block_size)

    def padded(ids, offsets, block, given):
        n = _grid_blocks(offsets, block, given) * block
        lengths = (offsets[1:] - offsets[:-1]).to(torch.int64)
        pos = torch.arange(n, device=ids.device)
        rows = (offsets[:-1].to(torch.int64)[:, None] + pos[None, :]).clamp(max=max(ids.numel() - 1, 0))
        return torch.where(pos[None, :] < lengths[:, None], ids[rows] if ids.numel() else -1, -1), n

    qs, _ = padded(q_sessions, q_offsets, bm, max_seqlen_q)
    ks, _ = padded(kv_sessions, kv_offsets, bn, max_seqlen_kv)

    def same_session(b, h, q_idx, kv_idx):
        return qs[b, q_idx] == ks[b, kv_idx]

    return BlockMask.from_mask_mod(
        same_session, q_offsets, kv_offsets, 1, (bm, bn), max_seqlen_q=qs.shape[1], max_seqlen_kv=ks.shape[1]
    )


def top_k(
    scores: torch.Tensor, k: int, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    block_size: tuple[int, int] = (128, 128),
) -> BlockMask:
    """Per q-block the ``k`` kv-blocks of highest ``scores [B, Hm, nQ, nK]`` among the
    sequence's own blocks (fewer where it has fewer)."""
    bm, bn = (int(x) for x in block_size)
    if not isinstance(scores, torch.Tensor) or scores.dim() != 4 or not scores.is_floating_point():
        raise InvalidInput(_WHO, ["scores must be a floating 4-D tensor [B, H or 1, nQ, nK]"])
    nk_b = _block_counts(kv_offsets, bn)
    cols = torch.arange(scores.shape[-1], device=scores.device)
    valid = cols[None, None, None, :] < nk_b.view(-1, 1, 1, 1)
    masked = scores.masked_fill(~valid, float("-inf"))
    kk = max(0, min(int(k), scores.shape[-1]))
    picked = masked.topk(kk, dim=-1).indices
    grid = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter_(-1, picked, True) & valid
    return BlockMask.from_dense(grid, q_offsets, kv_offsets, (bm, bn))
