"""BlockMask.from_mask_mod: the own-block enumeration against a pair-by-pair brute force and
against the padded-grid evaluation it replaced (the lists bit-for-bit), over hypothesis-drawn
jagged batches; compiled (inductor, on the CPU too) against eager with no recompile on a new
batch; on a GPU the generated kernel vs compiled vs eager vs the padded grid on a larger batch,
without a host sync (the generated kernel's own properties: test_mask_mod_kernel.py)."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from jagflash.core.block_mask import BlockMask
from jagflash.core.jagged import slots_of
from jagflash.testing.strategies import length_lists


def _offsets(lengths, device="cpu") -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32, device=device)


def _brute_grid(mask_mod, lq, lk, heads, bm, bn, nq, nk) -> torch.Tensor:
    """Block (i, j) of sequence b listed iff some in-range pair in it is visible: every pair of
    each sequence evaluated with scalar-shaped b and h, then each block scanned."""
    grid = torch.zeros(len(lq), heads, nq, nk, dtype=torch.bool)
    for b in range(len(lq)):
        for h in range(heads):
            i = torch.arange(lq[b])[:, None]
            j = torch.arange(lk[b])[None, :]
            seen = torch.as_tensor(mask_mod(torch.tensor(b), torch.tensor(h), i, j)).expand(lq[b], lk[b])
            for bi in range(-(-lq[b] // bm)):
                for bj in range(-(-lk[b] // bn)):
                    grid[b, h, bi, bj] = bool(seen[bi * bm : (bi + 1) * bm, bj * bn : (bj + 1) * bn].any())
    return grid


def _padded_grid(mask_mod, q_offsets, kv_offsets, heads, bm, bn, nq, nk) -> torch.Tensor:
    """The evaluation from_mask_mod replaced: every pair of the padded ``[B, heads, nq*bm, nk*bn]``
    grid at once, masked to the lengths, reduced per block."""
    dev = q_offsets.device
    lq = (q_offsets[1:] - q_offsets[:-1]).long().view(-1, 1, 1, 1)
    lk = (kv_offsets[1:] - kv_offsets[:-1]).long().view(-1, 1, 1, 1)
    batch = lq.shape[0]
    b = torch.arange(batch, device=dev).view(-1, 1, 1, 1)
    h = torch.arange(heads, device=dev).view(1, -1, 1, 1)
    q_idx = torch.arange(nq * bm, device=dev).view(1, 1, -1, 1)
    kv_idx = torch.arange(nk * bn, device=dev).view(1, 1, 1, -1)
    seen = torch.as_tensor(mask_mod(b, h, q_idx, kv_idx), device=dev).bool() & (q_idx < lq) & (kv_idx < lk)
    return seen.expand(batch, heads, nq * bm, nk * bn).reshape(batch, heads, nq, bm, nk, bn).any(-1).any(3)


def _same_lists(a: BlockMask, b: BlockMask) -> None:
    assert a.grid == b.grid
    assert a.block_size == b.block_size
    for x, y in zip((a.kv_counts, a.kv_indices, a.q_counts, a.q_indices), (b.kv_counts, b.kv_indices, b.q_counts, b.q_indices)):
        assert x.dtype == y.dtype == torch.int32
        assert x.is_contiguous()
        assert torch.equal(x, y)


def _mask_mod(kind: str, arg: int, table: torch.Tensor):
    """causal (top-left, as a mask_mod sees positions), window, document, a random table
    looked up per (sequence, head, 7-query, 11-key group), and a per-head mix."""
    if kind == "causal":
        return lambda b, h, q, k: k <= q
    if kind == "window":
        return lambda b, h, q, k: (q - k).abs() <= arg
    if kind == "document":
        return lambda b, h, q, k: q // arg == k // arg
    if kind == "table":
        return lambda b, h, q, k: table[b, h % table.shape[1], q // 7, k // 11]
    return lambda b, h, q, k: torch.where(h == 0, (q // arg) == (k // arg), (k <= q) & (q - k <= arg + b))


@given(
    lq=length_lists(max_batch=4, max_len=300),
    extra=st.lists(st.integers(-40, 140), min_size=4, max_size=4),
    size=st.sampled_from([(64, 64), (128, 128)]),
    heads=st.sampled_from([1, 2]),
    kind=st.sampled_from(["causal", "window", "document", "table", "per_head"]),
    arg=st.integers(1, 150),
    given_bounds=st.sampled_from(["none", "max", "max+totals"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_own_blocks_match_brute_force_and_the_padded_grid(lq, extra, size, heads, kind, arg, given_bounds, seed) -> None:
    """Zero-length sequences, lengths off the block size, cross lengths: the lists equal
    from_dense of a pair-by-pair brute force and of the padded-grid evaluation (bit-for-bit,
    int32, sorted), whether the bounds are read (one sync) or given (max lengths, totals); the
    shared grid of the same mask_mod with b held at 0 equals its brute force too."""
    lk = [max(0, a + e) for a, e in zip(lq, extra)]
    bm, bn = size
    table = torch.rand(len(lq), 2, 300 // 7 + 20, 440 // 11 + 20, generator=torch.Generator().manual_seed(seed)) < 0.05
    mm = _mask_mod(kind, arg, table)
    qo, ko = _offsets(lq), _offsets(lk)
    kw = {}
    if given_bounds != "none":
        kw = dict(max_seqlen_q=max(lq) + 3, max_seqlen_kv=max(lk))  # a bound above the longest is legal
    if given_bounds == "max+totals":
        kw.update(total_q=sum(lq), total_kv=sum(lk))
    m = BlockMask.from_mask_mod(mm, qo, ko, heads, size, evaluator="eager", **kw)
    nq, nk = m.grid
    assert (nq, nk) == (-(-(max(lq) + (3 if kw else 0)) // bm), -(-max(lk) // bn))
    brute = BlockMask.from_dense(_brute_grid(mm, lq, lk, heads, bm, bn, nq, nk), qo, ko, size)
    _same_lists(m, brute)
    _same_lists(m, BlockMask.from_dense(_padded_grid(mm, qo, ko, heads, bm, bn, nq, nk), qo, ko, size))
    # per_sequence=False (the mask_mod reads no b): the longest grid once plus each sequence's
    # partial edges list what the brute force lists
    flat = lambda b, h, q, k: mm(torch.zeros_like(b), h, q, k)
    shared = BlockMask.from_mask_mod(flat, qo, ko, heads, size, evaluator="eager", per_sequence=False, **kw)
    _same_lists(shared, BlockMask.from_dense(_brute_grid(flat, lq, lk, heads, bm, bn, nq, nk), qo, ko, size))


@pytest.mark.parametrize("size", [(64, 64), (128, 128)])
def test_shared_grid_edges_are_evaluated_on_their_own(size) -> None:
    """A mask_mod visible only at each block's last pair lists every full block and no partial
    one: the shared grid says yes for every block, so each partial row, column and corner must
    come from its own evaluation (sequences partial in q, in kv, in both, in neither)."""
    bm, bn = size
    mm = lambda b, h, q, k: (q % bm == bm - 1) & (k % bn == bn - 1)
    lq = [3 * bm, 3 * bm - 5, 2 * bm, 2 * bm + 1, bm - 1, 0]
    lk = [2 * bn - 7, 3 * bn, 4 * bn + 3, 2 * bn, bn, bn]
    qo, ko = _offsets(lq), _offsets(lk)
    for kw in ({}, dict(max_seqlen_q=max(lq), max_seqlen_kv=max(lk), total_q=sum(lq), total_kv=sum(lk))):
        m = BlockMask.from_mask_mod(mm, qo, ko, 1, size, evaluator="eager", per_sequence=False, **kw)
        want = [(a // bm) * (c // bn) for a, c in zip(lq, lk)]  # the full blocks
        assert m.kv_counts.sum(-1).flatten().tolist() == want
        _same_lists(m, BlockMask.from_dense(_brute_grid(mm, lq, lk, 1, bm, bn, *m.grid), qo, ko, size))


def test_empty_batches_and_chunks(monkeypatch) -> None:
    """No sequence, only empty sequences, and chunks of 2 blocks (the eager chunking path: every
    chunk boundary inside a sequence) give the brute-force lists."""
    from jagflash.core import mask_mod as evaluation

    mm = _mask_mod("per_head", 40, torch.zeros(0))
    for lq, lk in (([], []), ([0, 0], [0, 5]), ([0], [0])):
        m = BlockMask.from_mask_mod(mm, _offsets(lq), _offsets(lk), 2, (64, 64), evaluator="eager")
        assert int(m.kv_counts.sum()) == 0
    monkeypatch.setattr(evaluation, "_CHUNK", 2 * 2 * 64 * 64)  # 2 blocks of 2 heads a chunk
    lq, lk = [130, 0, 200, 64], [65, 9, 260, 64]
    m = BlockMask.from_mask_mod(mm, _offsets(lq), _offsets(lk), 2, (64, 64), evaluator="eager")
    _same_lists(m, BlockMask.from_dense(_brute_grid(mm, lq, lk, 2, 64, 64, *m.grid), _offsets(lq), _offsets(lk), (64, 64)))


def test_slots_of_enumerates_sequence_major() -> None:
    counts = torch.tensor([2, 0, 3, 1])
    seq, item, valid = slots_of(counts, 5, 2)  # slots 2..6 of 6 items: the last one invalid
    assert seq.tolist() == [2, 2, 2, 3, 3]
    assert item.tolist() == [0, 1, 2, 0, 0]
    assert valid.tolist() == [True, True, True, True, False]
    seq, item, valid = slots_of(torch.zeros(0, dtype=torch.int64), 3)
    assert not valid.any()
    assert item.tolist() == [0, 0, 0]


def test_compiled_equals_eager_without_recompiles() -> None:
    """Inductor (the CPU backend here) lists the same blocks as the eager path, and a second and
    third batch of other sizes (sequences, lengths, max lengths) reuse the compiled graphs: no
    recompile, the pairs' graph cached on the mask_mod object."""
    from torch._dynamo.utils import counters

    from jagflash.core import mask_mod as evaluation

    mm = _mask_mod("per_head", 50, torch.zeros(0))
    counters.clear()
    for lq, lk in (([130, 0, 70, 300], [100, 5, 140, 300]), ([5, 400, 64], [64, 64, 511]), ([1, 2, 3, 4, 900], [9, 8, 7, 6, 5])):
        qo, ko = _offsets(lq), _offsets(lk)
        c = BlockMask.from_mask_mod(mm, qo, ko, 2, (64, 64), evaluator="compiled")
        e = BlockMask.from_mask_mod(mm, qo, ko, 2, (64, 64), evaluator="eager")
        _same_lists(c, e)
    # three graphs, each compiled once: the blocks' enumeration, the mask_mod's pairs, the lists
    assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])
    assert set(evaluation._COMPILED[mm]) == {(2, 64, 64, torch.int32)}
    assert {(64, 64, False), "lists"} <= set(evaluation._COMPILED_PARTS)


