"""sliding_window_attention against the fp64 reference, forward and backward, jagged, nested and
dense; rows that see no key; a window that covers everything equals the jagged variant; the plan
holds band tiles only; refusals; torch integration; the front door.

On a CPU these run the portable kernels under Triton's interpreter (nox sets
TRITON_INTERPRET=1); on a GPU the same tests run the fastest backend there (tlx-sm90 on an H100
or H200 with TLX, else the stock-Triton kernels). The TLX-specific GPU tests are in
test_sliding_window_tlx_sm90.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import jagflash.core as jc
from jagflash.core.backend import last_choice
from jagflash.core.capability import InvalidInput, UnsupportedProblem
from jagflash.core.jagged import seq_lengths
from jagflash.core.mask import kv_tile_ranges
from jagflash.core.plan.simulate import section_costs
from jagflash.core.reference import visibility_mask
from jagflash.testing import (
    JaggedCase,
    check_against_reference,
    dense_reference,
    jagged_reference,
    make_dense,
    make_jagged,
)
from jagflash.testing import integration as checks
from jagflash.testing.strategies import jagged_cases
from jagflash.variants.sliding_window import SPEC, make_plan, sliding_window_attention
from jagflash.variants.sliding_window import op as swop

ON_GPU = torch.cuda.is_available()
pytestmark = pytest.mark.gpu if ON_GPU else pytest.mark.interpret
#: The interpreter runs fp32; the GPU kernels take fp16/bf16 only, so there fp32 cases run in bf16.
FLOAT = torch.bfloat16 if ON_GPU else torch.float32
DEVICE = "cuda" if ON_GPU else "cpu"
#: Window sides the properties draw: unbounded, 0, 1, odd, and wider than any drawn sequence.
SIDES = (-1, 0, 1, 17, 33, 200)


def _check(case: JaggedCase, window: tuple[int, int], device: str, **kw) -> None:
    if case.dtype == torch.float32:
        case = dataclasses.replace(case, dtype=FLOAT)
    t = case.build(device)
    dout = t.pop("dout")

    def kernel(q, k, v, q_offsets, kv_offsets):
        return sliding_window_attention(
            q, k, v, q_offsets, kv_offsets, window=window, causal=case.causal, return_lse=True, **kw
        )

    def reference(q, k, v, q_offsets, kv_offsets, dtype):
        return jagged_reference(q, k, v, q_offsets, kv_offsets, causal=case.causal, window=window, dtype=dtype)

    check_against_reference(kernel, reference, t, atol=SPEC.atol[case.dtype], dout=dout)
    assert last_choice("sliding_window").name != "reference"


CASES = {
    "causal_left_7": (JaggedCase((0, 1, 37, 0, 70), (0, 1, 37, 0, 70), causal=True), (7, -1)),
    "left_0_right_0": (JaggedCase((33, 65), (33, 65)), (0, 0)),  # the diagonal only
    "two_sided": (JaggedCase((40, 66), (40, 66), hq=4, hkv=2), (5, 9)),
    "right_only": (JaggedCase((50,), (50,)), (-1, 3)),
    "cross_lq_lt_lk": (JaggedCase((5, 40), (40, 70), causal=True), (16, 0)),
    "cross_lq_gt_lk": (JaggedCase((70, 33), (40, 9)), (3, 1)),  # rows that see no key
    "wider_than_sequences": (JaggedCase((30, 45), (30, 45), causal=True), (500, -1)),
    "gqa_4to1": (JaggedCase((33, 64), (47, 64), hq=8, hkv=2, causal=True), (31, 0)),
    "head_dim_96": (JaggedCase((40,), (50,), head_dim=96), (20, 20)),
    "fp16": (JaggedCase((45, 3), (45, 60), dtype=torch.float16, causal=True), (9, 0)),
    "bf16": (JaggedCase((45, 3), (45, 60), dtype=torch.bfloat16), (9, 4)),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_reference(name: str, device: str) -> None:
    _check(*CASES[name], device)


@given(
    case=jagged_cases(max_batch=3, max_len=70, head_dims=(16, 32)),
    left=st.sampled_from(SIDES),
    right=st.sampled_from(SIDES),
)
def test_matches_reference_property(case: JaggedCase, left: int, right: int) -> None:
    if case.causal and right > 0:
        right = 0  # causal with right > 0 is refused (test_refuses_causal_with_right)
    _check(case, (left, right), DEVICE)


@given(
    batch=st.integers(1, 2),
    nq=st.integers(1, 70),
    nk=st.integers(1, 70),
    group=st.sampled_from((1, 2)),
    left=st.sampled_from(SIDES),
    right=st.sampled_from(SIDES),
    causal=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_dense_matches_reference_property(batch, nq, nk, group, left, right, causal, seed) -> None:
    window = (left, 0 if causal and right > 0 else right)
    t = make_dense(batch, nq, nk, 2 * group, 2, 32, FLOAT, DEVICE, seed=seed)
    dout = t.pop("dout")

    def kernel(q, k, v):
        return sliding_window_attention(q, k, v, window=window, causal=causal, return_lse=True)

    def reference(q, k, v, dtype):
        return dense_reference(q, k, v, causal=causal, window=window, dtype=dtype)

    check_against_reference(kernel, reference, t, atol=SPEC.atol[FLOAT], dout=dout)


def test_rows_without_keys_are_zero_with_lse_minus_inf(device: str) -> None:
    """Lq > Lk with a narrow window: the first rows see no key. Their output is exactly 0, LSE
    -inf, and they add nothing to any gradient (their dQ is exactly 0)."""
    t = make_jagged((20, 9), (4, 9), 2, 1, 32, FLOAT, device)
    window = (0, 1)  # row i sees keys [i + d, i + d + 1], d = Lk - Lq = -16 in sequence 0
    out, lse = sliding_window_attention(
        t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], window=window, return_lse=True
    )
    blind = torch.zeros(29, dtype=torch.bool)
    blind[:15] = True  # rows 0..14 of sequence 0: i - 16 + 1 < 0
    assert torch.equal(out[blind], torch.zeros_like(out[blind]))
    assert torch.isneginf(lse[:, blind]).all()
    assert torch.isfinite(lse[:, ~blind]).all()
    dq, dk, dv = torch.autograd.grad(out, (t["q"], t["k"], t["v"]), t["dout"])
    assert torch.equal(dq[blind], torch.zeros_like(dq[blind]))
    assert torch.isfinite(dk).all()
    assert torch.isfinite(dv).all()


@pytest.mark.parametrize("causal", [False, True])
def test_window_covering_everything_equals_the_jagged_variant(causal: bool, device: str) -> None:
    """A window wider than every sequence on both sides is the jagged variant's (full or causal)
    attention: the same output, LSE and gradients (the same kernels on a plan of the same mask
    run bit for bit alike; a plan laid out for a bounded band may order tiles differently, so
    the comparison is to rounding)."""
    jagged = pytest.importorskip("jagflash.variants.jagged")
    t = make_jagged((40, 0, 70), (50, 3, 70), 4, 2, 32, FLOAT, device)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    got, got_lse = sliding_window_attention(*args, window=(500, 500 if not causal else -1), causal=causal, return_lse=True)
    want, want_lse = jagged.jagged_attention(*args, causal=causal, return_lse=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_lse, want_lse)
    for a, b in zip(torch.autograd.grad(got, args[:3], t["dout"]), torch.autograd.grad(want, args[:3], t["dout"])):
        torch.testing.assert_close(a, b)
    unbounded = sliding_window_attention(*args, window=(-1, -1), causal=causal)
    assert torch.equal(unbounded, want)  # (-1, -1) is the jagged variant's own mask and plan


# --- the plan: band tiles only -------------------------------------------------------------


def _brute_blocks(lq: int, lk: int, m0: int, block_m: int, block_n: int, left: int, right: int) -> set[int]:
    """The kv-blocks holding at least one key that some query of the q-tile at ``m0`` sees."""
    vis = visibility_mask(lq, lk, left, right)[m0 : m0 + block_m]
    keys = vis.any(0).nonzero().flatten()
    return {int(j) // block_n for j in keys}


@pytest.mark.parametrize(("window", "causal"), [((40, -1), True), ((0, 0), False), ((7, 70), False), ((100, 3), False)])
def test_plan_holds_band_tiles_only(window, causal) -> None:
    """Every forward tile of the plan visits exactly the kv-blocks its band touches (the range
    the kernels walk, ``mask.kv_tile_ranges``, against a brute-force visibility scan), and each
    dK/dV tile's cost is the q-blocks its band touches: the plan's total work is the band's, far
    below full attention's on long sequences."""
    t = make_jagged((300, 5, 0, 130), (300, 5, 0, 200), 2, 1, 16, torch.float32, "cpu", requires_grad=False)
    plan = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], window=window, causal=causal, backend="interpreter")
    left, right = plan.info.left, plan.info.right
    assert (left, right) == (window[0], 0 if causal else window[1])
    lq, lk = seq_lengths(t["q_offsets"]), seq_lengths(t["kv_offsets"])
    lay = plan.info.layout("fwd")
    rows, costs = section_costs(plan, "fwd")
    assert rows.shape[0] == sum(-(-int(n) // lay.block_m) for n in lq) * 2  # every q-tile, once a head
    for (b, _, m0), cost in zip(rows.tolist(), costs.tolist()):
        lo, _, _, hi = kv_tile_ranges(m0, int(lq[b]), int(lk[b]), lay.block_m, lay.block_n, left, right)
        walked = set(range(int(lo) // lay.block_n, -(-int(hi) // lay.block_n)))
        assert walked == _brute_blocks(int(lq[b]), int(lk[b]), m0, lay.block_m, lay.block_n, left, right)
        assert cost == len(walked)
    full = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], backend="interpreter")
    band_work = int(costs.sum())
    assert band_work < int(section_costs(full, "fwd")[1].sum())
    kv_rows, kv_costs = section_costs(plan, "dkdv")
    dlay = plan.info.layout("dkdv")
    for (b, _, n0), cost in zip(kv_rows.tolist(), kv_costs.tolist()):
        vis = visibility_mask(int(lq[b]), int(lk[b]), left, right)[:, n0 : n0 + dlay.block_n]
        touched = {int(i) // dlay.block_m for i in vis.any(1).nonzero().flatten()}
        assert cost == len(touched)


def test_a_plan_for_another_window_is_refused(device: str) -> None:
    t = make_jagged((30,), (30,), 2, 2, 16, FLOAT, device, requires_grad=False)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    plan = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], window=(8, 0))
    got = sliding_window_attention(*args, window=(8, 0), plan=plan)
    assert torch.equal(got, sliding_window_attention(*args, window=(8, 0)))
    with pytest.raises(InvalidInput, match="mask"):
        sliding_window_attention(*args, window=(9, 0), plan=plan)


def test_dense_plan_is_reused(device: str) -> None:
    t = make_dense(2, 40, 40, 2, 2, 32, FLOAT, device)
    args = (t["q"], t["k"], t["v"])
    plan = make_plan(t["q"], t["k"], window=(5, 0))
    got = sliding_window_attention(*args, window=(5, 0), plan=plan)
    assert torch.equal(got, sliding_window_attention(*args, window=(5, 0)))


# --- torch integration -------------------------------------------------------------------


def _op_args(device: str):
    t = make_jagged((9, 0, 20), (12, 5, 20), 4, 2, 16, FLOAT, device)
    return t, (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], 20, 20, True, 5, -1, 0.25, False, False, "")


