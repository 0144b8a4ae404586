"""The evaluation behind :meth:`jagflash.core.block_mask.BlockMask.from_mask_mod`: which blocks
of a jagged batch hold a visible pair of a FlexAttention ``mask_mod(b, h, q_idx, kv_idx)``.

The blocks to evaluate are enumerated on the device (:func:`_blocks`: each sequence's own
blocks, or only each sequence's partial last row and column), then each block's ``bm x bn`` pairs
are evaluated and reduced with ``any`` (:func:`_pairs`), in chunks of host-known sizes (no sync).
Compiled, each of the two is one ``torch.compile`` graph with dynamic shapes; eager, chunks hold
at most :data:`_CHUNK` pairs.
"""

from __future__ import annotations

import functools
import types
import weakref

import torch

from jagflash.core.jagged import slots_of

__all__ = ["compile_supported", "compiled_part", "evaluate", "function_of"]

#: Pairs an eager evaluation holds at once.
_CHUNK = 1 << 24
#: Blocks one compiled evaluation takes (its memory: a few ints and ``heads`` bools a block).
_COMPILED_BLOCKS = 1 << 18


def _blocks(bm, bn, edges, per, nq_b, nk_b, lq, lk, s0, count, nq, nk):
    """Blocks ``s0 .. s0 + count - 1`` of the batch's own blocks (sequence-major, q-block-major
    in a sequence; ``edges``: only each sequence's partial last q-block row then its partial last
    kv-block column, ``per`` their counts, with ``b = 0``), ``[count]`` each: the ``b`` the
    mask_mod sees, the first q and kv position, the lengths the pairs must stay under (0 for a
    slot past the last block) and the flat grid index ``(b * nq + i) * nk + j`` (``B * nq * nk``
    past the last block). Small per-block tensors: the pairs' evaluation reads them instead of
    recomputing the enumeration for every pair."""
    seq, item, valid = slots_of(per, count, s0)
    cols = nk_b[seq]
    if edges:
        row = (lq[seq] % bm != 0).to(torch.int64) * cols  # the partial q-block's kv-blocks come first
        in_row = item < row
        qb = torch.where(in_row, nq_b[seq] - 1, item - row)
        kb = torch.where(in_row, item, cols - 1)
        b = torch.zeros_like(seq)
    else:
        qb, kb = item // cols.clamp(min=1), item % cols.clamp(min=1)
        b = seq
    where = torch.where(valid, (seq * nq + qb) * nk + kb, per.numel() * nq * nk)
    return b, qb * bm, kb * bn, torch.where(valid, lq[seq], 0), lk[seq], where


def _pairs(mask_mod, heads, bm, bn, idx, b, q0, k0, lq, lk):
    """Whether any in-range pair of each block is visible, ``[count, heads]``: the mask_mod on
    ``b [C, 1, 1, 1]``, ``h [1, heads, 1, 1]``, ``q_idx [C, 1, bm, 1]``, ``kv_idx [C, 1, 1, bn]``
    (dtype ``idx``) and ``any`` over the block, the kv axis first (under ``torch.compile`` one
    fused reduction over ``bn`` a row, then a small one over the rows; session 20: 1.04-1.13x
    faster than one reduction over the ``bm * bn`` pairs with the block size a constant, 3.5x on
    the local + global rule with it a run-time value)."""
    dev = b.device
    b, q0, k0, lq, lk = (t.to(idx) for t in (b, q0, k0, lq, lk))
    q_idx = q0.view(-1, 1, 1, 1) + torch.arange(bm, device=dev, dtype=idx).view(1, 1, -1, 1)
    kv_idx = k0.view(-1, 1, 1, 1) + torch.arange(bn, device=dev, dtype=idx).view(1, 1, 1, -1)
    h = torch.arange(heads, device=dev, dtype=idx).view(1, -1, 1, 1)
    seen = torch.as_tensor(mask_mod(b.view(-1, 1, 1, 1), h, q_idx, kv_idx), device=dev).to(torch.bool)
    inside = (q_idx < lq.view(-1, 1, 1, 1)) & (kv_idx < lk.view(-1, 1, 1, 1))
    return (seen & inside).expand(b.numel(), heads, bm, bn).any(-1).any(-1)


#: Compiled :func:`_pairs` per mask_mod object (weakly held) and (heads, block size, index dtype).
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: The compiled entry's code object per (the mask_mod's code, heads, block size, index dtype).
_ENTRY_CODES: dict = {}


def compile_supported() -> bool:
    """Whether ``torch.compile`` runs in this Python."""
    return bool(torch._dynamo.is_dynamo_supported())


#: Compiled parts that read no mask_mod, by key: :func:`_blocks` per (block size, edges), the
#: block mask's lists under "lists".
_COMPILED_PARTS: dict = {}


def compiled_part(key, fn):
    """``fn`` compiled (dynamic shapes, one graph), kept under ``key``."""
    if key not in _COMPILED_PARTS:
        _COMPILED_PARTS[key] = torch.compile(fn, dynamic=True, fullgraph=True)
    return _COMPILED_PARTS[key]


def function_of(mask_mod):
    """The function behind ``mask_mod``: partials unwrapped, a bound method's function."""
    fn = mask_mod
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__func__", fn)


