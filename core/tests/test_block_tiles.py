"""A 64 x 64 block mask as the TLX kernels walk it (``jagflash.core.block_tiles``): 128 x 128
tiles listed where any of their four blocks is, each with its blocks' bits, against the mask's
own element mask; the kernels' side of it (``mask.tile_codes`` / ``mask.fine_visible`` along
``block_walk``'s positions, in the forward's 128- and 64-key steps and the dK/dV pass's 64-query
steps) under the interpreter; the plan and the launches that take it."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from jagflash.core.block_mask import BlockMask
from jagflash.core.block_tiles import kernel_mask, plan_grid, tiled
from jagflash.core.mask import block_at, fine_visible, list_row, tile_codes

#: (q lengths, kv lengths, mask heads, density, seed): odd block counts, an empty sequence, a
#: sequence shorter than a block, one block past a tile's first half.
CASES = [
    ((70, 200, 1, 130), (300, 65, 128, 10), 2, 0.3, 0),
    ((256, 0, 64), (129, 40, 384), 1, 0.5, 1),
    ((190, 320), (190, 70), 3, 0.1, 2),
    ((128, 65), (255, 257), 1, 1.0, 3),
]


def _offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _mask(lq, lk, heads: int, density: float, seed: int) -> BlockMask:
    gen = torch.Generator().manual_seed(seed)
    nq, nk = -(-max(lq) // 64), -(-max(lk) // 64)
    grid = torch.rand(len(lq), heads, max(nq, 1), max(nk, 1), generator=gen) < density
    return BlockMask.from_dense(grid, _offsets(lq), _offsets(lk), (64, 64))


def _from_lists(counts, indices, codes, rows: int, cols: int, transposed: bool = False) -> torch.Tensor:
    """The element mask ``[rows, cols]`` one direction's lists and bits say (brute force): bit
    ``2 r + c`` of a tile is its query half ``r`` against its key half ``c`` in both directions."""
    out = torch.zeros(rows, cols, dtype=torch.bool)
    for i in range(counts.shape[0]):
        for s in range(int(counts[i])):
            j, code = int(indices[i, s]), int(codes[i, s])
            for r in range(2):
                for c in range(2):
                    if code >> (2 * r + c) & 1:
                        x, y = (c, r) if transposed else (r, c)
                        out[i * 128 + x * 64 : i * 128 + x * 64 + 64, j * 128 + y * 64 : j * 128 + y * 64 + 64] = True
    return out


@pytest.mark.parametrize(("lq", "lk", "heads", "density", "seed"), CASES)
def test_tiles_and_their_bits_are_the_mask(lq, lk, heads, density, seed) -> None:
    """Forward and transposed lists, read with their bits, give back every sequence's element
    mask; a tile is listed exactly where one of its blocks is; no tile past a sequence's own."""
    m = _mask(lq, lk, heads, density, seed)
    t = tiled(m)
    assert t.block_size == (128, 128)
    assert t.heads == m.heads
    fine = m.to_dense()
    nq, nk = t.grid
    pad = torch.zeros(*fine.shape[:2], 2 * nq, 2 * nk, dtype=torch.bool)
    pad[:, :, : fine.shape[2], : fine.shape[3]] = fine
    assert torch.equal(t.to_dense(), pad.view(*fine.shape[:2], nq, 2, nk, 2).any(5).any(3))
    for b in range(len(lq)):
        want = m.element_mask(b, lq[b], lk[b])
        assert int(t.kv_counts[b].max()) <= -(-lk[b] // 128)
        for h in range(m.heads):
            fwd = _from_lists(t.kv_counts[b, h], t.kv_indices[b, h], t.kv_codes[b, h], nq * 128, nk * 128)
            bwd = _from_lists(t.q_counts[b, h], t.q_indices[b, h], t.q_codes[b, h], nk * 128, nq * 128, True).T
            assert torch.equal(fwd[: lq[b], : lk[b]], want[h])
            assert torch.equal(bwd[: lq[b], : lk[b]], want[h])


def test_tiled_masks_are_remembered_until_the_lists_change() -> None:
    """A call's plan, forward and backward share one tiled mask; an in-place write into the
    mask's lists (a new version) makes a new one, with the new bits."""
    m = _mask((130, 70), (200, 64), 1, 0.5, 4)
    assert tiled(m) is tiled(m)
    before = tiled(m)
    m.kv_counts.zero_()
    after = tiled(m)
    assert after is not before
    assert int(after.kv_counts.sum()) == 0


def test_kernel_mask_tiles_64_masks_only() -> None:
    m = _mask((130,), (130,), 1, 0.5, 0)
    assert kernel_mask(None) is None
    assert kernel_mask(m).block_size == (128, 128)
    coarse = BlockMask.from_dense(torch.ones(1, 1, 2, 2, dtype=torch.bool), m.q_offsets, m.kv_offsets, (128, 128))
    assert kernel_mask(coarse) is coarse
    assert coarse.kv_codes is None
    assert len(coarse.kernel_lists()[0]) == 5
    assert len(kernel_mask(m).kernel_lists()[1]) == 6
    with pytest.raises(ValueError, match=r"a mask of \(64, 64\) blocks, got \(128, 128\)"):
        tiled(coarse)
    assert torch.equal(plan_grid(m, (128, 128)), tiled(m).to_dense())
    assert torch.equal(plan_grid(m, (64, 64)), m.to_dense())
    assert plan_grid(None, (128, 128)) is None


@triton.jit
def _fwd_walk(lists, OUT, stride_b, stride_h, stride_q, STEP: tl.constexpr, SUB: tl.constexpr):
    """A forward q-tile's walk (all its listed tiles, ``STEP`` keys a step): what each half sees."""
    b, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row = list_row(lists, b, h, i)
    codes = tile_codes(lists, b, h, i, True)
    rows = i * 128 + tl.arange(0, 128)
    for t in range(0, row[0] * SUB):
        keys = block_at(row, t, STEP, True, SUB) + tl.arange(0, STEP)
        seen = fine_visible(codes, t, rows[:, None], keys[None, :], SUB)
        tl.store(OUT + b * stride_b + h * stride_h + rows[:, None] * stride_q + keys[None, :], seen.to(tl.int8))


@triton.jit
def _dkdv_walk(lists, OUT, stride_b, stride_h, stride_q):
    """A dK/dV kv-tile's walk (64-query steps, two a listed tile), as its two consumers (64 keys
    each) see each step, the step's first row and each consumer's keys as the kernel passes them."""
    b, h, j = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row = list_row(lists, b, h, j)
    codes = tile_codes(lists, b, h, j, True)
    for t in range(0, row[0] * 2):
        m0 = block_at(row, t, 64, True, 2)
        for cid in tl.static_range(2):
            kv_rows = j * 128 + cid * 64 + tl.arange(0, 64)
            seen = fine_visible(codes, t, m0, kv_rows, 2)  # [64 keys], one bit a step and consumer
            rows = m0 + tl.arange(0, 64)
            tl.store(OUT + b * stride_b + h * stride_h + rows[None, :] * stride_q + kv_rows[:, None], seen[:, None].to(tl.int8) + tl.zeros([64, 64], tl.int8))


@pytest.mark.interpret
@pytest.mark.parametrize(("lq", "lk", "heads", "density", "seed"), CASES[:3])
def test_kernel_walks_see_the_mask(lq, lk, heads, density, seed) -> None:
    """Under the interpreter: the forward's walk in 128-key steps (two consumers) and in 64-key
    steps (``SOLO``: SUB 2), and the dK/dV pass's 64-query steps, each reading its step's bits
    with ``fine_visible``, see exactly the mask (keys outside every listed tile stay unseen)."""
    m = _mask(lq, lk, heads, density, seed)
    t = tiled(m)
    nq, nk = t.grid
    fwd_lists, bwd_lists = t.kernel_lists()
    runs = []
    for step, sub in ((128, 1), (64, 2)):
        out = torch.zeros(len(lq), t.heads, nq * 128, nk * 128, dtype=torch.int8)
        _fwd_walk[(len(lq), t.heads, nq)](fwd_lists, out, *out.stride()[:3], STEP=step, SUB=sub)
        runs.append(out)
    out = torch.zeros(len(lq), t.heads, nq * 128, nk * 128, dtype=torch.int8)
    _dkdv_walk[(len(lq), t.heads, nk)](bwd_lists, out, *out.stride()[:3])
    runs.append(out)
    for b in range(len(lq)):
        want = m.element_mask(b, lq[b], lk[b])
        for out in runs:
            assert torch.equal(out[b, :, : lq[b], : lk[b]].bool(), want)