def test_index_dtype_and_one_entry_code_per_mask_mod_function() -> None:
    """The mask_mod sees int32 indices by default and int64 when asked, both listing the same
    blocks; the compiled entry has one code object per mask_mod function (closures of one
    function share it, another function has its own), so Dynamo's automatic-dynamic record of
    one mask_mod's closure ints is never compared against another's."""
    from jagflash.core import mask_mod as evaluation

    seen = set()

    def band(width):
        def rule(b, h, q, k):
            seen.add((q.dtype, k.dtype, b.dtype, h.dtype))
            return (q - k).abs() < width

        return rule

    o = _offsets([130, 70])
    m32 = BlockMask.from_mask_mod(band(40), o, o, 1, (64, 64), evaluator="eager")
    assert seen == {(torch.int32,) * 4}
    seen.clear()
    m64 = BlockMask.from_mask_mod(band(40), o, o, 1, (64, 64), evaluator="eager", index_dtype=torch.int64)
    assert seen == {(torch.int64,) * 4}
    _same_lists(m32, m64)

    def other(b, h, q, k):
        return k <= q

    codes = [evaluation._entry(f, 1, 64, 64, torch.int32).__code__ for f in (band(3), band(5), other)]
    assert codes[0] is codes[1]
    assert codes[2] is not codes[0]
    assert codes[0].co_name != codes[2].co_name
    assert evaluation._entry(other, 1, 128, 128, torch.int32).__code__ is not codes[2]

    def shifted(b, h, q, k, shift):
        return k <= q + shift

    partials = [evaluation._entry(functools.partial(shifted, shift=s), 1, 64, 64, torch.int32).__code__ for s in (0, 9)]
    assert partials[0] is partials[1]
    assert partials[0] not in codes
    rule = functools.partial(shifted, shift=-70)  # compiled through its function's own entry code
    _same_lists(
        BlockMask.from_mask_mod(rule, o, o, 1, (64, 64), evaluator="compiled"), BlockMask.from_mask_mod(rule, o, o, 1, (64, 64), evaluator="eager"),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("size", [(64, 64), (128, 128)])
def test_gpu_compiled_eager_padded_agree_without_sync(size) -> None:
    """A lognormal-like batch of 96 sequences (up to 3000 rows, cross lengths, zero lengths),
    per-head document/band and local+global mask_mods: the generated kernel = compiled = eager =
    the padded grid; a warm call (the kernel) with the max lengths and totals given makes no host sync."""
    bm, bn = size
    gen = torch.Generator().manual_seed(7)
    lq = (torch.randn(96, generator=gen) + 6.0).exp().clamp(max=3000).long()
    lq[::17] = 0
    lk = (lq + torch.randint(-60, 200, (96,), generator=gen)).clamp(min=0)
    lq, lk = lq.tolist(), lk.tolist()
    qo, ko = _offsets(lq, "cuda"), _offsets(lk, "cuda")
    kw = dict(max_seqlen_q=max(lq), max_seqlen_kv=max(lk), total_q=sum(lq), total_kv=sum(lk))
    mods = [
        (_mask_mod("per_head", 300, torch.zeros(0)), 4),
        (lambda b, h, q, k: ((q // 512 - k // 512).abs() <= 1) | (k < 128), 1),
    ]
    for mm, heads in mods:
        c = BlockMask.from_mask_mod(mm, qo, ko, heads, size, **kw)  # the generated kernel: the CUDA default
        for other in ("compiled", "eager"):
            _same_lists(c, BlockMask.from_mask_mod(mm, qo, ko, heads, size, evaluator=other, **kw))
        padded = _padded_grid(mm, qo, ko, heads, bm, bn, *c.grid)
        _same_lists(c, BlockMask.from_dense(padded, qo, ko, size))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            again = BlockMask.from_mask_mod(mm, qo, ko, heads, size, **kw)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        _same_lists(c, again)
        if heads == 1:  # the local+global rule reads no b: the shared grid, every evaluator
            for ev in (None, "compiled", "eager"):
                _same_lists(c, BlockMask.from_mask_mod(mm, qo, ko, heads, size, evaluator=ev, per_sequence=False, **kw))


def test_refuses_bad_bounds_and_evaluator_with_every_reason() -> None:
    from jagflash.core.capability import InvalidInput

    o = _offsets([100, 20])
    with pytest.raises(InvalidInput) as e:
        BlockMask.from_mask_mod(
            lambda b, h, q, k: k <= q, o, o, 1, (64, 64), total_q=-1, max_seqlen_kv=True, evaluator="yes", per_sequence=None,
            index_dtype=torch.int16,
        )
    text = str(e.value)
    for want in ("total_q must be", "max_seqlen_kv must be", "evaluator must be", "per_sequence must be", "index_dtype must be"):
        assert want in text


@pytest.mark.parametrize(
    ("change", "want"),
    [
        (dict(heads=True), "heads must be"),
        (dict(heads=0), "heads must be"),
        (dict(block_size=(32, 32)), "block_size (32, 32) not in"),
        (dict(block_size=(64,)), "block_size must be a pair"),
        (dict(q_offsets=torch.tensor([0.0, 100.0, 120.0])), "q_offsets must be"),
        (dict(kv_offsets=torch.tensor([[0, 100, 120]])), "kv_offsets must be"),
        (dict(kv_offsets=torch.tensor([0, 100])), "have 2 and 1 sequences"),
        (dict(kv_offsets=torch.tensor([0, 100, 120], device="meta")), "kv_offsets on meta"),
        (dict(mask_mod=3), "mask_mod must be callable"),
        (dict(max_seqlen_q=-1), "max_seqlen_q must be"),
        (dict(total_kv=2.0), "total_kv must be"),
        (dict(total_q=False), "total_q must be"),
        (dict(per_sequence=None), "per_sequence must be"),
        (dict(index_dtype=torch.int16), "index_dtype must be"),
        (dict(evaluator="yes"), "evaluator must be"),
    ],
)
def test_each_bad_argument_alone_is_refused(change, want) -> None:
    """The common call's quick check lets none of them through: each alone is refused with its reason."""
    from jagflash.core.capability import InvalidInput

    o = _offsets([100, 20])
    kw = dict(mask_mod=lambda b, h, q, k: k <= q, q_offsets=o, kv_offsets=o, heads=1, block_size=(64, 64), max_seqlen_q=100,
              max_seqlen_kv=100, total_q=120, total_kv=120, evaluator="eager")
    kw.update(change)
    with pytest.raises(InvalidInput) as e:
        BlockMask.from_mask_mod(**kw)
    assert want in str(e.value), str(e.value)