def test_opcheck(device: str) -> None:
    t, args = _op_args(device)
    checks.opcheck_ops(swop.sliding_window_fwd, swop.sliding_window_bwd, args, t["dout"], False)


def test_torch_compile_fullgraph(device: str) -> None:
    t = make_jagged((9, 30), (12, 30), 4, 2, 32, FLOAT, device)

    def step(q, k, v, qo, ko):
        out = sliding_window_attention(q, k, v, qo, ko, window=(6, 2), max_seqlen_q=30, max_seqlen_kv=30)
        return (out * out).sum()

    checks.assert_compiled_matches_eager(step, (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"]))


def test_nested_tensors(device: str) -> None:
    t = make_jagged((5, 17, 1), (5, 17, 1), 2, 2, 32, FLOAT, device, requires_grad=False)
    offs = t["q_offsets"].to(torch.int64)
    leaves = [t[n].detach().clone().requires_grad_() for n in ("q", "k", "v")]
    nq, nk, nv = (torch.nested.nested_tensor_from_jagged(x, offsets=offs) for x in leaves)
    out = sliding_window_attention(nq, nk, nv, window=(3, 0))
    assert out.is_nested
    assert out.layout == torch.jagged
    plain = sliding_window_attention(*leaves, offs, offs, window=(3, 0))
    assert torch.equal(out.values(), plain)
    expected = torch.autograd.grad(plain, leaves, t["dout"])
    out.values().backward(t["dout"])
    for leaf, g in zip(leaves, expected):
        assert torch.equal(leaf.grad, g)


def test_front_door_sends_windows_here(device: str) -> None:
    """jagflash.attention with a window reaches this variant, jagged and dense; without one it
    stays with the jagged variant (this one ranks below it)."""
    t = make_jagged((9, 30), (12, 30), 2, 1, 16, FLOAT, device, requires_grad=False)
    args = (t["q"], t["k"], t["v"])
    offs = {"q_offsets": t["q_offsets"], "kv_offsets": t["kv_offsets"]}
    got = jc.attention(*args, **offs, window=(4, 0))
    assert torch.equal(got, sliding_window_attention(*args, *offs.values(), window=(4, 0)))
    d = make_dense(1, 20, 20, 2, 2, 16, FLOAT, device, requires_grad=False)
    got = jc.attention(d["q"], d["k"], d["v"], window=(3, -1), causal=True)
    assert torch.equal(got, sliding_window_attention(d["q"], d["k"], d["v"], window=(3, -1), causal=True))
    jagged = pytest.importorskip("jagflash.variants.jagged")
    got = jc.attention(*args, **offs, causal=True)
    assert torch.equal(got, jagged.jagged_attention(*args, *offs.values(), causal=True))
    assert last_choice("jagged").name != "reference"


# --- refusals -----------------------------------------------------------------------------


def _valid():
    t = make_jagged((3, 4), (3, 4), 2, 1, 32, torch.float32, "cpu", requires_grad=False)
    return [t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"]]


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"window": (-2, 0)}, "window left must be >= -1 (-1: unbounded), got -2"),
        ({"window": (0, -5)}, "window right must be >= -1"),
        ({"window": (1.5, 0)}, "window left must be an int, got float 1.5"),
        ({"window": (True, 0)}, "window left must be an int, got bool True"),
        ({"window": (3,)}, "window must be a pair (left, right) of ints"),
        ({"window": 3}, "window must be a pair (left, right) of ints, got 3"),
        ({"window": (3, 2), "causal": True}, "causal=True means right = 0, but window right is 2"),
        ({"window": (3, 0), "causal": 1}, "causal must be a bool, got int"),
    ],
)
def test_refuses_bad_windows(kw, expected: str) -> None:
    assert expected in checks.refused(sliding_window_attention, _valid(), **kw)


