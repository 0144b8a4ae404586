"""The block iterator of ``jagflash.core.mask`` (``block_walk`` / ``block_at``) through a block
list, under the interpreter, against a brute-force enumeration: one step per listed block (the
forward and the portable kernels) and two 64-row steps per listed 128-row block (the TLX dK/dV
kernel's q-steps); and the plan's twin (``listed_blocks``) counts the same positions. The TLX
kernels themselves run only on a GPU; their producer and consumers call exactly these."""

from __future__ import annotations

import random

import pytest
import torch
import triton
import triton.language as tl

from jagflash.core.mask import block_at, block_walk, dkdv_q_ranges, kv_tile_ranges, listed_blocks

pytestmark = pytest.mark.interpret


@triton.jit
def _walk_kernel(COUNT, INDICES, BOUNDS, PARTS, ROWS, STEP: tl.constexpr, SUB: tl.constexpr):
    row = (tl.load(COUNT), INDICES)
    p0, p1, p2, p3 = block_walk(tl.load(BOUNDS), tl.load(BOUNDS + 1), tl.load(BOUNDS + 2), tl.load(BOUNDS + 3), row, STEP, True, SUB)
    tl.store(PARTS, p0)
    tl.store(PARTS + 1, p1)
    tl.store(PARTS + 2, p2)
    tl.store(PARTS + 3, p3)
    for t in range(p0, p3):
        tl.store(ROWS + t, block_at(row, t, STEP, True, SUB))


def _walk(indices: list[int], bounds, step: int, sub: int):
    width = 8
    idx = torch.zeros(width, dtype=torch.int32)
    idx[: len(indices)] = torch.tensor(indices, dtype=torch.int32)
    parts = torch.full((4,), -1, dtype=torch.int32)
    rows = torch.full((width * sub,), -1, dtype=torch.int32)
    _walk_kernel[(1,)](torch.tensor([len(indices)], dtype=torch.int32), idx, torch.tensor([int(b) for b in bounds], dtype=torch.int32), parts, rows, STEP=step, SUB=sub)
    p = parts.tolist()
    return p, rows[p[0] : p[3]].tolist()


@pytest.mark.parametrize(("step", "sub", "side"), [(128, 1, "q"), (64, 2, "kv")])
def test_walk_visits_the_listed_steps_of_each_part_in_order(step, sub, side) -> None:
    rng = random.Random(step)
    for i in range(30):
        lq, lk = rng.randint(1, 900), rng.randint(1, 900)
        left, right = rng.choice(((-1, -1), (-1, 0), (200, 0), (100, 300)))
        listed = [[], list(range(8))][i] if i < 2 else sorted(rng.sample(range(8), rng.randint(0, 8)))
        start = 128 * rng.randint(0, (lk if side == "kv" else lq) // 128)
        if side == "q":
            bounds = kv_tile_ranges(start, lq, lk, 128, 128, left, right)
        else:
            bounds = dkdv_q_ranges(start, lq, lk, 64, 128, left, right)
        lo, full_lo, full_hi, hi = (int(b) for b in bounds)
        steps = [i * step * sub + j * step for i in listed for j in range(sub)]
        want_parts = [sum(r < x for r in steps) for x in (lo, full_lo, full_hi, hi)]
        parts, rows = _walk(listed, bounds, step, sub)
        assert parts == want_parts, (listed, bounds)
        assert rows == [r for r in steps if lo <= r < hi]
        grid = torch.zeros(8, dtype=torch.bool)
        grid[listed] = True
        count = listed_blocks(side, torch.tensor(start), torch.tensor(lq), torch.tensor(lk), 128 if side == "q" else 64, 128, left, right, grid, sub)
        assert int(count) == parts[3] - parts[0]


@triton.jit
def _half_walk_kernel(COUNT, INDICES, ARGS, PARTS, ROWS, SPARSE: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr):
    from jagflash.core.tlx.fwd_tiles import half_walk

    row = (tl.load(COUNT), INDICES)
    m0, c, lq, lk, left, right = tl.load(ARGS), tl.load(ARGS + 1), tl.load(ARGS + 2), tl.load(ARGS + 3), tl.load(ARGS + 4), tl.load(ARGS + 5)
    p0, p1, p2, p3 = half_walk(m0, c, lq, lk, left, right, row, 64, 64, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE)
    tl.store(PARTS, p0)
    tl.store(PARTS + 1, p1)
    tl.store(PARTS + 2, p2)
    tl.store(PARTS + 3, p3)
    STEP: tl.constexpr = 1 if SPARSE else 64
    for t in range(p0, p3, STEP):
        tl.store(ROWS + t // STEP - p0 // STEP, block_at(row, t, 64, SPARSE, 2))


@pytest.mark.parametrize("sparse", [True, False])
def test_solo_half_walk_visits_each_half_s_own_steps(sparse) -> None:
    """The TLX forward's ``SOLO`` (``jagflash.core.tlx.fwd_tiles.half_walk``): half ``c`` of the
    q-tile at ``m0`` walks 64-key steps (two per listed 128-key block) in order; it visits every
    step where one of its rows under ``lq`` sees a key, only listed steps, nothing for a half past
    the sequence's end, and its unmasked body only steps whose 64 keys every such row sees."""
    pytest.importorskip("triton.language.extra.tlx")
    rng = random.Random(38 + sparse)
    for i in range(60):
        lq, lk = rng.randint(1, 700), rng.randint(1, 700)
        left, right = rng.choice(((-1, -1), (-1, 0), (200, 0), (100, 300), (-1, 50), (0, 0)))
        listed = list(range(8)) if not sparse or i < 2 else sorted(rng.sample(range(8), rng.randint(0, 8)))
        m0, c = 128 * rng.randint(0, (lq - 1) // 128), rng.randint(0, 1)
        idx = torch.zeros(8, dtype=torch.int32)
        idx[: len(listed)] = torch.tensor(listed, dtype=torch.int32)
        parts = torch.full((4,), -1, dtype=torch.int32)
        rows = torch.full((32,), -1, dtype=torch.int32)
        args = torch.tensor([m0, c, lq, lk, left, right], dtype=torch.int32)
        _half_walk_kernel[(1,)](torch.tensor([len(listed)], dtype=torch.int32), idx, args, parts, rows, SPARSE=sparse,
                                BOUNDED_LEFT=left >= 0, BOUNDED_RIGHT=right >= 0)
        p0, p1, p2, p3 = parts.tolist()
        scale = 1 if sparse else 64
        visited = rows[: len(range(p0, p3, scale))].tolist()
        r = torch.arange(m0 + 64 * c, max(min(m0 + 64 * c + 64, lq), m0 + 64 * c))
        key = torch.arange(lk)
        d = lk - lq
        see = torch.ones(len(r), lk, dtype=torch.bool)
        if right >= 0:
            see &= key[None, :] <= r[:, None] + d + right
        if left >= 0:
            see &= key[None, :] >= r[:, None] + d - left
        steps = [b * 128 + j * 64 for b in listed for j in range(2) if b * 128 + j * 64 < lk]
        need = [n for n in steps if bool(see[:, n : n + 64].any())]
        case = (lq, lk, left, right, listed, m0, c, (p0, p1, p2, p3), visited)
        assert visited == sorted(visited), case
        assert set(need) <= set(visited) <= set(steps), case
        if not len(r):
            assert p3 == p0, case
        body = rows[len(range(p0, p1, scale)) : len(range(p0, p2, scale))].tolist() if p2 > p1 else []
        for n in body:
            assert n + 64 <= lk, case
            assert bool(see[:, n : n + 64].all()), case
