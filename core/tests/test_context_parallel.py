"""core.context_parallel: shard layouts, the ring's call tables (their visibility against the
global mask, on the host), the LSE merge, and ring attention on 2 and 4 gloo ranks under the
interpreter against the fp64 single-process reference, forward and backward."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from jagflash.core import context_parallel as cp
from jagflash.core.capability import DEFAULT_ATOL, InvalidInput, UnsupportedProblem
from jagflash.core.reference import attention_reference, visibility_mask
from jagflash.core.softmax import merge_partials
from jagflash.testing import assert_close_all
from jagflash.testing.distributed import run_ranks
from jagflash.testing.strategies import length_lists

LAYOUTS = {"balanced": cp.balanced_layout, "contiguous": cp.contiguous_layout}


def _offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def test_balanced_layout_gives_each_rank_a_head_and_a_tail() -> None:
    lay = cp.balanced_layout(_offsets([8, 3]), 2)  # 8 -> chunks of 2; 3 -> 1, 1, 1, 0
    assert lay.chunks == (((0, 0, 2), (0, 6, 2), (1, 0, 1)), ((0, 2, 2), (0, 4, 2), (1, 1, 1), (1, 2, 1)))
    assert [lay.rows(r) for r in range(2)] == [5, 6]
    assert lay.local_offsets(1).tolist() == [0, 4, 6]


def test_contiguous_layout_spans_sequences_and_leaves_empty_shards() -> None:
    lay = cp.contiguous_layout(_offsets([3, 4]), 3)  # 3 rows a rank: seq 1 spans ranks 1 and 2
    assert lay.chunks == (((0, 0, 3),), ((1, 0, 3),), ((1, 3, 1),))
    assert cp.contiguous_layout(_offsets([1, 1]), 4).chunks == (((0, 0, 1),), ((1, 0, 1),), (), ())


def test_layout_refuses_gaps_and_overlaps_with_every_reason() -> None:
    with pytest.raises(InvalidInput) as err:
        cp.ShardLayout(2, (4, 2), (((0, 0, 3),), ((0, 2, 2), (1, 0, 1), (2, 0, 1))))
    assert err.value.reasons == [
        "rank 1: chunk (2, 0, 1) outside the sequences (4, 2)",
        "sequence 0: positions 2..3 held twice",
        "sequence 1: positions 1..2 held by no rank",
    ]


@given(lengths=length_lists(max_batch=5, max_len=24), world=st.integers(1, 4), kind=st.sampled_from(sorted(LAYOUTS)))
def test_shard_unshard_round_trip(lengths, world, kind) -> None:
    lay = LAYOUTS[kind](_offsets(lengths), world)
    x = torch.arange(sum(lengths) * 2, dtype=torch.float32).reshape(-1, 2)
    parts = [cp.shard(x, lay, r) for r in range(world)]
    assert torch.equal(cp.unshard(parts, lay), x)
    assert torch.equal(cp.unshard([p.T for p in parts], lay, dim=1), x.T)


def _seen_by_calls(calls, tq: int, tk: int) -> torch.Tensor:
    """How many times each (local query, block key) pair is attended by ``calls``."""
    seen = torch.zeros(tq, tk, dtype=torch.int64)
    for call in calls:
        for a, b, c, d in zip(call.q_offsets[:-1], call.q_offsets[1:], call.kv_offsets[:-1], call.kv_offsets[1:]):
            seen[a:b, c:d] += visibility_mask(b - a, d - c, -1, 0 if call.causal else -1).long()
    return seen


@given(
    q_lens=length_lists(max_batch=4, max_len=20), world=st.integers(1, 4), causal=st.booleans(),
    kinds=st.tuples(st.sampled_from(sorted(LAYOUTS)), st.sampled_from(sorted(LAYOUTS))),
    cross=st.booleans(), data=st.data(),
)
def test_ring_calls_attend_each_visible_pair_once(q_lens, world, causal, kinds, cross, data) -> None:
    """Over the ring's steps, the calls of each rank see exactly the pairs of the global mask
    (bottom-right in each sequence's global positions), each once: on any sharding of q and
    of k/v, Lq != Lk included."""
    k_lens = [data.draw(st.integers(0, 20)) for _ in q_lens] if cross else q_lens
    ql, kl = LAYOUTS[kinds[0]](_offsets(q_lens), world), LAYOUTS[kinds[1]](_offsets(k_lens), world)
    qo, ko = _offsets(q_lens).tolist(), _offsets(k_lens).tolist()
    want = torch.zeros(qo[-1], ko[-1], dtype=torch.int64)
    for b in range(len(q_lens)):
        want[qo[b] : qo[b + 1], ko[b] : ko[b + 1]] = visibility_mask(q_lens[b], k_lens[b], -1, 0 if causal else -1).long()
    for r in range(world):
        steps = cp.ring_calls(ql, kl, r, causal)
        assert len(steps) == world
        for t, calls in enumerate(steps):
            s = (r - t) % world
            got = _seen_by_calls(calls, ql.rows(r), kl.rows(s))
            for call in calls:
                assert call.q_offsets[-1] == ql.rows(r)
                assert call.kv_offsets[-1] == kl.rows(s)
            expect = want[ql.index(r)][:, kl.index(s)]
            assert torch.equal(got, expect), (r, t)


def test_merge_partials_equals_attention_over_the_union_and_keeps_empty_rows() -> None:
    """Keys split in two sets (one of them empty for some rows: LSE -inf): the merge equals the
    attention over all keys; rows that see no key in either stay 0 / -inf, without NaN."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(s, generator=gen, dtype=torch.float64) for s in ((6, 2, 8), (7, 2, 8), (7, 2, 8)))
    qo = torch.tensor([0, 2, 4, 6])
    full = attention_reference(q, k, v, qo, torch.tensor([0, 4, 4, 7]), compute_dtype=torch.float64)
    a = attention_reference(q, k, v, qo, torch.tensor([0, 2, 2, 2]), compute_dtype=torch.float64)
    b = attention_reference(q, k[2:], v[2:], qo, torch.tensor([0, 2, 2, 5]), compute_dtype=torch.float64)
    out, lse = merge_partials(a[0], a[1], b[0], b[1])
    assert torch.isinf(a[1][:, 4:]).all()
    assert torch.isinf(b[1][:, 2:4]).all()
    torch.testing.assert_close(out.double(), full[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse.double(), full[1], rtol=1e-6, atol=1e-6)
    empty = torch.full((2, 6), float("-inf"), dtype=torch.float32)
    out, lse = merge_partials(torch.zeros(6, 2, 8), empty, torch.zeros(6, 2, 8), empty)
    assert torch.equal(out, torch.zeros(6, 2, 8))
    assert torch.isinf(lse).all()
    assert (lse < 0).all()


# --- on ranks ------------------------------------------------------------------------------

# (q lengths, k lengths, Hq, Hkv, causal, q layout, kv layout): sequences spanning shards and
# wholly inside one, zero-length and one-token sequences, GQA, empty shards, cross-attention
# with rows that see no key (LSE -inf).
CASES = {
    2: [
        ((9, 0, 5, 1), None, 2, 1, True, "balanced", "balanced"),
        ((5, 3), (3, 4), 2, 1, True, "balanced", "contiguous"),
    ],
    4: [
        ((7, 3, 12), None, 2, 1, True, "balanced", "balanced"),
        ((2, 1), None, 2, 2, True, "contiguous", "contiguous"),
    ],
}


def _case_tensors(case, seed: int):
    q_lens, k_lens, hq, hkv, *_ = case
    k_lens = q_lens if k_lens is None else k_lens
    gen = torch.Generator().manual_seed(seed)
    shapes = ((sum(q_lens), hq, 16), (sum(k_lens), hkv, 16), (sum(k_lens), hkv, 16), (sum(q_lens), hq, 16))
    return [torch.randn(s, generator=gen) for s in shapes], _offsets(q_lens), _offsets(k_lens)


def _layouts(case, world: int):
    q_lens, k_lens, _, _, _, qk, kk = case
    return LAYOUTS[qk](_offsets(q_lens), world), LAYOUTS[kk](_offsets(q_lens if k_lens is None else k_lens), world)


def ring_worker(rank: int, world: int, cases) -> list:
    """Every case on this rank: its shard of the batch through ring_attention, forward and
    backward; returns the local (out, lse, dq, dk, dv)."""
    results = []
    for i, case in enumerate(cases):
        (q, k, v, dout), _, _ = _case_tensors(case, seed=i)
        ql, kl = _layouts(case, world)
        q, dout = cp.shard(q, ql, rank), cp.shard(dout, ql, rank)
        k, v = cp.shard(k, kl, rank), cp.shard(v, kl, rank)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out, lse = cp.ring_attention(q, k, v, ql, kv_layout=kl, causal=case[4], return_lse=True)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        results.append([out.detach(), lse, *grads])
    return results


@pytest.mark.interpret
@pytest.mark.parametrize("world", sorted(CASES))
def test_ring_attention_equals_one_process(world: int) -> None:
    """out, LSE, dQ, dK, dV of ring attention on ``world`` gloo ranks, unsharded, against the
    fp64 reference of the whole batch (tolerance rule: PyTorch's own fp32 error)."""
    cases = CASES[world]
    per_rank = run_ranks(ring_worker, world, cases, timeout=240)
    for i, case in enumerate(cases):
        (q, k, v, dout), qo, ko = _case_tensors(case, seed=i)
        ql, kl = _layouts(case, world)
        got = [
            cp.unshard([per_rank[r][i][j] for r in range(world)], lay, dim=dim)
            for j, (lay, dim) in enumerate([(ql, 0), (ql, 1), (ql, 0), (kl, 0), (kl, 0)])
        ]
        refs = []
        for dtype in (torch.float64, torch.float32):
            leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
            out, lse = attention_reference(*leaves, qo, ko, causal=case[4], compute_dtype=dtype)
            refs.append([out.detach(), lse.detach(), *torch.autograd.grad(out, leaves, dout.to(dtype))])
        assert_close_all([f"case {i} {n}" for n in ("out", "lse", "dq", "dk", "dv")], got, *refs, DEFAULT_ATOL[torch.float32])


def test_ring_attention_refuses_with_every_reason() -> None:
    """Outside a process group, with GQA heads that do not divide: both reasons at once; a
    variant that is not installed: UnsupportedProblem naming it."""
    lay = cp.balanced_layout(_offsets([4]), 1)
    q, k = torch.zeros(4, 3, 16), torch.zeros(4, 2, 16)
    with pytest.raises(InvalidInput) as err:
        cp.ring_attention(q, k, k, lay)
    assert err.value.reasons == [
        "torch.distributed is not initialised (init_process_group)",
        "q [.., 3, 16] and k [.., 2, 16]: Hq % Hkv == 0 and equal head dims needed",
    ]
    with pytest.raises(UnsupportedProblem, match="variant 'no-such-variant'"):
        cp.find_variant("no-such-variant")
