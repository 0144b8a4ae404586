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
