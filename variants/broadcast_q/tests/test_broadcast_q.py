"""broadcast_q_attention against the fp64 reference (Q expanded per sequence, dQ summed),
forward and backward, atomic and deterministic dQ; refusals; torch integration; backend choice.

On a CPU these run the portable kernels under Triton's interpreter (nox sets
TRITON_INTERPRET=1); on a GPU the same tests run the stock-Triton kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import jagflash.core as jc
from jagflash.core.backend import last_choice
from jagflash.core.capability import InvalidInput, UnsupportedProblem
from jagflash.core.jagged import offsets_from_lengths
from jagflash.testing import broadcast_q_reference, check_against_reference, replay_in_cuda_graph
from jagflash.testing import integration as checks
from jagflash.testing.strategies import length_lists, lengths
from jagflash.variants.broadcast_q import SPEC, broadcast_q_attention, make_plan
from jagflash.variants.broadcast_q import op as bop

pytestmark = pytest.mark.interpret if not torch.cuda.is_available() else pytest.mark.gpu

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The dtype of the cases that name none: the interpreter runs fp32 as asked; the portable GPU
# kernels take fp16 and bf16 only (SPEC), so on a GPU the same cases run in fp16.
DEFAULT_DTYPE = torch.float32 if DEVICE == "cpu" else torch.float16


def _tol(dtype: torch.dtype) -> dict[str, float]:
    """Slack for comparing two kernel runs whose fp32 sums may differ in order."""
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-3, "atol": 2e-3}


@dataclass(frozen=True)
class Case:
    """One shared ``q [lq, hq, D]`` against K/V sequences of lengths ``k_lens``."""

    lq: int
    k_lens: tuple[int, ...]
    hq: int = 2
    hkv: int = 2
    head_dim: int = 32
    dtype: torch.dtype = DEFAULT_DTYPE
    deterministic: bool = False
    seed: int = 0
    offsets_dtype: torch.dtype = torch.int32

    def build(self, device: str, requires_grad: bool = True) -> dict[str, torch.Tensor]:
        """q, k, v, kv_offsets, and a dout ``[B, lq, hq, D]``."""
        gen = torch.Generator().manual_seed(self.seed)

        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(shape, generator=gen).to(device=device, dtype=self.dtype)

        tk, d = sum(self.k_lens), self.head_dim
        q, k, v = randn(self.lq, self.hq, d), randn(tk, self.hkv, d), randn(tk, self.hkv, d)
        dout = randn(len(self.k_lens), self.lq, self.hq, d)
        for t in (q, k, v):
            t.requires_grad_(requires_grad)
        kv_offsets = offsets_from_lengths(self.k_lens, device, self.offsets_dtype)
        return {"q": q, "k": k, "v": v, "kv_offsets": kv_offsets, "dout": dout}


def _kernel(**kw):
    def run(q, k, v, kv_offsets):
        return broadcast_q_attention(q, k, v, kv_offsets, return_lse=True, **kw)

    return run


def _reference(q, k, v, kv_offsets, dtype):
    return broadcast_q_reference(q, k, v, kv_offsets, dtype=dtype)


def _check(case: Case, device: str, **kw) -> None:
    t = case.build(device)
    dout = t.pop("dout")
    kernel = _kernel(deterministic=case.deterministic, **kw)
    check_against_reference(kernel, _reference, t, atol=SPEC.atol[case.dtype], dout=dout)
    ran = last_choice("broadcast_q").name
    if "backend" in kw:
        assert ran == kw["backend"]
    else:  # tlx-sm90 on an H100/H200 with TLX for head dims 64 and 128, else portable
        assert ran in (("tlx-sm90", "portable") if device == "cuda" else ("interpreter",))


CASES = {
    "zero_and_one_token_kv": Case(40, (0, 1, 37, 0, 1)),
    "every_kv_empty": Case(5, (0, 0)),
    "one_query": Case(1, (1, 40)),
    "lq_not_tile_multiple": Case(33, (20, 65)),
    "lq_zero": Case(0, (3, 40)),
    "gqa_4to1": Case(20, (17, 40), hq=8, hkv=2, head_dim=16),
    "mqa": Case(17, (9, 33), hq=4, hkv=1, head_dim=16),
    "head_dim_16": Case(31, (31, 33), head_dim=16),
    "head_dim_64": Case(20, (45, 0, 3), hq=2, hkv=1, head_dim=64),
    "head_dim_96": Case(20, (40,), hq=2, hkv=1, head_dim=96),
    "fp16": Case(45, (3, 45), hkv=1, dtype=torch.float16),
    "bf16": Case(45, (3, 45), hkv=1, dtype=torch.bfloat16),
    "int64_offsets": Case(10, (10, 50), offsets_dtype=torch.int64),
    "deterministic_gqa": Case(33, (0, 40, 7), hq=4, hkv=2, head_dim=16, deterministic=True),
    "deterministic_fp16_d96": Case(9, (33, 1), hq=2, hkv=1, head_dim=96, dtype=torch.float16, deterministic=True),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_reference(name: str, device: str) -> None:
    _check(CASES[name], device)


@st.composite
def broadcast_cases(draw, max_batch: int = 4, max_len: int = 70, max_lq: int = 70) -> Case:
    """Lq and K/V lengths around the tile edges (zero-length and 1-token sequences, a skewed
    batch), GQA groups 1, 2, 4 with at most 4 query heads, both dQ modes."""
    hq, hkv = draw(st.sampled_from([(1, 1), (2, 2), (2, 1), (4, 2), (4, 1)]))
    return Case(
        lq=draw(lengths(max_lq)),
        k_lens=tuple(draw(length_lists(max_batch=max_batch, max_len=max_len))),
        hq=hq,
        hkv=hkv,
        head_dim=draw(st.sampled_from((16, 32, 64))),
        deterministic=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
        offsets_dtype=draw(st.sampled_from((torch.int32, torch.int64))),
    )


@given(case=broadcast_cases())
def test_matches_reference_property(case: Case) -> None:
    _check(case, DEVICE)


def test_reference_backend(device: str) -> None:
    """The reference backend sums dQ over its per-sequence copies of Q."""
    _check(Case(9, (5, 0, 12), hq=2, hkv=1), device, backend="reference")


def test_empty_batch(device: str) -> None:
    t = Case(5, ()).build(device)
    for det in (False, True):
        out, lse = broadcast_q_attention(t["q"], t["k"], t["v"], t["kv_offsets"], return_lse=True, deterministic=det)
        assert out.shape == (0, 5, 2, 32)
        assert lse.shape == (0, 2, 5)
        dq, dk = torch.autograd.grad(out.sum(), (t["q"], t["k"]))
        assert torch.equal(dq, torch.zeros_like(t["q"]))
        assert dk.shape == (0, 2, 32)


def test_deterministic_backward(device: str) -> None:
    """deterministic=True is bitwise repeatable; the atomic reduction agrees with it."""
    t = Case(40, (33, 0, 50, 7), hq=2, hkv=1).build(device)
    args, dout = (t["q"], t["k"], t["v"]), t["dout"]
    out = broadcast_q_attention(*args, t["kv_offsets"], deterministic=True)
    first = torch.autograd.grad(out, args, dout, retain_graph=True)
    second = torch.autograd.grad(out, args, dout)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    out = broadcast_q_attention(*args, t["kv_offsets"])
    atomic = torch.autograd.grad(out, args, dout)
    for a, b in zip(first, atomic):
        torch.testing.assert_close(a, b, **_tol(DEFAULT_DTYPE))


def test_given_max_seqlen_matches(device: str) -> None:
    t = Case(9, (3, 30)).build(device, requires_grad=False)
    a = broadcast_q_attention(t["q"], t["k"], t["v"], t["kv_offsets"])
    b = broadcast_q_attention(t["q"], t["k"], t["v"], t["kv_offsets"], max_seqlen_kv=30)
    assert torch.equal(a, b)


def test_strided_inputs(device: str) -> None:
    """Row- and head-strided views are read in place; a non-contiguous head dim is copied."""
    t = Case(20, (20, 9)).build(device, requires_grad=False)
    big = torch.randn(20, 3, 64, device=device).to(DEFAULT_DTYPE)
    q = big[:, 1:3, :32]  # strides (192, 64, 1)
    kt = t["k"].transpose(1, 2).contiguous().transpose(1, 2)  # head dim stride 2
    tensors = {"q": q, "k": kt, "v": t["v"], "kv_offsets": t["kv_offsets"]}
    check_against_reference(_kernel(), _reference, tensors, atol=SPEC.atol[DEFAULT_DTYPE])


def test_front_door_dispatches_here(device: str) -> None:
    t = Case(9, (4, 0, 12), hq=2, hkv=1).build(device, requires_grad=False)
    ko = t["kv_offsets"]
    want = broadcast_q_attention(t["q"], t["k"], t["v"], ko)
    assert torch.equal(jc.attention(t["q"], t["k"], t["v"], kv_offsets=ko), want)
    # The flags the front door hands every variant, at their neutral values, are accepted.
    got = jc.attention(t["q"], t["k"], t["v"], kv_offsets=ko, q_offsets=None, causal=False, window=(-1, -1))
    assert torch.equal(got, want)


# --- torch integration --------------------------------------------------------------------


def _op_args(device: str):
    t = Case(9, (12, 0, 20), hq=4, hkv=2, head_dim=16).build(device)
    return t, (t["q"], t["k"], t["v"], t["kv_offsets"], 20, 0.25, False, False, "")


@pytest.mark.parametrize("deterministic", [False, True])
def test_opcheck(device: str, deterministic: bool) -> None:
    t, args = _op_args(device)
    checks.opcheck_ops(bop.broadcast_q_fwd, bop.broadcast_q_bwd, args, t["dout"], deterministic)


def test_torch_compile_fullgraph(device: str) -> None:
    t = Case(9, (12, 30), hq=4, hkv=2).build(device)

    def step(q, k, v, ko):
        out = broadcast_q_attention(q, k, v, ko, max_seqlen_kv=30)
        return (out * out).sum()

    checks.assert_compiled_matches_eager(step, (t["q"], t["k"], t["v"], t["kv_offsets"]), **_tol(DEFAULT_DTYPE))


# --- refusals -----------------------------------------------------------------------------


def _refused(args, exc=InvalidInput, **kw) -> str:
    return checks.refused(broadcast_q_attention, args, exc, **kw)


def _valid(device: str = "cpu"):
    t = Case(5, (3, 4), hq=2, hkv=1, dtype=torch.float32).build(device, requires_grad=False)
    return [t["q"], t["k"], t["v"], t["kv_offsets"]]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda a: a.__setitem__(3, a[3].view(1, -1)), "kv_offsets must be 1-D"),
        (lambda a: a.__setitem__(3, a[3].float()), "kv_offsets must be int32 or int64"),
        (lambda a: a.__setitem__(3, a[3].to("meta")), "kv_offsets is on meta but q is on cpu"),
        (lambda a: a.__setitem__(3, [0, 3, 7]), "kv_offsets must be a torch.Tensor"),
        (lambda a: a.__setitem__(3, torch.tensor([0, 5, 3, 7], dtype=torch.int32)), "kv_offsets must be non-decreasing"),
        (lambda a: a.__setitem__(3, torch.tensor([1, 3, 7], dtype=torch.int32)), "kv_offsets[0] must be 0"),
        (lambda a: a.__setitem__(3, torch.tensor([0, 3, 6], dtype=torch.int32)), "kv_offsets[-1] must equal the number of rows 7"),
        (lambda a: a.__setitem__(1, a[1].half()), "q, k, v dtypes differ"),
        (lambda a: a.__setitem__(2, a[2].to("meta")), "q, k, v devices differ"),
        (lambda a: a.__setitem__(0, a[0][None]), "q must be 3-D [rows, H, D]"),
        (lambda a: a.__setitem__(0, a[0].int()), "q must be a floating-point tensor"),
        (lambda a: [a.__setitem__(i, a[i].repeat(1, 3, 1)) for i in (1, 2)], "Hq (2) must be a multiple of Hkv (3)"),
        (lambda a: a.__setitem__(2, a[2][:, :, :16]), "k and v shapes differ"),
        (lambda a: [a.__setitem__(i, a[i][:, :, :16]) for i in (1, 2)], "head dims differ: q has 32, k has 16"),
    ],
)
def test_refuses_invalid_input(mutate, expected: str) -> None:
    assert expected in _refused(_valid(), mutate=mutate)


def test_refusal_lists_every_reason() -> None:
    args = _valid()
    args[3] = torch.tensor([1, 3, 6], dtype=torch.int32)
    msg = _refused(args)
    assert "kv_offsets[0] must be 0" in msg
    assert "kv_offsets[-1] must equal the number of rows 7, got 6" in msg


def test_refuses_bad_max_seqlen() -> None:
    assert "max_seqlen_kv=3 is below the longest sequence (4)" in _refused(_valid(), max_seqlen_kv=3)
    assert "max_seqlen_kv must be >= 0, got -2" in _refused(_valid(), max_seqlen_kv=-2)


def test_refuses_causal_and_window_through_front_door() -> None:
    q, k, v, ko = _valid()
    with pytest.raises(UnsupportedProblem) as info:
        jc.attention(q, k, v, kv_offsets=ko, causal=True)
    assert "broadcast_q: reference: forward with causal not supported" in str(info.value)
    with pytest.raises(UnsupportedProblem, match="broadcast_q: reference: backward with causal not supported"):
        jc.attention(q.requires_grad_(), k, v, kv_offsets=ko, causal=True)
    with pytest.raises(UnsupportedProblem, match="broadcast_q: reference: backward with window not supported"):
        jc.attention(q, k, v, kv_offsets=ko, window=(8, 0))


def test_has_no_causal_argument_and_checks_its_plan() -> None:
    """Causal has no meaning here; a plan must be one."""
    with pytest.raises(TypeError, match="causal"):
        broadcast_q_attention(*_valid(), causal=True)
    with pytest.raises(InvalidInput, match=r"plan must be a jagflash\.core\.plan\.model\.Plan"):
        broadcast_q_attention(*_valid(), plan=object())


def test_a_shared_plan_runs_forward_and_backward(device: str) -> None:
    """One plan (make_plan) for two calls on the same offsets, grads included; a plan built for
    other offsets is refused."""
    from jagflash.variants.broadcast_q import make_plan

    case = Case(33, (0, 20, 65), hq=4, hkv=2, head_dim=32 if device == "cpu" else 64)
    t = case.build(device)
    plan = make_plan(t["q"], t["k"], t["kv_offsets"])
    dout = t.pop("dout")
    for _ in range(2):
        check_against_reference(
            _kernel(deterministic=False, plan=plan), _reference, t, atol=SPEC.atol[case.dtype], dout=dout
        )
    if device == "cpu":  # on a GPU other offsets' values fail the stream (torch._assert_async)
        other = t["kv_offsets"].clone()
        other[1] += 1
        stale = make_plan(t["q"], t["k"], other)
        with pytest.raises(InvalidInput, match="built for other offsets"):
            broadcast_q_attention(t["q"], t["k"], t["v"], t["kv_offsets"], plan=stale)


def test_refuses_unsupported_head_dim() -> None:
    t = Case(3, (3,), head_dim=40).build("cpu", requires_grad=False)
    msg = _refused([t["q"], t["k"], t["v"], t["kv_offsets"]], UnsupportedProblem, backend="interpreter")
    assert "head_dim 40 not in {16, 32, 64, 96, 128, 256}" in msg


def test_refuses_other_backends_and_a_silent_fallback(monkeypatch) -> None:
    checks.check_backend_refusals(broadcast_q_attention, _valid(), "broadcast_q", monkeypatch)


# --- GPU only -----------------------------------------------------------------------------


@pytest.mark.gpu
def test_no_host_sync_with_max_seqlen() -> None:
    t = Case(128, (250, 300, 0, 7), hq=8, hkv=2, head_dim=64, dtype=torch.bfloat16).build("cuda")
    args = (t["q"], t["k"], t["v"], t["kv_offsets"])
    broadcast_q_attention(*args, max_seqlen_kv=300).sum().backward()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for det in (False, True):
            out = broadcast_q_attention(*args, max_seqlen_kv=300, deterministic=det)
            out.backward(t["dout"])
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_gpu_cuda_graph_forward_backward_with_prebuilt_plan() -> None:
    """A small broadcast-Q step (forward and backward, a plan built once) captured in a CUDA
    graph and replayed on new inputs gives what eager calls give: no host work inside that a
    replay would skip (the output offsets a call keeps, the dynamic tile counter zeroed in the
    graph). Small calls are host-bound (bench/NOTES.md): a graph is how serving would run them."""
    from jagflash.variants.broadcast_q import make_plan

    t = Case(64, (250, 300, 0, 7, 129), hq=8, hkv=2, head_dim=128, dtype=torch.bfloat16).build("cuda")
    leaves = [t[n].detach().clone().requires_grad_() for n in ("q", "k", "v")]
    plan = make_plan(t["q"], t["k"], t["kv_offsets"], max_seqlen_kv=300)
    kw = {"max_seqlen_kv": 300, "plan": plan}

    def step():
        for x in leaves:
            x.grad = None
        out = broadcast_q_attention(*leaves, t["kv_offsets"], **kw)
        out.backward(t["dout"])
        return out

    out = replay_in_cuda_graph(step, leaves)
    eager = [x.detach().clone().requires_grad_() for x in leaves]
    want = broadcast_q_attention(*eager, t["kv_offsets"], **kw)
    grads = torch.autograd.grad(want, eager, t["dout"])
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    # dK/dV are bitwise repeatable; dQ's sum over the sequences runs in whatever order the
    # tiles finish (the one-pass reduce-adds), so it matches to rounding
    torch.testing.assert_close(leaves[0].grad, grads[0], atol=SPEC.atol[torch.bfloat16], rtol=0.02)
    for x, g in zip(leaves[1:], grads[1:]):
        assert torch.equal(x.grad, g)


def _lognormal(n: int, seed: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    lens = torch.clamp(torch.exp(torch.randn(n, generator=gen) + 5.0), 1, 1500).long().tolist()
    lens[3] = 0
    return tuple(lens)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("lq", [64, 256])
def test_gpu_lognormal_batch(lq: int, head_dim: int, deterministic: bool) -> None:
    case = Case(
        lq, _lognormal(64, lq + head_dim), hq=8, hkv=2, head_dim=head_dim, dtype=torch.bfloat16,
        deterministic=deterministic,
    )
    _check(case, "cuda")


@pytest.mark.gpu
def test_gpu_deterministic_is_bitwise() -> None:
    t = Case(256, _lognormal(64, 7), hq=8, hkv=2, head_dim=128, dtype=torch.bfloat16).build("cuda")
    args = (t["q"], t["k"], t["v"])
    grads = []
    for _ in range(3):
        out = broadcast_q_attention(*args, t["kv_offsets"], deterministic=True)
        grads.append(torch.autograd.grad(out, args, t["dout"]))
    for later in grads[1:]:
        for a, b in zip(grads[0], later):
            assert torch.equal(a, b)


@pytest.mark.sm90
@pytest.mark.parametrize(("lq", "lens"), [(17, (0, 5, 300, 129)), (200, _lognormal(24, 5))])
def test_gpu_tlx_is_the_default_on_hopper(lq: int, lens: tuple[int, ...]) -> None:
    """On an H100/H200 with TLX the TLX kernels run both directions (Lq below one TMA box and
    not a multiple of the tile, zero-length sequences)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    case = Case(lq, lens, hq=8, hkv=2, head_dim=128, dtype=torch.bfloat16)
    _check(case, "cuda")
    assert last_choice("broadcast_q").name == "tlx-sm90"


