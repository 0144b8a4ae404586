"""BlockMask: builders against a brute-force evaluation, the transpose, the named patterns,
FlexAttention's BlockMask, the plan's listed-block costs, refusals. Host-side torch only (no
kernels): these run in a second."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from jagflash.core.block_mask import BlockMask, local_global, sessions, strided, top_k
from jagflash.core.capability import InvalidInput
from jagflash.core.mask import kv_tile_ranges, listed_blocks


def _offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)


def _check_lists(m: BlockMask, grid: torch.Tensor) -> None:
    """The CSR lists and their transpose are exactly ``grid``'s listed blocks, ascending."""
    nq, nk = m.grid
    for b in range(grid.shape[0]):
        for h in range(grid.shape[1]):
            for i in range(nq):
                want = grid[b, h, i].nonzero().flatten().tolist()
                c = int(m.kv_counts[b, h, i])
                assert m.kv_indices[b, h, i, :c].tolist() == want
            for j in range(nk):
                want = grid[b, h, :, j].nonzero().flatten().tolist()
                c = int(m.q_counts[b, h, j])
                assert m.q_indices[b, h, j, :c].tolist() == want
    assert torch.equal(m.to_dense(), grid)
    for t in (m.kv_counts, m.kv_indices, m.q_counts, m.q_indices):
        assert t.dtype == torch.int32
        assert t.is_contiguous()


