"""jagged_attention against the fp64 reference, forward and backward; refusals; torch
integration (custom op checks, torch.compile, nested tensors); backend choice.

On a CPU these run the portable kernels under Triton's interpreter (nox sets
TRITON_INTERPRET=1); on a GPU the same tests run the stock-Triton kernels.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given

import jagflash.core as jc
from jagflash.core.backend import last_choice
from jagflash.core.capability import InvalidInput, UnsupportedProblem
from jagflash.testing import JaggedCase, check_against_reference, jagged_reference, make_jagged
from jagflash.testing import integration as checks
from jagflash.testing.strategies import jagged_cases
from jagflash.variants.jagged import SPEC, jagged_attention
from jagflash.variants.jagged import op as jop

ON_GPU = torch.cuda.is_available()
pytestmark = pytest.mark.gpu if ON_GPU else pytest.mark.interpret
#: The interpreter runs fp32; the GPU kernels take fp16/bf16 only, so there fp32 cases run in bf16.
FLOAT = torch.bfloat16 if ON_GPU else torch.float32


def _kernel(causal: bool, **kw):
    def run(q, k, v, q_offsets, kv_offsets):
        return jagged_attention(q, k, v, q_offsets, kv_offsets, causal=causal, return_lse=True, **kw)

    return run


def _reference(causal: bool):
    def run(q, k, v, q_offsets, kv_offsets, dtype):
        return jagged_reference(q, k, v, q_offsets, kv_offsets, causal=causal, dtype=dtype)

    return run


def _check(case: JaggedCase, device: str, **kw) -> None:
    if case.dtype == torch.float32:
        case = dataclasses.replace(case, dtype=FLOAT)
    t = case.build(device)
    dout = t.pop("dout")
    check_against_reference(
        _kernel(case.causal, **kw), _reference(case.causal), t, atol=SPEC.atol[case.dtype], dout=dout
    )
    assert last_choice("jagged").name != "reference"


CASES = {
    "zero_and_one_token": JaggedCase((0, 1, 37, 0, 1), (0, 1, 37, 0, 1), causal=True),
    "zero_length_q_with_keys": JaggedCase((0, 20), (13, 20), causal=False),
    "cross_lq_lt_lk_causal": JaggedCase((5, 40), (40, 70), causal=True),
    "cross_lq_gt_lk_causal": JaggedCase((70, 33), (40, 9), causal=True),  # rows that see no key
    "cross_noncausal": JaggedCase((7, 66), (65, 3)),
    "gqa_4to1_causal": JaggedCase((33, 64), (47, 64), hq=8, hkv=2, causal=True),
    "mqa": JaggedCase((17, 40), (17, 40), hq=4, hkv=1, causal=True),
    "head_dim_96": JaggedCase((40,), (50,), head_dim=96, causal=True),
    "head_dim_16": JaggedCase((31, 33), (31, 33), head_dim=16),
    "head_dim_128": JaggedCase((65,), (65,), hq=1, hkv=1, head_dim=128, causal=True),
    "fp16": JaggedCase((45, 3), (45, 60), dtype=torch.float16, causal=True),
    "bf16": JaggedCase((45, 3), (45, 60), dtype=torch.bfloat16, causal=True),
    "int64_offsets": JaggedCase((10, 50), (10, 50), offsets_dtype=torch.int64, causal=True),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_reference(name: str, device: str) -> None:
    _check(CASES[name], device)


@given(case=jagged_cases(max_batch=3, max_len=70))
def test_matches_reference_property(case: JaggedCase) -> None:
    _check(case, "cuda" if torch.cuda.is_available() else "cpu")


def test_head_dim_256_forward(device: str) -> None:
    if ON_GPU:
        pytest.skip("head dim 256 runs forward only on the GPU too, covered by test_gpu_lognormal_batch shapes")
    t = make_jagged((20, 40), (30, 40), 2, 1, 256, FLOAT, device, requires_grad=False)
    t.pop("dout")
    check_against_reference(_kernel(True), _reference(True), t, atol=SPEC.atol[FLOAT])


def test_empty_batch(device: str) -> None:
    t = make_jagged((), (), 2, 2, 32, FLOAT, device)
    out, lse = jagged_attention(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], return_lse=True)
    assert out.shape == (0, 2, 32)
    assert lse.shape == (2, 0)
    out.sum().backward()
    assert t["k"].grad.shape == (0, 2, 32)


def test_given_max_seqlen_matches(device: str) -> None:
    t = make_jagged((3, 30), (30, 3), 2, 2, 32, FLOAT, device)
    a = jagged_attention(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], causal=True)
    b = jagged_attention(
        t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], causal=True,
        max_seqlen_q=30, max_seqlen_kv=30,
    )
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_strided_inputs(device: str) -> None:
    """Token- and head-strided views are read in place; a non-contiguous head dim is copied.
    Either way the result is bit for bit the one of contiguous copies."""
    t = make_jagged((20, 9), (20, 9), 2, 2, 32, FLOAT, device, requires_grad=False)
    big = torch.randn(29, 3, 64, device=device).to(FLOAT)
    q = big[:, 1:3, :32]  # strides (192, 64, 1): not contiguous
    kt = t["k"].transpose(1, 2).contiguous().transpose(1, 2)  # head dim stride 2
    out = jagged_attention(q, kt, t["v"], t["q_offsets"], t["kv_offsets"])
    want = jagged_attention(q.contiguous(), kt.contiguous(), t["v"], t["q_offsets"], t["kv_offsets"])
    assert torch.equal(out, want)


def test_deterministic_backward(device: str) -> None:
    t = make_jagged((40, 7), (33, 50), 4, 2, 32, FLOAT, device)
    grads = []
    for _ in range(2):
        out = jagged_attention(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], causal=True)
        grads.append(torch.autograd.grad(out, (t["q"], t["k"], t["v"]), t["dout"]))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_deterministic_flag(device: str) -> None:
    """deterministic=True is accepted; the portable backward is always deterministic, so its
    gradients are bit for bit those of the default, run after run."""
    t = make_jagged((20, 0, 7), (17, 5, 30), 2, 1, 16, FLOAT, device)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    grads = []
    for det in (False, True, True):
        out = jagged_attention(*args, causal=True, deterministic=det)
        grads.append(torch.autograd.grad(out, args[:3], t["dout"]))
        assert last_choice("jagged").name in ("portable", "interpreter")
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            assert torch.equal(a, b)


def test_deterministic_through_the_front_door(device: str) -> None:
    """jagflash.attention hands deterministic=True on, for a call with a backward and for one
    without (a forward poses no deterministic feature: it has no reduction order to fix)."""
    t = make_jagged((9, 4), (12, 4), 2, 1, 16, FLOAT, device)
    args = (t["q"], t["k"], t["v"])
    offs = {"q_offsets": t["q_offsets"], "kv_offsets": t["kv_offsets"]}
    want = jagged_attention(*args, *offs.values(), causal=True)
    got = jc.attention(*args, **offs, causal=True, deterministic=True)
    assert torch.equal(got, want)
    for a, b in zip(torch.autograd.grad(got, args, t["dout"]), torch.autograd.grad(want, args, t["dout"])):
        assert torch.equal(a, b)
    detached = [a.detach() for a in args]
    assert torch.equal(jc.attention(*detached, **offs, causal=True, deterministic=True), want)


# --- torch integration --------------------------------------------------------------------


def _op_args(device: str):
    t = make_jagged((9, 0, 20), (12, 5, 20), 4, 2, 16, FLOAT, device)
    return t, (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], 20, 20, True, 0.25, False, False, "")


@pytest.mark.parametrize("deterministic", [False, True])
def test_opcheck(device: str, deterministic: bool) -> None:
    t, args = _op_args(device)
    checks.opcheck_ops(jop.jagged_fwd, jop.jagged_bwd, args, t["dout"], deterministic)


@pytest.mark.parametrize("deterministic", [False, True])
def test_torch_compile_fullgraph(device: str, deterministic: bool) -> None:
    t = make_jagged((9, 30), (12, 30), 4, 2, 32, FLOAT, device)

    def step(q, k, v, qo, ko):
        out = jagged_attention(
            q, k, v, qo, ko, causal=True, max_seqlen_q=30, max_seqlen_kv=30, deterministic=deterministic
        )
        return (out * out).sum()

    checks.assert_compiled_matches_eager(step, (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"]))


def test_plain_eager_calls_run_the_op_body_with_the_same_results(device: str) -> None:
    """A plain eager call skips the dispatcher (``core.ops.register_autograd``: the op's body
    through an autograd.Function); under a torch function mode (``with torch.device``) the call
    goes through the custom op. Both give the same output and gradients, bit for bit
    (deterministic backward)."""
    t = make_jagged((9, 30, 0), (12, 30, 5), 4, 2, 32, FLOAT, device)
    leaves = (t["q"], t["k"], t["v"])

    def run():
        out = jagged_attention(*leaves, t["q_offsets"], t["kv_offsets"], causal=True, deterministic=True)
        return out, torch.autograd.grad(out, leaves, t["dout"])

    eager, eager_grads = run()
    assert type(eager.grad_fn).__name__ == "jagged_fwd_eagerBackward"
    with torch.device(device):
        viaop, op_grads = run()
    assert "eager" not in type(viaop.grad_fn).__name__
    assert torch.equal(eager, viaop)
    for a, b in zip(eager_grads, op_grads):
        assert torch.equal(a, b)


def test_nested_tensors(device: str) -> None:
    t = make_jagged((5, 17, 1), (5, 17, 1), 2, 2, 32, FLOAT, device, requires_grad=False)
    offs = t["q_offsets"].to(torch.int64)
    leaves = [t[n].detach().clone().requires_grad_() for n in ("q", "k", "v")]
    nq, nk, nv = (torch.nested.nested_tensor_from_jagged(x, offsets=offs) for x in leaves)
    out = jagged_attention(nq, nk, nv, causal=True)
    assert out.is_nested
    assert out.layout == torch.jagged
    plain = jagged_attention(*leaves, offs, offs, causal=True)
    assert torch.equal(out.values(), plain)
    expected = torch.autograd.grad(plain, leaves, t["dout"])
    out.values().backward(t["dout"])
    for leaf, g in zip(leaves, expected):
        assert torch.equal(leaf.grad, g)


# --- refusals -----------------------------------------------------------------------------


def _refused(args, exc=InvalidInput, **kw) -> str:
    return checks.refused(jagged_attention, args, exc, **kw)


def _valid(device: str = "cpu"):
    t = make_jagged((3, 4), (3, 4), 2, 1, 32, torch.float32, device, requires_grad=False)
    return [t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"]]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda a: a.__setitem__(3, a[3].view(1, -1)), "q_offsets must be 1-D"),
        (lambda a: a.__setitem__(3, a[3].float()), "q_offsets must be int32 or int64"),
        (lambda a: a.__setitem__(4, a[4].to("meta")), "kv_offsets is on meta but q is on cpu"),
        (lambda a: a.__setitem__(3, torch.tensor([0, 5, 3, 7], dtype=torch.int32)), "non-decreasing"),
        (lambda a: a.__setitem__(3, torch.tensor([1, 3, 7], dtype=torch.int32)), "q_offsets[0] must be 0"),
        (lambda a: a.__setitem__(4, torch.tensor([0, 3, 6], dtype=torch.int32)), "kv_offsets[-1] must equal the number of rows 7"),
        (lambda a: a.__setitem__(4, torch.tensor([0, 7], dtype=torch.int32)), "B+1 entries"),
        (lambda a: a.__setitem__(1, a[1].half()), "dtypes differ"),
        (lambda a: a.__setitem__(2, a[2].to("meta")), "devices differ"),
        (lambda a: a.__setitem__(0, a[0][:, :, None]), "q must be 3-D [T, H, D]"),
        (lambda a: [a.__setitem__(i, a[i].repeat(1, 3, 1)) for i in (1, 2)], "Hq (2) must be a multiple of Hkv (3)"),
        (lambda a: a.__setitem__(2, a[2][:, :, :16]), "k and v shapes differ"),
        (lambda a: a.__setitem__(0, a[0].int()), "q must be a floating-point tensor"),
        (lambda a: a.__setitem__(3, [0, 3, 7]), "q_offsets must be a torch.Tensor"),
    ],
)
def test_refuses_invalid_input(mutate, expected: str) -> None:
    assert expected in _refused(_valid(), mutate=mutate)


def test_refusal_lists_every_reason() -> None:
    args = _valid()
    args[3] = args[3].float()
    args[4] = args[4].view(1, -1)
    msg = _refused(args)
    assert "q_offsets must be int32 or int64" in msg
    assert "kv_offsets must be 1-D" in msg


def test_refuses_max_seqlen_below_longest() -> None:
    assert "max_seqlen_q=2 is below the longest sequence (4)" in _refused(_valid(), max_seqlen_q=2)


def test_refuses_unsupported_head_dim() -> None:
    t = make_jagged((3,), (3,), 2, 2, 40, torch.float32, "cpu", requires_grad=False)
    msg = _refused([t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"]], UnsupportedProblem, backend="interpreter")
    assert "head_dim 40 not in {16, 32, 64, 96, 128, 256}" in msg


def test_refuses_other_backends_and_a_silent_fallback(monkeypatch) -> None:
    checks.check_backend_refusals(jagged_attention, _valid(), "jagged", monkeypatch)


def test_refuses_mixed_nested_and_plain() -> None:
    args = _valid()
    offs = args[3].to(torch.int64)
    nq = torch.nested.nested_tensor_from_jagged(args[0], offsets=offs)
    assert "q is nested but k is not" in _refused([nq, args[1], args[2]])


# --- backend choice -----------------------------------------------------------------------


def test_explicit_reference_backend_and_explain() -> None:
    args = _valid()
    jagged_attention(*args, backend="reference")
    choice = last_choice("jagged")
    assert choice.name == "reference"
    assert "requested" in choice.why
    assert "reference" in choice.explain()


def test_env_override(monkeypatch) -> None:
    monkeypatch.setenv("JAGFLASH_BACKEND", "reference")
    jagged_attention(*_valid())
    assert last_choice("jagged").name == "reference"
    assert "JAGFLASH_BACKEND=reference" in last_choice("jagged").why


# --- GPU only -----------------------------------------------------------------------------


@pytest.mark.gpu
def test_no_host_sync_with_max_seqlen() -> None:
    t = make_jagged((100, 300, 7), (250, 300, 1), 4, 2, 64, torch.bfloat16, "cuda")
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    jagged_attention(*args, causal=True, max_seqlen_q=300, max_seqlen_kv=300).sum().backward()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = jagged_attention(*args, causal=True, max_seqlen_q=300, max_seqlen_kv=300)
        out.backward(t["dout"])
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_lognormal_batch(dtype, causal, head_dim) -> None:
    gen = torch.Generator().manual_seed(head_dim + causal)
    lens = torch.clamp(torch.exp(torch.randn(24, generator=gen) + 5.0), 1, 1500).long().tolist()
    lens[3] = 0
    case = JaggedCase(tuple(lens), tuple(lens), hq=8, hkv=2, head_dim=head_dim, dtype=dtype, causal=causal)
    _check(case, "cuda")