def _entry(mask_mod, heads: int, bm: int, bn: int, idx: torch.dtype):
    """The function ``torch.compile`` traces for ``mask_mod``: :func:`_pairs` with the heads,
    block size and index dtype as constants, on a code object of its own per (the mask_mod's
    code, heads, block size, index dtype). Dynamo keeps its automatic-dynamic record per code
    (name, file, line): on one code shared by every mask_mod, an int of one mask_mod's closure
    compared against another's (a block size against a window) turned dynamic and Inductor
    divided by it at run time, once a pair, in int64 (session 20: 2.6 ms against 0.69). Per
    code, an int turns dynamic only where closures of the same mask_mod function differ in it
    (a grid size from batch to batch), never a constant the function always closes over."""

    def pairs(b, q0, k0, lq, lk):
        return _pairs(mask_mod, heads, bm, bn, idx, b, q0, k0, lq, lk)

    fn = function_of(mask_mod)
    code = getattr(fn, "__code__", None)
    key = (code if code is not None else type(fn), heads, bm, bn, idx)
    if key not in _ENTRY_CODES:
        name = f"mask_mod_pairs_{len(_ENTRY_CODES)}"
        _ENTRY_CODES[key] = pairs.__code__.replace(co_name=name, co_qualname=name)
    own = _ENTRY_CODES[key]
    return types.FunctionType(own, pairs.__globals__, own.co_name, None, pairs.__closure__)


def _compiled(mask_mod, heads: int, bm: int, bn: int, idx: torch.dtype):
    """:func:`_entry` compiled with only the block count dynamic (``dynamic=True`` would make the
    block size and every int the mask_mod closes over run-time values from the first call),
    kept per mask_mod object; the blocks' tensors are marked dynamic at the call."""
    try:
        per_mod = _COMPILED.setdefault(mask_mod, {})
    except TypeError:  # not weakly referenceable: compiled per call
        per_mod = {}
    key = (heads, bm, bn, idx)
    if key not in per_mod:
        compiled = torch.compile(_entry(mask_mod, heads, bm, bn, idx), fullgraph=True)

        def run(*block):
            for t in block:
                torch._dynamo.mark_dynamic(t, 0)
            return compiled(*block)

        per_mod[key] = run
    return per_mod[key]


def evaluate(
    mask_mod, heads: int, block_size: tuple[int, int], nq_b: torch.Tensor, nk_b: torch.Tensor,
    lq: torch.Tensor, lk: torch.Tensor, nq: int, nk: int, room: int, edge_room: int, *,
    per_sequence: bool, compiled: bool, index_dtype: torch.dtype = torch.int32,
) -> torch.Tensor:
    """``hits [heads, B * nq * nk + 1]`` bool: block ``(b, i, j)`` at ``(b * nq + i) * nk + j``
    holds a visible in-range pair (the last column takes the invalid slots). ``nq_b`` / ``nk_b``
    / ``lq`` / ``lk``: each sequence's block counts and lengths, int64; ``nq`` / ``nk`` the grid;
    ``room`` / ``edge_room``: host bounds of the sequences' own blocks and of their partial rows
    and columns. ``per_sequence=False``: ``mask_mod`` reads no ``b`` (called with ``b = 0``), so
    the longest grid is evaluated once for every sequence's full blocks and only each
    sequence's partial last row and column on their own."""
    bm, bn = block_size
    batch = nq_b.numel()
    dev = nq_b.device

    def run(hits, edges, per, nq_b, nk_b, lq, lk, room):  # hits[:, flat block] of the chunks' blocks
        if not (room and nq and nk):
            return
        blocks = functools.partial(_blocks, bm, bn, edges)
        if compiled:
            pairs, blocks = _compiled(mask_mod, heads, bm, bn, index_dtype), compiled_part((bm, bn, edges), blocks)
        else:
            pairs = functools.partial(_pairs, mask_mod, heads, bm, bn, index_dtype)
        chunk = _COMPILED_BLOCKS if compiled else max(1, _CHUNK // (heads * bm * bn))
        room = max(room, 2)  # a chunk of >= 2 blocks: torch.compile specialises sizes 0 and 1
        for s0 in range(0, room, chunk):  # host-known sizes only: no sync
            *block, where = blocks(per, nq_b, nk_b, lq, lk, s0, max(min(chunk, room - s0), 2), nq, nk)
            hits[:, where] = pairs(*block).T

    hits = torch.zeros(heads, batch * nq * nk + 1, dtype=torch.bool, device=dev)
    if per_sequence:
        run(hits, False, nq_b * nk_b, nq_b, nk_b, lq, lk, room)
    elif batch and nq and nk:
        # the longest grid once (every pair in range, b = 0) for every sequence's full blocks,
        # then each sequence's partial last row and column on their own
        one = torch.ones(1, dtype=torch.int64, device=dev)
        shared = torch.zeros(heads, nq * nk + 1, dtype=torch.bool, device=dev)
        run(shared, False, one * (nq * nk), one * nq, one * nk, one * (nq * bm), one * (nk * bn), nq * nk)
        hits[:, :-1] = shared[:, :-1].view(heads, 1, nq * nk).expand(heads, batch, nq * nk).reshape(heads, -1)
        part_q, part_k = (lq % bm != 0).to(torch.int64), (lk % bn != 0).to(torch.int64)
        run(hits, True, part_q * nk_b + part_k * (nq_b - part_q), nq_b, nk_b, lq, lk, edge_room)
    return hits
