"""``jagflash.core.seqlen.store_zero_rows`` under the interpreter: the zeros a TLX producer writes
for a tile that sees nothing (the forward's O of an empty q-tile, the backward's dK / dV of a
kv-tile no step visits: ``ZERO_EMPTY``) land on exactly the tile's rows under the sequence's end,
in one head's columns, and nowhere else. The TLX kernels run only on a GPU; their producers call
this function."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from jagflash.core.seqlen import store_zero_rows

pytestmark = pytest.mark.interpret


@triton.jit
def _zero_kernel(X, stride_t, stride_h, head, r0, first, end, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    store_zero_rows(X + head * stride_h, r0, first, end, stride_t, ROWS, HEAD_DIM, tl.float32)


@pytest.mark.parametrize(("r0", "first", "end"), [(0, 0, 128), (5, 0, 37), (11, 128, 300), (3, 64, 64), (7, 128, 129)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_store_zero_rows_writes_the_tile_rows_under_the_end(r0, first, end, head_dim) -> None:
    heads, rows = 3, 512
    x = torch.full((rows, heads, head_dim), float("nan"))
    _zero_kernel[(1,)](x, x.stride(0), x.stride(1), 1, r0, first, end, ROWS=128, HEAD_DIM=head_dim)
    want = torch.zeros(rows, heads, dtype=torch.bool)
    lo, hi = r0 + first, r0 + min(first + 128, end)
    if hi > lo:
        want[lo:hi, 1] = True
    assert torch.equal(x.isnan().logical_not().all(-1), want)
    assert not x.isnan().logical_not().any(-1).logical_xor(want).any()  # whole rows or none
    assert bool((x[want] == 0).all())
