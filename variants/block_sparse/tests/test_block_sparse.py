"""block_sparse_attention against the fp64 reference (the element mask materialised from the
BlockMask with causal/window), forward and backward; rows with no visible block; every block
listed equals the jagged variant; per-head masks and GQA; the plan's listed-block costs;
refusals (the TLX backend's included). The ``test_gpu_*`` tests (marked ``gpu``) run the
portable kernels in bf16/fp16 at head dims 64/128, both block sizes, on skewed batches; the
``test_tlx_*`` tests (marked ``sm90``) the TLX kernels on 128 x 128 masks: forward, one-pass and
deterministic backward against the fp64 reference, every block listed == the jagged variant's
TLX forward bitwise, rows and keys that see nothing, the 64 x 64 refusal, and the TLX kernels
called directly on 64 x 64 masks (their 128 x 128 tiles with bits).

On a CPU these run the portable kernels under Triton's interpreter (nox sets
TRITON_INTERPRET=1), block size 64 to keep the tile loops short; on a GPU the same tests run
in bf16 on the backend the call picks (portable for 64 x 64 masks and small head dims, TLX for
128 x 128 masks at D 64 and 128 on a Hopper GPU).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from jagflash.core.backend import last_choice
from jagflash.core.block_mask import mask_features
from jagflash.core.capability import InvalidInput, UnsupportedProblem
from jagflash.core.jagged import seq_lengths
from jagflash.core.ops import make_problem
from jagflash.core.plan.simulate import section_costs
from jagflash.core.reference import visibility_mask
from jagflash.core.tuning import forced_ring
from jagflash.testing import JaggedCase, check_against_reference, jagged_reference, make_jagged
from jagflash.testing.plugin import require
from jagflash.testing.strategies import jagged_cases
from jagflash.variants.block_sparse import SPEC, BlockMask, block_sparse_attention, local_global

ON_GPU = torch.cuda.is_available()
pytestmark = pytest.mark.gpu if ON_GPU else pytest.mark.interpret
FLOAT = torch.bfloat16 if ON_GPU else torch.float32
DEVICE = "cuda" if ON_GPU else "cpu"
BS = (64, 64)


def _random_mask(t, heads: int, density: float, seed: int, block_size=BS) -> BlockMask:
    lq, lk = seq_lengths(t["q_offsets"]), seq_lengths(t["kv_offsets"])
    nq = -(-int(lq.max()) // block_size[0]) if lq.numel() else 0
    nk = -(-int(lk.max()) // block_size[1]) if lk.numel() else 0
    g = torch.Generator().manual_seed(seed)
    grid = torch.rand(lq.numel(), heads, nq, nk, generator=g) < density
    return BlockMask.from_dense(grid.to(t["q"].device), t["q_offsets"], t["kv_offsets"], block_size)


def _check(
    case: JaggedCase, mask_heads: int, density: float, window=None, seed: int = 0, block_size=BS, device=DEVICE, **kw
) -> BlockMask:
    """The kernels against the reference on ``case`` under a random mask of ``density``
    (``mask_heads`` > 1: one per query head)."""
    if case.dtype == torch.float32:
        case = dataclasses.replace(case, dtype=FLOAT)
    t = case.build(device)
    dout = t.pop("dout")
    m = _random_mask(t, case.hq if mask_heads > 1 else 1, density, seed, block_size)

    def kernel(q, k, v, q_offsets, kv_offsets):
        return block_sparse_attention(
            q, k, v, q_offsets, kv_offsets, m, causal=case.causal, window=window, return_lse=True, **kw
        )

    def reference(q, k, v, q_offsets, kv_offsets, dtype):
        return jagged_reference(
            q, k, v, q_offsets, kv_offsets, causal=case.causal, window=window or (-1, -1), dtype=dtype, block_mask=m
        )

    check_against_reference(kernel, reference, t, atol=SPEC.atol[case.dtype], dout=dout)
    ran = last_choice("block_sparse").name
    assert ran == kw["backend"] if "backend" in kw else ran != "reference"
    return m


CASES = {
    "half_causal": (JaggedCase((70, 0, 130), (100, 5, 130), causal=True), 1, 0.5, None),
    "empty_mask": (JaggedCase((65, 20), (65, 20)), 1, 0.0, None),
    "full_mask_window": (JaggedCase((130,), (130,)), 1, 1.0, (40, 0)),
    "per_head_gqa": (JaggedCase((90, 33), (70, 128), hq=4, hkv=2), 4, 0.5, None),
    "mqa_shared_mask": (JaggedCase((128,), (100,), hq=4, hkv=1, causal=True), 1, 0.5, None),
    "sparse_cross": (JaggedCase((10, 129), (129, 10)), 1, 0.1, None),
    "block_128": (JaggedCase((200, 129), (260, 1)), 1, 0.5, None, 1, (128, 128)),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_reference(name: str) -> None:
    _check(*CASES[name])


@given(
    case=jagged_cases(max_batch=2, max_len=100, head_dims=(16,), groups=(1, 2)),
    per_head=st.booleans(),
    density=st.sampled_from((0.0, 0.1, 0.5, 1.0)),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_reference_property(case: JaggedCase, per_head: bool, density: float, seed: int) -> None:
    _check(case, 2 if per_head else 1, density, seed=seed)


def test_rows_without_visible_blocks_are_zero_with_lse_minus_inf() -> None:
    """A q-block that lists nothing (or only blocks causal hides): output exactly 0, LSE -inf,
    zero dQ; keys no q-block lists get zero dK, dV."""
    t = make_jagged((128,), (128,), 2, 2, 32, FLOAT, DEVICE)
    grid = torch.tensor([[[[False, False], [True, True]]]], device=DEVICE)  # q-block 0 lists nothing
    m = BlockMask.from_dense(grid, t["q_offsets"], t["kv_offsets"], BS)
    out, lse = block_sparse_attention(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], m, return_lse=True)
    assert torch.equal(out[:64], torch.zeros_like(out[:64]))
    assert torch.isneginf(lse[:, :64]).all()
    assert torch.isfinite(lse[:, 64:]).all()
    dq, dk, dv = torch.autograd.grad(out, (t["q"], t["k"], t["v"]), t["dout"])
    assert torch.equal(dq[:64], torch.zeros_like(dq[:64]))
    assert torch.isfinite(dk).all()
    assert torch.isfinite(dv).all()
    # causal: q-block 0 lists only kv-block 1, all of it in q-block 0's future
    grid = torch.tensor([[[[False, True], [True, True]]]], device=DEVICE)
    m = BlockMask.from_dense(grid, t["q_offsets"], t["kv_offsets"], BS)
    out, lse = block_sparse_attention(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], m, causal=True, return_lse=True)
    assert torch.equal(out[:64], torch.zeros_like(out[:64]))
    assert torch.isneginf(lse[:, :64]).all()


def test_every_block_listed_equals_the_jagged_variant() -> None:
    jagged = pytest.importorskip("jagflash.variants.jagged")
    t = make_jagged((40, 0, 100), (50, 3, 100), 4, 2, 16, FLOAT, DEVICE)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    m = _random_mask(t, 1, 1.0, 0)
    for causal in (True,):
        got, got_lse = block_sparse_attention(*args, m, causal=causal, return_lse=True)
        want, want_lse = jagged.jagged_attention(*args, causal=causal, return_lse=True)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_lse, want_lse)
        for a, b in zip(torch.autograd.grad(got, args[:3], t["dout"]), torch.autograd.grad(want, args[:3], t["dout"])):
            torch.testing.assert_close(a, b)


def test_pattern_mask_runs_and_matches_reference() -> None:
    t = make_jagged((200, 64), (200, 64), 2, 2, 16, FLOAT, DEVICE)
    m = local_global(t["q_offsets"], t["kv_offsets"], before=1, sinks=1, block_size=BS)
    dout = t.pop("dout")

    def kernel(q, k, v, q_offsets, kv_offsets):
        return block_sparse_attention(q, k, v, q_offsets, kv_offsets, m, causal=True, return_lse=True)

    def reference(q, k, v, q_offsets, kv_offsets, dtype):
        return jagged_reference(q, k, v, q_offsets, kv_offsets, causal=True, dtype=dtype, block_mask=m)

    check_against_reference(kernel, reference, t, atol=SPEC.atol[FLOAT], dout=dout)


def test_a_mask_mod_mask_runs_as_its_dense_twin() -> None:
    """``from_mask_mod``'s generated kernel hands its four lists as views of one buffer (at
    storage offsets): the kernels read them as the same mask built by ``from_dense``, bit for
    bit, forward and backward (on a Hopper GPU the TLX kernels: 128 x 128 blocks, D 64)."""
    bs, d = ((128, 128), 64) if ON_GPU else (BS, 16)
    t = make_jagged((300, 70, 129), (260, 64, 300), 4, 2, d, FLOAT, DEVICE)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    bm, bn = bs

    def rule(b, h, q_idx, kv_idx):
        qb, kb = q_idx // bm, kv_idx // bn
        return ((kb <= qb) & (kb >= qb - 1)) | (kb < 1) | ((b == 2) & (kb == qb + 1))

    m = BlockMask.from_mask_mod(rule, t["q_offsets"], t["kv_offsets"], 1, bs, evaluator="kernel")
    assert m.kv_indices.storage_offset() > 0  # the views this test is about
    assert m.q_indices.storage_offset() > 0
    twin = BlockMask.from_dense(m.to_dense(), t["q_offsets"], t["kv_offsets"], bs)
    for causal in (False, True):
        got = block_sparse_attention(*args, m, causal=causal, return_lse=True, deterministic=True)  # dQ without atomics: repeatable
        want = block_sparse_attention(*args, twin, causal=causal, return_lse=True, deterministic=True)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        for a, b in zip(torch.autograd.grad(got[0], args[:3], t["dout"]), torch.autograd.grad(want[0], args[:3], t["dout"])):
            assert torch.equal(a, b)


def test_plan_costs_listed_blocks_only() -> None:
    """A cost-sorted plan (``static``) orders forward tiles by the listed kv-blocks of their
    band, summed over the mask's heads, and dK/dV tiles by the q-blocks that list them
    (brute force over the mask's grid): sparse rows balance by what the kernels visit."""
    from jagflash.core.plan.build import build_plan_ints
    from jagflash.core.plan.model import PTR_SAME_CALL, Plan, PlanInfo

    t = make_jagged((200, 0, 70), (260, 5, 70), 2, 1, 16, torch.float32, "cpu", requires_grad=False)
    m = _random_mask(t, 2, 0.5, 3)
    grid = m.to_dense()
    grid[2] = True  # the short sequence: every block, so its tiles outrank sparse ones
    m = BlockMask.from_dense(grid, t["q_offsets"], t["kv_offsets"], BS)
    tiles, meta, ints = build_plan_ints(
        t["q_offsets"], t["kv_offsets"], block_mask=m, batch=3, total_q=t["q"].shape[0], total_kv=t["k"].shape[0],
        heads_q=2, heads_kv=1, causal=True, window=(-1, -1), blocks={p: BS for p in ("fwd", "dq", "dkdv")},
        max_seqlen_q=None, max_seqlen_kv=None, schedule="static", backward_schedule="static", backward=True,
        q_ptr=PTR_SAME_CALL, kv_ptr=PTR_SAME_CALL,
    )
    plan = Plan(tiles, meta, PlanInfo.from_ints(ints), t["q_offsets"], t["kv_offsets"])
    lq, lk = seq_lengths(t["q_offsets"]).tolist(), seq_lengths(t["kv_offsets"]).tolist()

    def fwd_cost(b, m0):
        vis = visibility_mask(lq[b], lk[b], -1, 0)[m0 : m0 + 64]
        band = {int(j) // 64 for j in vis.any(0).nonzero().flatten()}
        return sum(int(grid[b, h, m0 // 64, j]) for h in range(2) for j in band)

    def dkdv_cost(b, n0):
        vis = visibility_mask(lq[b], lk[b], -1, 0)[:, n0 : n0 + 64]
        band = {int(i) // 64 for i in vis.any(1).nonzero().flatten()}
        return sum(int(grid[b, h, i, n0 // 64]) for h in range(2) for i in band)

    for pass_, cost in (("fwd", fwd_cost), ("dkdv", dkdv_cost)):
        rows = section_costs(plan, pass_)[0].tolist()
        costs = [cost(b, s) for b, _, s in rows]
        assert costs == sorted(costs, reverse=True), (pass_, costs)
        dense = section_costs(plan, pass_)[1].tolist()  # the band's costs: what a dense plan sorts by
        assert sum(costs) < 2 * sum(dense)  # two mask heads: at most twice the band, here less


def test_refusals() -> None:
    t = make_jagged((70, 10), (70, 10), 2, 2, 32, FLOAT, DEVICE)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    m = _random_mask(t, 1, 0.5, 0)
    with pytest.raises(InvalidInput, match="block_mask must be a jagflash BlockMask"):
        block_sparse_attention(*args, torch.ones(2, 1, 2, 2, dtype=torch.bool))
    other = make_jagged((10, 70), (10, 70), 2, 2, 32, FLOAT, DEVICE)
    with pytest.raises(InvalidInput, match="built for other q_offsets"):
        block_sparse_attention(*args, _random_mask(other, 1, 0.5, 0))
    per_head = _random_mask(t, 3, 0.5, 0)
    with pytest.raises(InvalidInput, match="block_mask has 3 heads, the call 2 query heads") as e:
        block_sparse_attention(*args, per_head, window=(1, 2, 3))
    assert any("window" in r for r in e.value.reasons)  # every reason at once
    with pytest.raises(UnsupportedProblem, match="forward with block_size_64x64 not supported"):
        block_sparse_attention(*args, m, backend="tlx-sm90")  # TLX takes 128 x 128 masks only


def test_tlx_spec_takes_128_masks_only() -> None:
    """The spec (host only, a Hopper problem posed on any machine): a 128 x 128 mask's features
    are the TLX backend's, a 64 x 64 mask's block size is its reason to refuse (the portable
    kernels take both), in the backward too."""
    from jagflash.core.capability import not_supported_reasons

    q = torch.empty(1, 4, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, 2, 128, dtype=torch.bfloat16, device="meta")
    for backward in (False, True):
        def reasons(block_size, backend, backward=backward):
            problem = make_problem("jagged", q, k, causal=True, backward=backward, features=mask_features(block_size))
            problem = dataclasses.replace(problem, device_type="cuda").with_capability((9, 0))
            return not_supported_reasons(SPEC, problem, backend)

        assert not [r for r in reasons((128, 128), "tlx-sm90") if "block" in r]
        assert any("block_size_64x64 not supported" in r for r in reasons((64, 64), "tlx-sm90"))
        assert not [r for r in reasons((64, 64), "portable") if "block" in r]


def test_reference_backend_runs_when_asked() -> None:
    t = make_jagged((70,), (90,), 2, 1, 16, FLOAT, DEVICE)
    m = _random_mask(t, 1, 0.5, 1)
    out = block_sparse_attention(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], m, causal=True, backend="reference")
    assert last_choice("block_sparse").name == "reference"
    want, _ = jagged_reference(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], causal=True, dtype=torch.float32, block_mask=m)
    tol = SPEC.atol[FLOAT]  # the reference computes in fp32 and rounds to the input dtype
    torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)


# --- GPU only: bf16/fp16, the bench's head dims, both block sizes, skewed lengths -----------

LENGTHS = (1500, 0, 1, 700, 129, 1000)


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [(64, 64), (128, 128)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("causal", "mask_heads", "hkv"), [(False, 1, 4), (True, 4, 2)])
def test_gpu_portable_matches_reference(block_size, head_dim, dtype, causal, mask_heads, hkv) -> None:
    case = JaggedCase(LENGTHS, LENGTHS[::-1], hq=4, hkv=hkv, head_dim=head_dim, dtype=dtype, causal=causal, seed=7)
    q = torch.empty(1, 4, head_dim, dtype=dtype, device="cuda")
    k = torch.empty(1, hkv, head_dim, dtype=dtype, device="cuda")
    problem = make_problem("jagged", q, k, causal=causal, backward=True, features=mask_features(block_size))
    require(SPEC, problem, "portable")
    _check(case, mask_heads, 0.25, block_size=block_size, device="cuda", backend="portable")


@pytest.mark.gpu
def test_gpu_window_inside_blocks() -> None:
    case = JaggedCase((900, 300), (900, 300), hq=2, hkv=2, head_dim=128, dtype=torch.bfloat16, seed=3)
    _check(case, 1, 0.5, window=(200, 0), block_size=(128, 128), device="cuda")


# --- sm_90 only: the TLX kernels on 128 x 128 masks ----------------------------------------

TLX_BS = (128, 128)
BF, HF = torch.bfloat16, torch.float16
#: ``(case, mask heads, density, window)``: densities 0, 0.1, 0.5, 1; causal and window inside
#: the blocks; GQA and MQA with per-head and shared masks; zero-length and 1-token sequences;
#: Lq != Lk; lengths off the 128 grid.
TLX_CASES = {
    "empty_mask": (JaggedCase((300, 0, 129), (300, 0, 129), hq=2, hkv=2), 1, 0.0, None),
    "d01_causal_per_head_gqa": (JaggedCase(LENGTHS, LENGTHS, hq=4, hkv=2, causal=True), 4, 0.1, None),
    "d05_window": (JaggedCase((900, 300, 1), (900, 300, 1), hq=2, hkv=2), 1, 0.5, (200, 0)),
    "d05_two_sided_window_mqa": (JaggedCase((700, 129), (700, 129), hq=4, hkv=1), 4, 0.5, (300, 100)),
    "d05_cross": (JaggedCase(LENGTHS, LENGTHS[::-1], hq=2, hkv=2), 1, 0.5, None),
    "d1_causal_cross": (JaggedCase((5, 400, 1000), (40, 700, 600), hq=2, hkv=1, causal=True), 1, 1.0, None),
}
#: ``(case, head dim, dtype, deterministic)``: each case, head dim, dtype and backward (the one
#: pass and the deterministic two passes) more than once, not their whole product (every
#: distinct configuration is a TLX compile of ~15 s on the GPU host).
TLX_RUNS = [
    ("empty_mask", 128, BF, False), ("empty_mask", 64, HF, True),
    ("d01_causal_per_head_gqa", 128, BF, False), ("d01_causal_per_head_gqa", 128, BF, True),
    ("d01_causal_per_head_gqa", 64, HF, False),
    ("d05_window", 128, BF, False), ("d05_window", 64, HF, True),
    ("d05_two_sided_window_mqa", 128, HF, False), ("d05_two_sided_window_mqa", 64, BF, True),
    ("d05_cross", 64, BF, False), ("d05_cross", 128, HF, True),
    ("d1_causal_cross", 64, HF, False), ("d1_causal_cross", 128, BF, True),
]


def _require_tlx(case: JaggedCase, deterministic: bool, window) -> None:
    q = torch.empty(1, case.hq, case.head_dim, dtype=case.dtype, device="cuda")
    k = torch.empty(1, case.hkv, case.head_dim, dtype=case.dtype, device="cuda")
    problem = make_problem(
        "jagged", q, k, causal=case.causal, window=window or (-1, -1), backward=True, deterministic=deterministic,
        features=mask_features(TLX_BS),
    )
    require(SPEC, problem, "tlx-sm90")


@pytest.mark.sm90
@pytest.mark.parametrize(
    ("name", "head_dim", "dtype", "deterministic"), TLX_RUNS,
    ids=[f"{n}-d{d}-{str(t).split('.')[-1]}-{'det' if det else 'one_pass'}" for n, d, t, det in TLX_RUNS],
)
def test_tlx_matches_reference(name, head_dim, dtype, deterministic) -> None:
    """The TLX forward and backward (one pass: dQ reduce-added; deterministic: the portable
    block-sparse dQ pass, then the TLX dK/dV pass) against the fp64 reference; outputs
    NaN-poisoned by the plugin, so a row the kernels never write fails."""
    case, heads, density, window = TLX_CASES[name]
    case = dataclasses.replace(case, head_dim=head_dim, dtype=dtype, seed=11)
    _require_tlx(case, deterministic, window)
    _check(
        case, heads, density, window=window, seed=5, block_size=TLX_BS, device="cuda", backend="tlx-sm90",
        deterministic=deterministic,
    )


@pytest.mark.sm90
@pytest.mark.parametrize(("name", "head_dim"), [("empty_mask", 128), ("d01_causal_per_head_gqa", 128), ("d05_window", 64),
                                                ("d05_two_sided_window_mqa", 128), ("d05_cross", 128), ("d1_causal_cross", 64)])
def test_tlx_forward_solo_matches_reference(name, head_dim, monkeypatch) -> None:
    """The public call with the forward's ``SOLO`` forced (one consumer warpgroup takes both
    halves of each tile in turn, in 64-key steps, two per listed block, from each half's own walk
    of the list row, which the producer publishes; two programs an SM), forward and backward
    against the fp64 reference, NaN-poisoned."""
    from jagflash.core.tlx import fwd_sm90

    policy = fwd_sm90.fwd_config
    monkeypatch.setattr(fwd_sm90, "fwd_config", lambda **kw: dataclasses.replace(policy(**kw), SOLO=True, Q_BUFS=1))
    case, heads, density, window = TLX_CASES[name]
    case = dataclasses.replace(case, head_dim=head_dim, dtype=BF, seed=11)
    _require_tlx(case, False, window)
    _check(case, heads, density, window=window, seed=5, block_size=TLX_BS, device="cuda", backend="tlx-sm90", deterministic=False)


class _TlxKernels(torch.autograd.Function):
    """The variant's TLX kernels called directly (``kernels_tlx_sm90``: forward, then the one-pass
    or the deterministic backward), for masks the spec does not route to ``tlx-sm90`` yet."""

    @staticmethod
    def forward(ctx, q, k, v, q_offsets, kv_offsets, mask, left, right, deterministic):
        from jagflash.variants.block_sparse import kernels_tlx_sm90 as tlx

        scale = q.shape[-1] ** -0.5
        out, lse = tlx.forward(q, k, v, q_offsets, kv_offsets, int(seq_lengths(q_offsets).max()), left=left, right=right,
                               scale=scale, blocks=mask)
        ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets)
        ctx.call = (mask, left, right, scale, deterministic)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        from jagflash.variants.block_sparse import kernels_tlx_sm90 as tlx

        q, k, v, out, lse, q_offsets, kv_offsets = ctx.saved_tensors
        mask, left, right, scale, deterministic = ctx.call
        dq, dk, dv = tlx.backward(dout.contiguous(), q, k, v, out, lse, q_offsets, kv_offsets, None, left=left, right=right,
                                  scale=scale, deterministic=deterministic, blocks=mask)
        return dq, dk, dv, *([None] * 6)


#: ``(case, head dim, dtype, deterministic)`` of the TLX kernels on 64 x 64 masks (walked as
#: 128 x 128 tiles with each tile's four bits: ``jagflash.core.block_tiles``).
#: ``solo``: the forward's ``SOLO`` forced (64-key steps, two a tile). Each mask kind, head dim,
#: dtype, backward and GQA / MQA, not their product (each distinct configuration is a compile of
#: ~15 s on the GPU host).
TLX_FINE_RUNS = [
    ("empty_mask", 128, BF, False, False), ("d01_causal_per_head_gqa", 128, BF, False, False),
    ("d05_two_sided_window_mqa", 64, HF, False, False), ("d05_cross", 128, BF, True, False),
    ("d1_causal_cross", 128, BF, False, True), ("d05_window", 64, HF, False, True),
]


@pytest.mark.sm90
@pytest.mark.parametrize(
    ("name", "head_dim", "dtype", "deterministic", "solo"), TLX_FINE_RUNS,
    ids=[f"{n}-d{d}-{str(t).split('.')[-1]}-{'det' if det else 'one_pass'}{'-solo' if so else ''}" for n, d, t, det, so in TLX_FINE_RUNS],
)
def test_tlx_kernels_on_64_masks_match_reference(name, head_dim, dtype, deterministic, solo, monkeypatch) -> None:
    """The TLX forward (``SOLO`` forced or not) and backward on 64 x 64 masks, each step masking
    the 64 x 64 blocks its 128 x 128 tile's bits leave out, against the fp64 reference with the
    64 x 64 mask; NaN-poisoned outputs. (The public call routes 64 x 64 masks to the portable
    kernels until these have passed on a GPU: the spec's ``block_size_64x64``.)"""
    from jagflash.core.mask import mask_bounds
    from jagflash.core.tlx import fwd_sm90

    if solo:
        policy = fwd_sm90.fwd_config
        monkeypatch.setattr(fwd_sm90, "fwd_config", lambda **kw: dataclasses.replace(policy(**kw), SOLO=True, Q_BUFS=1))
    case, heads, density, window = TLX_CASES[name]
    case = dataclasses.replace(case, head_dim=head_dim, dtype=dtype, seed=13)
    _require_tlx(case, deterministic, window)
    t = case.build("cuda")
    dout = t.pop("dout")
    m = _random_mask(t, case.hq if heads > 1 else 1, density, 9, (64, 64))
    left, right = mask_bounds(case.causal, window)

    def kernel(q, k, v, q_offsets, kv_offsets):
        return _TlxKernels.apply(q, k, v, q_offsets, kv_offsets, m, left, right, deterministic)

    def reference(q, k, v, q_offsets, kv_offsets, dtype):
        return jagged_reference(
            q, k, v, q_offsets, kv_offsets, causal=case.causal, window=window or (-1, -1), dtype=dtype, block_mask=m
        )

    check_against_reference(kernel, reference, t, atol=SPEC.atol[case.dtype], dout=dout)


@pytest.mark.sm90
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_tlx_every_block_listed_equals_the_jagged_variant_bitwise(causal, head_dim) -> None:
    """Every block listed: the sparse walk visits the band's blocks in the band's order with the
    band's masked / unmasked split, so the forward is the jagged variant's TLX forward, bit for
    bit; the backward agrees within the tolerance rule's bound (the dQ passes tile differently)."""
    jagged = pytest.importorskip("jagflash.variants.jagged")
    case = JaggedCase(LENGTHS, LENGTHS, hq=4, hkv=2, head_dim=head_dim, dtype=torch.bfloat16, causal=causal, seed=2)
    _require_tlx(case, False, None)
    t = case.build("cuda")
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    m = _random_mask(t, 1, 1.0, 0, TLX_BS)
    got, got_lse = block_sparse_attention(*args, m, causal=causal, return_lse=True, backend="tlx-sm90")
    want, want_lse = jagged.jagged_attention(*args, causal=causal, return_lse=True, backend="tlx-sm90")
    assert torch.equal(got, want)
    assert torch.equal(got_lse, want_lse)
    for a, b in zip(torch.autograd.grad(got, args[:3], t["dout"]), torch.autograd.grad(want, args[:3], t["dout"])):
        torch.testing.assert_close(a, b, atol=2 * SPEC.atol[torch.bfloat16], rtol=0.02)


@pytest.mark.sm90
@pytest.mark.parametrize("causal", [False, True])
def test_tlx_forward_tile_ring_on_and_off_bitwise(causal) -> None:
    """The sparse forward hands the consumers decoded tiles and their list positions through the
    tile ring by default; forced off, each consumer walks the list row itself. The same
    arithmetic either way: bitwise equal outputs, on a mask with empty rows (tiles that load no
    Q) at a density that leaves most rows one or two blocks. So does O stored through the Q slot
    (``STAGE_O``), and from it by TMA (``TMA_O``), with the ring on, into NaN-poisoned outputs,
    and the empty rows' zeros written by the ring's producer (``ZERO_EMPTY``), and with the
    consumers holding each record to re-read its fields after the main loop (``HOLD_RECORD``)."""
    from jagflash.core.tlx import fwd_sm90

    case = JaggedCase(LENGTHS, LENGTHS, hq=4, hkv=2, head_dim=128, dtype=torch.bfloat16, causal=causal, seed=6)
    _require_tlx(case, False, None)
    t = case.build("cuda")
    q, k, v, qo, ko = t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"]
    m = _random_mask(t, 1, 0.3, 3, TLX_BS)
    own = torch.arange(m.kv_counts.shape[2], device="cuda") * 128 < seq_lengths(qo)[:, None].to("cuda")
    assert bool((m.kv_counts[:, 0] == 0)[own].any())  # some of the sequences' own q-blocks list nothing
    left, right = (-1, 0) if causal else (-1, -1)
    plan, want = fwd_sm90.plan_and_config(q, k, qo, ko, max(LENGTHS), left=left, right=right, scale=128**-0.5, blocks=m)
    assert want.RING_TILES
    outs = [
        fwd_sm90.forward(
            q, k, v, qo, ko, max(LENGTHS), left=left, right=right, scale=128**-0.5, plan=plan, blocks=m,
            config=forced_ring(want, ring),
        )
        for ring in (True, False)
    ]
    for stage in ({"STAGE_O": True}, {"STAGE_O": True, "TMA_O": True}, {"ZERO_EMPTY": True}, {"ZERO_EMPTY": True, "STAGE_O": True},
                  {"HOLD_RECORD": True}, {"HOLD_RECORD": True, "STAGE_O": True, "TMA_O": True}, {"HOLD_RECORD": True, "ZERO_EMPTY": True}):
        outs.append(fwd_sm90.forward(
            q, k, v, qo, ko, max(LENGTHS), left=left, right=right, scale=128**-0.5, plan=plan, blocks=m,
            config=dataclasses.replace(want, RING_TILES=True, **stage),
        ))
    for out, lse in outs[1:]:
        assert torch.equal(outs[0][0], out)
        assert torch.equal(outs[0][1], lse)


@pytest.mark.sm90
@pytest.mark.parametrize("causal", [False, True])
def test_tlx_backward_tile_ring_on_and_off(causal) -> None:
    """The sparse backward's dK/dV kernel hands the consumers each decoded kv-tile and every
    head's list positions through the tile ring by default; forced off, each consumer walks the
    list rows itself. Each kv-tile runs the same steps in the same order either way: dK and dV
    bitwise equal, in the one pass and in the two passes' dK/dV (there dQ is not the kernel's);
    the one pass's dQ (reduce-added in a run-dependent order) to rounding. Per-head masks over
    GQA (two query heads a K/V head: two heads' positions in each record), at a density that
    leaves kv-tiles no step visits (no K/V load, zeros). So are they with those zeros written by
    the ring's producer (``ZERO_EMPTY``), the consumers never handed those kv-tiles. (Without the
    ring the one pass owns no sequence: ``tuning.forced_ring``; an owner adds the same steps to
    the same dK and dV.) The one pass also with ``SOLE_DQ`` switched (a dQ cell one kv-tile adds
    into written by it; dQ NaN-poisoned first), with the ring and without."""
    from jagflash.core.tlx import bwd_sm90, fwd_sm90

    case = JaggedCase(LENGTHS, LENGTHS, hq=4, hkv=2, head_dim=128, dtype=torch.bfloat16, causal=causal, seed=7)
    _require_tlx(case, False, None)
    t = case.build("cuda", requires_grad=False)
    q, k, v, qo, ko, dout = (t[n] for n in ("q", "k", "v", "q_offsets", "kv_offsets", "dout"))
    m = _random_mask(t, 4, 0.2, 5, TLX_BS)
    own = torch.arange(m.q_counts.shape[2], device="cuda") * 128 < seq_lengths(ko)[:, None].to("cuda")
    assert bool(((m.q_counts == 0) & own[:, None, :]).any())  # some kv-blocks of the sequences list no q-block
    left, right = (-1, 0) if causal else (-1, -1)
    kw = {"left": left, "right": right, "scale": 128**-0.5, "blocks": m}
    out, lse = fwd_sm90.forward(q, k, v, qo, ko, max(LENGTHS), **kw)
    delta = (out.float() * dout.float()).sum(-1).transpose(0, 1).contiguous()
    for deterministic in (False, True):
        plan, want = bwd_sm90.plan_and_config(q, k, qo, ko, left=left, right=right, deterministic=deterministic, blocks=m)
        assert want.RING_TILES
        runs = []
        configs = [forced_ring(want, True), forced_ring(want, False), dataclasses.replace(want, ZERO_EMPTY=not want.ZERO_EMPTY)]
        if not deterministic:  # a dQ cell one kv-tile adds into written by it (SOLE_DQ) or not, with and without the ring
            other = dataclasses.replace(want, SOLE_DQ=not want.SOLE_DQ)
            configs += [other, forced_ring(other, False)]
        for config in configs:
            poison = torch.full_like(q, float("nan"))  # (dQ's block: a cell no one wrote stays NaN)
            del poison
            if deterministic:
                runs.append((None, *bwd_sm90.backward_dkdv(dout, q, k, v, lse, delta, qo, ko, plan=plan, config=config, **kw)))
            else:
                runs.append(bwd_sm90.backward(dout, q, k, v, out, lse, qo, ko, plan=plan, config=config, **kw))
        dq_on, dk_on, dv_on = runs[0]
        for j, (dq_x, dk_x, dv_x) in enumerate(runs[1:]):
            assert torch.equal(dk_on, dk_x), f"dK, deterministic={deterministic}, run {j + 1}"
            assert torch.equal(dv_on, dv_x), f"dV, deterministic={deterministic}, run {j + 1}"
            if not deterministic:
                torch.testing.assert_close(dq_on, dq_x, rtol=2**-7, atol=1e-5)


@pytest.mark.sm90
@pytest.mark.parametrize("deterministic", [False, True], ids=["one_pass", "deterministic"])
def test_tlx_rows_and_keys_that_see_nothing(deterministic) -> None:
    """q-block 0 lists nothing and kv-block 2 is listed by no q-block: O 0, LSE -inf and dQ 0 on
    those rows, dK = dV = 0 on those keys, exactly; with causal, a q-block that lists only
    future blocks sees nothing either."""
    case = JaggedCase((300,), (300,), hq=2, hkv=2, head_dim=128, dtype=torch.bfloat16, seed=4)
    _require_tlx(case, deterministic, None)
    t = case.build("cuda")
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    grid = torch.tensor([[[[False, False, False], [True, True, False], [True, False, False]]]], device="cuda")
    m = BlockMask.from_dense(grid, t["q_offsets"], t["kv_offsets"], TLX_BS)
    out, lse = block_sparse_attention(*args, m, return_lse=True, deterministic=deterministic, backend="tlx-sm90")
    assert torch.equal(out[:128], torch.zeros_like(out[:128]))
    assert torch.isneginf(lse[:, :128]).all()
    assert torch.isfinite(lse[:, 128:]).all()
    dq, dk, dv = torch.autograd.grad(out, args[:3], t["dout"])
    assert torch.equal(dq[:128], torch.zeros_like(dq[:128]))
    assert torch.equal(dk[256:], torch.zeros_like(dk[256:]))
    assert torch.equal(dv[256:], torch.zeros_like(dv[256:]))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    future = torch.tensor([[[[False, True, False], [True, True, False], [True, True, True]]]], device="cuda")
    m = BlockMask.from_dense(future, t["q_offsets"], t["kv_offsets"], TLX_BS)
    out, lse = block_sparse_attention(*args, m, causal=True, return_lse=True, backend="tlx-sm90")
    assert torch.equal(out[:128], torch.zeros_like(out[:128]))
    assert torch.isneginf(lse[:, :128]).all()


@pytest.mark.sm90
def test_tlx_deterministic_backward_repeats_bitwise() -> None:
    case = JaggedCase(LENGTHS, LENGTHS, hq=4, hkv=4, head_dim=128, dtype=torch.bfloat16, causal=True, seed=9)
    _require_tlx(case, True, None)
    t = case.build("cuda")
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    m = _random_mask(t, 4, 0.5, 3, TLX_BS)
    grads = []
    for _ in range(2):
        out = block_sparse_attention(*args, m, causal=True, deterministic=True, backend="tlx-sm90")
        grads.append(torch.autograd.grad(out, args[:3], t["dout"]))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.sm90
def test_tlx_takes_128_masks_and_refuses_64() -> None:
    """On a Hopper GPU a 128 x 128 mask runs on the TLX kernels by default; a 64 x 64 one runs on
    the portable kernels, and forcing TLX is refused with the block size as the reason."""
    case = JaggedCase((300, 70), (300, 70), hq=2, hkv=2, head_dim=128, dtype=torch.bfloat16, seed=1)
    _require_tlx(case, False, None)
    t = case.build("cuda", requires_grad=False)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    block_sparse_attention(*args, _random_mask(t, 1, 0.5, 0, TLX_BS))
    assert last_choice("block_sparse").name == "tlx-sm90"
    fine = _random_mask(t, 1, 0.5, 0, (64, 64))
    block_sparse_attention(*args, fine)
    assert last_choice("block_sparse").name == "portable"
    with pytest.raises(UnsupportedProblem, match="block_size_64x64 not supported"):
        block_sparse_attention(*args, fine, backend="tlx-sm90")


def test_front_door_routes_block_masks_here() -> None:
    """``jagflash.core.attention(..., block_mask=m)`` poses ``block_sparse``: the jagged and
    sliding-window variants refuse it, this one runs it."""
    from jagflash.core.registry import attention, variants

    if "block_sparse" not in variants():
        pytest.skip("jagflash-block-sparse is not installed as a distribution (its entry point)")
    t = make_jagged((70, 20), (70, 20), 2, 2, 16, FLOAT, DEVICE, requires_grad=False)
    m = _random_mask(t, 1, 0.5, 2)
    args = (t["q"], t["k"], t["v"])
    out = attention(*args, q_offsets=t["q_offsets"], kv_offsets=t["kv_offsets"], block_mask=m, causal=True)
    want = block_sparse_attention(*args, t["q_offsets"], t["kv_offsets"], m, causal=True)
    assert torch.equal(out, want)


def test_a_shared_plan_gives_the_calls_own_result() -> None:
    """make_plan once, reused: the same output as a call that builds its own plan; a jagged
    variant's plan (other tiles) is refused."""
    from jagflash.variants.block_sparse import make_plan

    t = make_jagged((100, 30), (100, 64), 2, 1, 16, FLOAT, DEVICE, requires_grad=False)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    m = _random_mask(t, 2, 0.5, 4)
    plan = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], m, causal=True, backward=False)
    assert plan.info.layout("fwd").block_m == 64
    assert torch.equal(block_sparse_attention(*args, m, causal=True, plan=plan), block_sparse_attention(*args, m, causal=True))
    jagged = pytest.importorskip("jagflash.variants.jagged")
    other = jagged.make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], causal=True, backward=False)
    with pytest.raises(InvalidInput, match=r"plan was built for fwd tiles \(block_m, block_n\)=\(\d+, \d+\), this call has \(64, 64\)"):
        block_sparse_attention(*args, m, causal=True, plan=other)


# --- torch integration -------------------------------------------------------------------


def test_opcheck() -> None:
    from jagflash.testing import integration as checks
    from jagflash.variants.block_sparse import op as bsop

    t = make_jagged((9, 0, 20), (12, 5, 70), 2, 1, 16, FLOAT, DEVICE)
    m = _random_mask(t, 2, 0.5, 5)
    args = (
        t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], 64, 128, True, -1, -1,
        m.kv_counts, m.kv_indices, m.q_counts, m.q_indices, 64, 64, 0.25, False, False, "",
    )
    checks.opcheck_ops(bsop.block_sparse_fwd, bsop.block_sparse_bwd, args, t["dout"], False)


def test_torch_compile_fullgraph() -> None:
    from jagflash.testing import integration as checks

    t = make_jagged((9, 70), (12, 70), 2, 2, 16, FLOAT, DEVICE)
    m = _random_mask(t, 1, 0.5, 6)

    def step(q, k, v, qo, ko):
        out = block_sparse_attention(q, k, v, qo, ko, m, causal=True)
        return (out * out).sum()

    checks.assert_compiled_matches_eager(step, (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"]))


@pytest.mark.gpu
def test_gpu_mask_on_another_device_is_refused() -> None:
    t = make_jagged((70,), (70,), 2, 2, 64, torch.bfloat16, "cuda")
    cpu = {n: x.cpu() for n, x in t.items()}
    m = _random_mask(cpu, 1, 0.5, 0)
    with pytest.raises(InvalidInput, match="block_mask on cpu, the offsets on cuda"):
        block_sparse_attention(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], m)