@given(
    lq=st.lists(st.integers(0, 140), min_size=1, max_size=3),
    extra=st.lists(st.integers(0, 70), min_size=3, max_size=3),
    size=st.sampled_from([(64, 64), (128, 128)]),
    heads=st.sampled_from([1, 2]),
    density=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_from_dense_lists_and_transpose(lq, extra, size, heads, density, seed) -> None:
    """Random grids at densities 0, 0.1, 0.5 and 1: entries past a sequence's blocks dropped,
    the lists and the transposed lists equal to the grid (brute force)."""
    lk = [a + b for a, b in zip(lq, extra)]
    bm, bn = size
    nq, nk = -(-max(lq) // bm) + 1, -(-max(lk) // bn) + 1  # one block more than needed: ignored
    g = torch.Generator().manual_seed(seed)
    blocks = torch.rand(len(lq), heads, nq, nk, generator=g) < density
    m = BlockMask.from_dense(blocks, _offsets(lq), _offsets(lk), size)
    want = blocks.clone()
    for b in range(len(lq)):
        want[b, :, -(-lq[b] // bm):] = False
        want[b, :, :, -(-lk[b] // bn):] = False
    _check_lists(m, want)
    total = sum(-(-a // bm) * -(-c // bn) for a, c in zip(lq, lk)) * heads
    assert float(m.density()) == pytest.approx(int(want.sum()) / max(total, 1))


def test_patterns_equal_their_mask_mods() -> None:
    """local+global, strided and sessions against from_mask_mod of the same rule in tokens."""
    lq = [200, 64, 0]
    qo = _offsets(lq)
    bs = (64, 64)
    lg = local_global(qo, qo, before=1, after=0, sinks=1, block_size=bs)
    rule = BlockMask.from_mask_mod(
        lambda b, h, qi, kj: ((kj // 64 >= qi // 64 - 1) & (kj // 64 <= qi // 64)) | (kj // 64 < 1), qo, qo, 1, bs
    )
    assert torch.equal(lg.to_dense(), rule.to_dense())
    st_ = strided(qo, qo, stride=2, local=0, block_size=bs)
    rule = BlockMask.from_mask_mod(lambda b, h, qi, kj: (kj // 64 <= qi // 64) & ((qi // 64 - kj // 64) % 2 == 0), qo, qo, 1, bs)
    assert torch.equal(st_.to_dense(), rule.to_dense())
    ids = torch.cat([torch.arange(200) // 70, torch.arange(64) // 30])  # sessions of 70 and 30 tokens
    se = sessions(ids, ids, qo, qo, block_size=bs)
    pad = torch.full((3, 256), -1)
    pad[0, :200], pad[1, :64] = ids[:200], ids[200:]
    rule = BlockMask.from_mask_mod(lambda b, h, qi, kj: (pad[b, qi] == pad[b, kj]) & (pad[b, qi] >= 0), qo, qo, 1, bs)
    assert torch.equal(se.to_dense(), rule.to_dense())
    assert se.to_dense()[0, 0, 0].tolist() == [True, True, False, False]  # session 0: keys 0..69


def test_top_k_picks_the_highest_scores_of_own_blocks() -> None:
    lq, lk = [130, 64], [200, 64]
    scores = torch.randn(2, 1, 3, 4, generator=torch.Generator().manual_seed(1))
    m = top_k(scores, 2, _offsets(lq), _offsets(lk), (64, 64))
    grid = m.to_dense()
    assert grid[0, 0, :3].sum(-1).tolist() == [2, 2, 2]
    for i in range(3):
        assert set(grid[0, 0, i].nonzero().flatten().tolist()) == set(scores[0, 0, i].topk(2).indices.tolist())
    assert grid[1, 0, 0].sum() == 1
    assert not grid[1, 0, 1:].any()


def test_from_flex_block_mask() -> None:
    """FlexAttention's BlockMask (torch's create_block_mask, per-sequence layout): every block
    it computes, partial or full, is listed."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    lq = [256, 100]
    qo = _offsets(lq)

    def causal_docs(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx // 96 == kv_idx // 96)

    flex = fa.create_block_mask(causal_docs, 2, 1, 256, 256, device="cpu", BLOCK_SIZE=128)
    m = BlockMask.from_flex(flex, qo, qo)
    want = BlockMask.from_mask_mod(causal_docs, qo, qo, 1, (128, 128))
    assert torch.equal(m.to_dense(), want.to_dense())


def test_listed_blocks_is_the_band_part_of_the_list() -> None:
    """The plan's twin counts the listed blocks inside each q-tile's band: brute force."""
    lq = lk = 200
    listed = torch.tensor([True, False, True, True])
    for left, right in ((-1, -1), (-1, 0), (70, 0), (10, 10)):
        for m0 in (0, 64, 128, 192):
            lo, _, _, hi = kv_tile_ranges(m0, lq, lk, 64, 64, left, right)
            want = sum(1 for j in range(4) if listed[j] and j * 64 < int(hi) and (j + 1) * 64 > int(lo))
            got = listed_blocks("q", torch.tensor(m0), torch.tensor(lq), torch.tensor(lk), 64, 64, left, right, listed)
            assert int(got) == want


def test_refusals() -> None:
    qo = _offsets([70, 10])
    grid = torch.ones(2, 1, 2, 2, dtype=torch.bool)
    with pytest.raises(InvalidInput, match=r"block_size \(32, 32\) not in"):
        BlockMask.from_dense(grid, qo, qo, (32, 32))
    with pytest.raises(InvalidInput, match="3 sequences, the offsets 2"):
        BlockMask.from_dense(torch.ones(3, 1, 2, 2, dtype=torch.bool), qo, qo, (64, 64))
    with pytest.raises(InvalidInput, match="must be bool"):
        BlockMask.from_dense(grid.int(), qo, qo, (64, 64))
    with pytest.raises(InvalidInput, match="4-D"):
        BlockMask.from_dense(grid[0], qo, qo, (64, 64))
    with pytest.raises(InvalidInput, match="the grid has 1 q-blocks, a sequence needs 2"):
        BlockMask.from_dense(grid[:, :, :1], qo, qo, (64, 64))
    with pytest.raises(InvalidInput, match="have 2 and 1 sequences"):
        BlockMask.from_dense(grid, qo, _offsets([70]), (64, 64))
    with pytest.raises(InvalidInput, match="heads must be an int"):
        BlockMask.from_mask_mod(lambda b, h, q, k: q >= k, qo, qo, heads=0, block_size=(64, 64))
    m = BlockMask.from_dense(grid, qo, qo, (64, 64))
    assert m.call_reasons(qo, qo.clone(), 4) == []
    assert m.call_reasons(_offsets([10, 70]), qo, 4) == ["block_mask was built for other q_offsets (another batch)"]
    per_head = BlockMask.from_dense(grid.expand(2, 3, 2, 2), qo, qo, (64, 64))
    assert per_head.call_reasons(qo, qo, 4) == ["block_mask has 3 heads, the call 4 query heads (1 or 4)"]


def test_from_lists_round_trips_and_refuses_broken_lists() -> None:
    """from_lists of a mask's own lists gives the same mask; a count past the width, an index
    out of its sequence's range, unsorted or duplicate indices are each refused by name."""
    lq, lk = [130, 64], [200, 64]
    qo, ko = _offsets(lq), _offsets(lk)
    grid = torch.rand(2, 2, 3, 4, generator=torch.Generator().manual_seed(2)) < 0.5
    m = BlockMask.from_dense(grid, qo, ko, (64, 64))
    again = BlockMask.from_lists(m.kv_counts, m.kv_indices, qo, ko, (64, 64))
    assert torch.equal(again.to_dense(), m.to_dense())
    assert torch.equal(again.q_indices, m.q_indices)
    counts = torch.tensor([[[2]], [[1]]], dtype=torch.int32)

    def refused(counts, indices) -> list[str]:
        with pytest.raises(InvalidInput) as e:
            BlockMask.from_lists(counts, indices, _offsets([64, 64]), ko, (64, 64))
        return e.value.reasons

    assert refused(counts, torch.tensor([[[[1, 1]]], [[[0, 0]]]])) == ["kv_counts/kv_indices: indices not strictly ascending (unsorted or duplicate)"]
    assert refused(counts, torch.tensor([[[[2, 1]]], [[[0, 0]]]])) == ["kv_counts/kv_indices: indices not strictly ascending (unsorted or duplicate)"]
    assert refused(counts, torch.tensor([[[[0, 4]]], [[[1, 0]]]])) == ["kv_counts/kv_indices: an index outside its sequence's kv-blocks"]
    assert refused(torch.tensor([[[3]], [[0]]]), torch.tensor([[[[0, 1]]], [[[0, 0]]]])) == ["kv_counts/kv_indices: a count below 0 or above the list width"]
    assert "must be integers" in refused(counts.float(), torch.zeros(2, 1, 1, 2))[0]
    assert "kv_indices [B, Hm, nQ, W]" in refused(counts, torch.zeros(2, 1, 2, 2, dtype=torch.int32))[0]


def test_picture_is_a_png_of_the_grid(tmp_path) -> None:
    import struct
    import zlib

    qo = _offsets([130])
    grid = torch.tensor([[[[True, False, False], [False, True, False], [False, False, False]]]])
    m = BlockMask.from_dense(grid, qo, _offsets([100]), (64, 64))
    m.picture(tmp_path / "m.png", scale=2)
    data = (tmp_path / "m.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    assert (w, h) == (6, 6)  # 3 x 3 blocks of 2 px
    idat = data.index(b"IDAT")
    size = struct.unpack(">I", data[idat - 4 : idat])[0]
    rows = zlib.decompress(data[idat + 4 : idat + 4 + size])
    pixels = [list(rows[r * 7 + 1 : r * 7 + 7]) for r in range(6)]
    assert pixels[0] == [0, 0, 255, 255, 160, 160]  # listed, unlisted, past the 2 kv-blocks
    assert pixels[2] == [255, 255, 0, 0, 160, 160]
    assert pixels[4] == [255, 255, 255, 255, 160, 160]  # q-block 2 (rows 128, 129) lists nothing
