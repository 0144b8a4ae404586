"""core.checks' offsets checks and core.jagged: tile enumeration, padding, and the tile-range math (its torch
form against brute force, and its Triton twin against the torch form)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given
from hypothesis import strategies as st

from jagflash.core.checks import check_offsets
from jagflash.core.jagged import (
    cdiv,
    max_seqlen,
    next_pow2,
    seq_lengths,
    tile_starts,
    to_jagged,
    to_padded,
)
from jagflash.core.mask import (
    dkdv_q_range,
    dkdv_q_ranges,
    kv_tile_range,
    kv_tile_ranges,
    mask_bounds,
    visible_pairs,
)
from jagflash.core.reference import visibility_mask
from jagflash.testing.strategies import length_lists

CPU = torch.device("cpu")


def test_check_offsets_reports_every_problem() -> None:
    reasons, longest = check_offsets(torch.tensor([1, 0, 5]), 4, "offs", CPU, check_values=True)
    assert reasons == [
        "offs[0] must be 0, got 1",
        "offs must be non-decreasing (a sequence has length -1)",
        "offs[-1] must equal the number of rows 4, got 5",
    ]
    assert longest is None


def test_check_offsets_valid_and_structure_only() -> None:
    assert check_offsets(torch.tensor([0, 3, 3, 10]), 10, "o", CPU, check_values=True) == ([], 7)
    assert check_offsets(torch.tensor([0]), 0, "o", CPU, check_values=True) == ([], 0)
    assert check_offsets(torch.tensor([5, 1]), 0, "o", CPU, check_values=False) == ([], None)
    reasons, _ = check_offsets(torch.zeros(0, dtype=torch.int32), 0, "o", CPU, check_values=True)
    assert reasons == ["o must have at least one element (B+1 with B >= 0)"]


def test_resolve_max_seqlen_checks_a_tensor_once_per_version(monkeypatch) -> None:
    """The values of one offsets tensor are read once; a second call with it reads nothing and
    still answers the length and the bound's reason; an in-place write (a new version) or
    another tensor with the same values is checked again and its problems reported."""
    from jagflash.core import checks as jagged

    reads = []
    real = jagged.check_offsets
    monkeypatch.setattr(jagged, "check_offsets", lambda *a, **kw: reads.append(1) or real(*a, **kw))
    offs = torch.tensor([0, 3, 3, 10])
    assert jagged.resolve_max_seqlen(offs, 10, "o", -1, "kv") == ([], 7)
    assert jagged.resolve_max_seqlen(offs, 10, "o", -1, "kv") == ([], 7)
    assert jagged.resolve_max_seqlen(offs, 10, "o", 9, "kv") == ([], 9)
    assert jagged.resolve_max_seqlen(offs, 10, "o", 5, "kv") == (["max_seqlen_kv=5 is below the longest sequence (7)"], 5)
    assert len(reads) == 1
    assert jagged.resolve_max_seqlen(offs, 11, "o", -1, "kv")[0] == ["o[-1] must equal the number of rows 11, got 10"]
    assert len(reads) == 2
    offs[1:] += 1  # through a view: the version counter is shared
    assert jagged.resolve_max_seqlen(offs, 10, "o", -1, "kv")[0] == ["o[-1] must equal the number of rows 10, got 11"]
    assert jagged.resolve_max_seqlen(offs.clone(), 10, "o", -1, "kv")[0] == ["o[-1] must equal the number of rows 10, got 11"]
    assert len(reads) == 4
    with torch.inference_mode():  # no version counter: checked every call
        inf = torch.tensor([0, 2, 6])
        for _ in range(2):
            assert jagged.resolve_max_seqlen(inf, 6, "o", -1, "kv") == ([], 4)
    assert len(reads) == 6


def test_mask_bounds() -> None:
    assert mask_bounds(False) == (-1, -1)
    assert mask_bounds(True) == (-1, 0)
    assert mask_bounds(True, (8, 4)) == (8, 0)
    assert mask_bounds(False, (8, 4)) == (8, 4)


@given(length_lists(max_batch=6, max_len=100), st.sampled_from((16, 32, 64)))
def test_tile_starts_cover_every_row_once(lengths, block) -> None:
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    seq, start = tile_starts(offsets, block)
    covered = [(int(b), r) for b, s in zip(seq, start) for r in range(int(s), min(int(s) + block, lengths[b]))]
    expected = [(b, r) for b, n in enumerate(lengths) for r in range(n)]
    assert covered == expected
    assert max_seqlen(offsets) == max(lengths)
    assert seq_lengths(offsets).tolist() == lengths


@given(length_lists(max_batch=5, max_len=30))
def test_padded_roundtrip(lengths) -> None:
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    values = torch.randn(int(offsets[-1]), 3)
    padded = to_padded(values, offsets, max(lengths) if lengths else 0, pad=-7.0)
    assert torch.equal(to_jagged(padded, offsets), values)
    for b, n in enumerate(lengths):
        assert torch.all(padded[b, n:] == -7.0)


windows = st.tuples(st.sampled_from((-1, 0, 3, 17, 40)), st.sampled_from((-1, 0, 5, 33)))


@given(st.integers(0, 90), st.integers(0, 90), windows, st.sampled_from(((32, 32), (64, 16), (16, 64))))
def test_kv_tile_ranges_against_brute_force(lq, lk, window, blocks) -> None:
    left, right = window
    bm, bn = blocks
    mask = visibility_mask(lq, lk, left, right)
    for m0 in range(0, max(lq, 1), bm):
        lo, full_lo, full_hi, hi = (int(x) for x in kv_tile_ranges(m0, lq, lk, bm, bn, left, right))
        # aligned, except that both collapse onto an unaligned hi when no tile is unmasked
        assert lo % bn == 0
        assert lo <= full_lo <= full_hi <= hi
        assert full_lo % bn == 0 or full_lo == full_hi == hi
        assert full_hi % bn == 0 or full_hi == hi
        rows = mask[m0 : m0 + bm]
        if rows.numel():
            cols = rows.any(0).nonzero().flatten()
            if cols.numel():  # every visible key lies in [lo, hi)
                assert lo <= int(cols.min())
                assert int(cols.max()) < hi
        # unmasked tiles: every row of the tile (past lq too) sees every key of it, all < lk
        for n0 in range(full_lo, full_hi, bn):
            assert n0 + bn <= lk
            i = torch.arange(m0, m0 + bm)[:, None]
            j = torch.arange(n0, n0 + bn)[None, :]
            d = lk - lq
            ok = torch.ones_like(i + j, dtype=torch.bool)
            if right >= 0:
                ok &= j <= i + d + right
            if left >= 0:
                ok &= j >= i + d - left
            assert bool(ok.all()), (m0, n0)


@given(st.integers(0, 90), st.integers(0, 90), windows, st.sampled_from(((32, 32), (64, 16), (16, 64))))
def test_dkdv_q_ranges_against_brute_force(lq, lk, window, blocks) -> None:
    left, right = window
    bm, bn = blocks
    mask = visibility_mask(lq, lk, left, right)
    d = lk - lq
    for n0 in range(0, max(lk, 1), bn):
        lo, full_lo, full_hi, hi = (int(x) for x in dkdv_q_ranges(n0, lq, lk, bm, bn, left, right))
        assert lo % bm == full_lo % bm == full_hi % bm == hi % bm == 0
        assert lo <= full_lo <= full_hi <= hi
        rows = mask[:, n0 : n0 + bn].any(1).nonzero().flatten()
        if rows.numel():
            assert lo <= int(rows.min())
            assert int(rows.max()) < hi
        for m0 in range(full_lo, full_hi, bm):
            i = torch.arange(m0, m0 + bm)[:, None]
            j = torch.arange(n0, n0 + bn)[None, :]
            ok = torch.ones_like(i + j, dtype=torch.bool)
            if right >= 0:
                ok &= j <= i + d + right
            if left >= 0:
                ok &= j >= i + d - left
            assert bool(ok.all())


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=0, max_size=6), windows)
def test_visible_pairs(pairs, window) -> None:
    lq = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
    lk = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
    got = visible_pairs(lq, lk, *window).tolist()
    assert got == [int(visibility_mask(a, b, *window).sum()) for a, b in pairs]


@triton.jit
def _pick(a, b, c, d):
    i = tl.arange(0, 4)
    return tl.where(i == 0, a, tl.where(i == 1, b, tl.where(i == 2, c, d)))


@triton.jit
def _ranges(starts, lqs, lks, out_kv, out_q, left, right, BM: tl.constexpr, BN: tl.constexpr,
           BL: tl.constexpr, BR: tl.constexpr):
    i = tl.program_id(0)
    s = tl.load(starts + i)
    lq = tl.load(lqs + i)
    lk = tl.load(lks + i)
    a, b, c, d = kv_tile_range(s, lq, lk, left, right, BM, BN, BL, BR)
    tl.store(out_kv + 4 * i + tl.arange(0, 4), _pick(a, b, c, d))
    a, b, c, d = dkdv_q_range(s, lq, lk, left, right, BM, BN, BL, BR)
    tl.store(out_q + 4 * i + tl.arange(0, 4), _pick(a, b, c, d))



@pytest.mark.interpret
@pytest.mark.parametrize(("left", "right"), [(-1, -1), (-1, 0), (5, 0), (20, 9), (0, -1)])
def test_triton_twins_match_torch(left: int, right: int) -> None:
    """core.mask's kv_tile_range / dkdv_q_range (in kernels) give what its torch twins give."""
    gen = torch.Generator().manual_seed(left * 31 + right)
    n = 64
    lqs = torch.randint(0, 100, (n,), generator=gen, dtype=torch.int32)
    lks = torch.randint(0, 100, (n,), generator=gen, dtype=torch.int32)
    starts = (torch.randint(0, 4, (n,), generator=gen, dtype=torch.int32) * 32)
    out_kv = torch.empty(n, 4, dtype=torch.int32)
    out_q = torch.empty(n, 4, dtype=torch.int32)
    _ranges[(n,)](starts, lqs, lks, out_kv, out_q, left, right, BM=32, BN=32, BL=left >= 0, BR=right >= 0)
    want_kv = torch.stack(kv_tile_ranges(starts, lqs, lks, 32, 32, left, right), 1)
    want_q = torch.stack(dkdv_q_ranges(starts, lqs, lks, 32, 32, left, right), 1)
    assert torch.equal(out_kv.long(), want_kv)
    assert torch.equal(out_q.long(), want_q)


def test_lse_layouts_round_trip() -> None:
    from jagflash.core.jagged import lse_by_head, lse_by_sequence

    lse = torch.arange(2 * 3 * 5, dtype=torch.float32).view(2, 15)  # [H=2, B*L=3*5]
    by_seq = lse_by_sequence(lse, 3)
    assert by_seq.shape == (3, 2, 5)
    assert by_seq.is_contiguous()
    assert torch.equal(by_seq[1, 0], lse[0, 5:10])
    assert torch.equal(lse_by_head(by_seq), lse)
    assert lse_by_sequence(torch.empty(2, 0), 0).shape == (0, 2, 0)


def test_host_cdiv_and_next_pow2_answer_as_tritons() -> None:
    """The host helpers that replace ``triton.cdiv`` / ``triton.next_power_of_2`` (constexpr
    functions, ~3 us a host call) give their answers."""
    for a in range(0, 1200):
        for b in (1, 2, 3, 16, 64, 128, 256):
            assert cdiv(a, b) == triton.cdiv(a, b)
    for n in range(1, 5000):
        assert next_pow2(n) == triton.next_power_of_2(n)
    assert next_pow2(2**31 + 1) == 2**32