def test_causal_with_right_zero_or_unbounded_is_accepted(device: str) -> None:
    t = make_jagged((3, 4), (3, 4), 2, 1, 32, FLOAT, device, requires_grad=False)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    a = sliding_window_attention(*args, window=(2, 0), causal=True)
    b = sliding_window_attention(*args, window=(2, -1), causal=True)
    assert torch.equal(a, b)
    assert torch.equal(a, sliding_window_attention(*args, window=(2, 0)))


def test_refusal_lists_every_reason() -> None:
    args = _valid()
    args[3] = args[3].float()
    args[2] = args[2][:, :, :16]
    msg = checks.refused(sliding_window_attention, args, window=(-3, 1.0))
    for reason in ("window left must be >= -1", "window right must be an int", "q_offsets must be int32 or int64", "k and v shapes differ"):
        assert reason in msg


@pytest.mark.parametrize(
    ("args", "kw", "expected"),
    [
        (lambda a: a[:4], {}, "pass both q_offsets and kv_offsets (jagged) or neither (dense)"),
        (lambda a: a[:3], {}, r"q must be 4-D [B, N, H, D]"),
        (lambda a: [x[None] for x in a[:3]], {"max_seqlen_q": 2}, "max_seqlen_q=2 is below the dense length 7"),
        (lambda a: [a[0][None], a[1][None].expand(2, -1, -1, -1), a[2][None].expand(2, -1, -1, -1)], {}, "q and k batch sizes differ: 1 vs 2"),
    ],
)
def test_refuses_wrong_shapes(args, kw, expected: str) -> None:
    assert expected in checks.refused(sliding_window_attention, args(_valid()), window=(2, 0), **kw)


def test_refuses_other_backends_and_a_silent_fallback(monkeypatch) -> None:
    checks.check_backend_refusals(
        lambda *a, **kw: sliding_window_attention(*a, window=(2, 0), **kw), _valid(), "sliding_window", monkeypatch
    )


def test_refuses_unsupported_head_dim() -> None:
    t = make_jagged((3,), (3,), 2, 2, 40, torch.float32, "cpu", requires_grad=False)
    msg = checks.refused(
        sliding_window_attention, [t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"]], UnsupportedProblem,
        window=(1, 0), backend="interpreter",
    )
    assert "head_dim 40 not in {16, 32, 64, 96, 128, 256}" in msg


# --- GPU only -----------------------------------------------------------------------------


@pytest.mark.gpu
def test_no_host_sync_with_max_seqlen() -> None:
    t = make_jagged((100, 300, 7), (250, 300, 1), 4, 2, 64, torch.bfloat16, "cuda")
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    kw = dict(window=(64, 0), max_seqlen_q=300, max_seqlen_kv=300)
    sliding_window_attention(*args, **kw).sum().backward()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sliding_window_attention(*args, **kw).backward(t["dout"])
    finally:
        torch.cuda.set_sync_debug_mode("default")