@pytest.mark.sm90
@pytest.mark.parametrize("deterministic", [False, True])
def test_gpu_tlx_walks_a_given_plan(deterministic: bool) -> None:
    """The TLX kernels on a plan from make_plan (forward and dK/dV pass), twice, as layers
    sharing one plan would."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    from jagflash.variants.broadcast_q import make_plan

    case = Case(130, _lognormal(24, 11), hq=8, hkv=2, head_dim=128, dtype=torch.bfloat16, deterministic=deterministic)
    t = case.build("cuda")
    plan = make_plan(t["q"], t["k"], t["kv_offsets"])
    dout = t.pop("dout")
    for _ in range(2):
        check_against_reference(
            _kernel(deterministic=deterministic, plan=plan), _reference, t, atol=SPEC.atol[case.dtype], dout=dout
        )
        assert last_choice("broadcast_q").name == "tlx-sm90"


@pytest.mark.sm90
def test_gpu_tlx_one_pass_backward() -> None:
    """The one-pass TLX backward with the shared Q block (``q_shared``): dQ summed over the
    sequences by the kv-tiles' TMA reduce-adds, dK/dV per sequence, against
    autograd through the reference given its O and LSE; GQA, an empty sequence, Lq not a
    multiple of the tile."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    from jagflash.core.jagged import lse_by_head
    from jagflash.core.tlx import bwd_sm90
    from jagflash.core.tolerance import assert_close_all

    case = Case(130, (0, *_lognormal(12, 13)), hq=8, hkv=2, head_dim=128, dtype=torch.bfloat16)
    t = case.build("cuda", requires_grad=False)
    q, k, v, kv_offsets, dout = (t[n] for n in ("q", "k", "v", "kv_offsets", "dout"))
    grads = {}
    for dtype in (torch.float64, torch.bfloat16):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        out, lse = _reference(*leaves, kv_offsets, dtype)
        grads[dtype] = torch.autograd.grad(out, leaves, dout.to(dtype))
        if dtype == torch.float64:
            ref_out, ref_lse = out.detach(), lse.float()
    batch, (lq, hq, dim) = kv_offsets.numel() - 1, q.shape
    got = bwd_sm90.backward(
        dout.reshape(batch * lq, hq, dim), q, k, v, ref_out.to(q.dtype).reshape(batch * lq, hq, dim),
        lse_by_head(ref_lse), bop.output_offsets(q, kv_offsets), kv_offsets, left=-1, right=-1,
        scale=dim**-0.5, q_shared=True,
    )
    assert_close_all(["dq", "dk", "dv"], list(got), grads[torch.float64], grads[torch.bfloat16], SPEC.atol[case.dtype])


def test_default_schedules_follow_the_plan_backend(monkeypatch) -> None:
    """make_plan with schedule="default": dynamic for the TLX kernels (tile costs follow the
    K/V lengths), grouped / batch order for the portable ones (the plan backend stubbed, so
    this runs on the CPU)."""
    from jagflash.core import backend

    q = torch.zeros(64, 4, 128, dtype=torch.float16)
    k = torch.zeros(300, 4, 128, dtype=torch.float16)
    offs = torch.tensor([0, 100, 300], dtype=torch.int32)
    monkeypatch.setattr(backend, "plan_backend", lambda *a, **k: "tlx-sm90")
    plan = make_plan(q, k, offs)
    assert (plan.info.schedule, plan.info.backward_schedule) == ("dynamic", "dynamic")
    monkeypatch.setattr(backend, "plan_backend", lambda *a, **k: "portable")
    plan = make_plan(q, k, offs)
    assert (plan.info.schedule, plan.info.backward_schedule) == ("grouped", "none")


def test_output_offsets_are_kept_per_shape_in_plain_eager_mode() -> None:
    """The output rows' offsets (arange(B + 1) * Lq): right for every Lq (0 too), the same
    tensor again for the same (B, Lq, device, dtype) in plain eager mode (no kernel per call),
    a fresh one under a dispatch mode (never a cached fake or traced tensor)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jagflash.variants.broadcast_q import op as bop

    kv = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    for lq in (0, 1, 7):
        got = bop.output_offsets(torch.zeros(lq, 2, 8), kv)
        assert got.dtype == torch.int32
        assert got.tolist() == [0, lq, 2 * lq, 3 * lq]
    q = torch.zeros(5, 2, 8)
    assert bop.output_offsets(q, kv) is bop.output_offsets(torch.zeros(5, 1, 16), kv)
    assert bop.output_offsets(q, kv.long()).dtype == torch.int64
    with FakeTensorMode() as mode:
        fake_q, fake_kv = mode.from_tensor(q), mode.from_tensor(kv)
        fresh = bop.output_offsets(fake_q, fake_kv)
    assert fresh is not bop.output_offsets(q, kv)
