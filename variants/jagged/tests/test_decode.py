"""jagged_attention's decode path (``jagflash.core.portable.decode``): chosen by
``jagflash.core.tuning.use_decode``, forced and forbidden by ``decode=``, said by
``last_choice("jagged").explain()``; forward and backward (the decode backward where the
forward is decode, the tile kernels' where not) against the fp64 reference by the tolerance rule. The kernel's own cases
(windows, splits, packing): core/tests/test_decode.py. GPU tests at the bench's shapes, for the
portable and the tlx-sm90 backends, below."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from jagflash.core.backend import last_choice
from jagflash.core.capability import InvalidInput, UnsupportedProblem
from jagflash.core.ops import make_problem
from jagflash.testing import JaggedCase, check_against_reference, jagged_reference, make_jagged
from jagflash.testing.plugin import require
from jagflash.testing.strategies import lengths
from jagflash.variants.jagged import SPEC, jagged_attention, make_plan

ON_GPU = torch.cuda.is_available()
FLOAT = torch.bfloat16 if ON_GPU else torch.float32
DEVICE = "cuda" if ON_GPU else "cpu"
interpret_or_gpu = pytest.mark.gpu if ON_GPU else pytest.mark.interpret


def _check(case: JaggedCase, device: str, *, grad: bool = True, **kw) -> JaggedCase:
    """``case`` (fp32 made ``FLOAT``) against the reference; returns the case it ran."""
    if case.dtype == torch.float32:
        case = dataclasses.replace(case, dtype=FLOAT)
    t = case.build(device, requires_grad=grad)
    dout = t.pop("dout")
    check_against_reference(
        lambda **jagged: jagged_attention(**jagged, causal=case.causal, return_lse=True, **kw),
        lambda **jagged: jagged_reference(**jagged, causal=case.causal),
        t, atol=SPEC.atol[case.dtype], dout=dout if grad else None,
    )
    return case


def _forward_path(case: JaggedCase, device: str, **kw) -> str | None:
    """The forward path a call without gradients takes (a backward records its own choice)."""
    t = case.build(device, requires_grad=False)
    jagged_attention(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], causal=case.causal, **kw)
    return _path()


def _path() -> str | None:
    return last_choice("jagged").path


# --- CPU (interpreter) or GPU (portable build) ------------------------------------------------


@interpret_or_gpu
def test_decode_batch_takes_decode_forward_and_backward() -> None:
    """One to three queries a sequence (zero-length ones too), GQA, causal: the decode forward,
    then the decode backward at its LSE; ``decode=False`` runs the tile kernels both ways."""
    case = _check(JaggedCase((1, 3, 0, 2, 1), (40, 0, 5, 70, 1), hq=4, hkv=2, causal=True), DEVICE)
    assert _path() == "decode"
    assert "backward path: decode (max_seqlen_q 3 <= 16" in last_choice("jagged").explain()
    _check(case, DEVICE, decode=False)
    assert "backward path: tiles (decode=False)" in last_choice("jagged").explain()
    assert _forward_path(case, DEVICE) == "decode"
    assert "forward path: decode (max_seqlen_q 3 <= 16" in last_choice("jagged").explain()


@st.composite
def _decode_cases(draw) -> JaggedCase:
    """0-4 queries a sequence (the automatic decode range), keys around the block sizes, GQA."""
    b = draw(st.integers(1, 6))
    hkv = draw(st.sampled_from((1, 2)))
    return JaggedCase(
        tuple(draw(st.lists(st.integers(0, 4), min_size=b, max_size=b))),
        tuple(draw(st.lists(lengths(70), min_size=b, max_size=b))),
        hq=hkv * draw(st.sampled_from((1, 2, 4))), hkv=hkv, head_dim=draw(st.sampled_from((16, 32))),
        causal=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)),
        offsets_dtype=draw(st.sampled_from((torch.int32, torch.int64))),
    )


@interpret_or_gpu
@given(case=_decode_cases())
def test_decode_forward_and_backward_property(case: JaggedCase) -> None:
    """Random short-query batches: the decode path both ways, against the fp64 reference."""
    _check(case, DEVICE)
    assert _path() == "decode"
    assert last_choice("jagged").path_pass == "backward"


@interpret_or_gpu
def test_decode_forced_on_longer_queries() -> None:
    """``decode=True`` past the automatic bound (40 queries, 40 rows a program)."""
    _check(JaggedCase((40, 7), (50, 90), causal=True), DEVICE, grad=False, decode=True)
    assert _path() == "decode"
    assert "decode=True" in last_choice("jagged").explain()


@interpret_or_gpu
def test_decode_forbidden_and_bound() -> None:
    t = make_jagged((1, 2), (30, 9), 2, 2, 32, FLOAT, DEVICE, requires_grad=False)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    a = jagged_attention(*args, decode=False)
    assert _path() == "tiles"
    assert "forward path: tiles (decode=False)" in last_choice("jagged").explain()
    b = jagged_attention(*args)
    assert _path() == "decode"
    torch.testing.assert_close(a, b, rtol=0, atol=1e-2 if ON_GPU else 1e-5)
    long = make_jagged((17,), (20,), 2, 2, 32, FLOAT, DEVICE, requires_grad=False)
    jagged_attention(long["q"], long["k"], long["v"], long["q_offsets"], long["kv_offsets"])
    assert _path() == "tiles"
    assert "max_seqlen_q 17 > 16" in last_choice("jagged").explain()


@interpret_or_gpu
def test_decode_refused_with_reasons() -> None:
    t = make_jagged((40,), (10,), 8, 2, 32, FLOAT, DEVICE, requires_grad=False)
    with pytest.raises(UnsupportedProblem, match="160 query rows"):
        jagged_attention(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], decode=True)


@interpret_or_gpu
@pytest.mark.parametrize("grad", [False, True])
def test_decode_builds_no_plan_and_checks_a_given_one(monkeypatch, grad: bool) -> None:
    """With ``max_seqlen_q`` given a decode call needs no plan, with gradients or without."""
    import jagflash.core.jagged_call as jc

    t = make_jagged((1, 1, 2), (5, 9, 3), 2, 2, 32, FLOAT, DEVICE, requires_grad=grad)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    other = make_jagged((1, 2, 1), (5, 9, 3), 2, 2, 32, FLOAT, DEVICE, requires_grad=False)
    plan = make_plan(other["q"], other["k"], other["q_offsets"], other["kv_offsets"], backward=grad)

    def no_build(*a, **k):
        raise AssertionError("a decode call built a plan")

    monkeypatch.setattr(jc, "build_plan", no_build)
    out = jagged_attention(*args, max_seqlen_q=2, max_seqlen_kv=9)
    assert _path() == "decode"
    if grad:
        out.backward(torch.ones_like(out))
        assert _path() == "decode"
        assert last_choice("jagged").path_pass == "backward"
    if not ON_GPU:  # on a GPU other offsets' values fail the stream instead
        with pytest.raises(InvalidInput, match="other offsets"):
            jagged_attention(*args, plan=plan)


# --- GPU: the shapes, both backends ---------------------------------------------------

#: Sequences of the long-key GPU cases (keys still split across programs: ~1,000 keys each).
SEQS = 96


def _gpu_case(backend: str, case: JaggedCase, **kw) -> None:
    problem = make_problem("jagged", *(torch.empty(1, h, case.head_dim, dtype=case.dtype, device="cuda") for h in (case.hq, case.hkv)), causal=case.causal, backward=True)
    require(SPEC, problem, backend)
    _check(case, "cuda", backend=backend, **kw)
    assert _forward_path(case, "cuda", backend=backend, **kw) == ("tiles" if kw.get("decode") is False else "decode")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["portable", "tlx-sm90"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_one_token_sequences(backend, dtype) -> None:
    """1,024 one-token sequences (H 16, D 128): packed 64 to a program; forward by decode,
    backward by the backend's kernels."""
    case = JaggedCase((1,) * 1024, (1,) * 1024, hq=16, hkv=16, head_dim=128, dtype=dtype, causal=True)
    _gpu_case(backend, case)
    assert _path() == "decode"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["portable", "tlx-sm90"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_short_queries_long_keys(backend, head_dim, causal) -> None:
    """96 sequences of 1-16 queries against 900-1,100 keys (some empty), GQA 4: keys split
    across programs and merged; automatic choice."""
    gen = torch.Generator().manual_seed(head_dim + causal)
    # 96 sequences, not the bench's 512 (probe_decode.py): the fp64 reference with its autograd
    # graph held ~50 GiB at 512, and 8 xdist workers starved the GPU (session 13, calls 3-4)
    q_lens = torch.randint(1, 17, (SEQS,), generator=gen).tolist()
    k_lens = torch.randint(900, 1100, (SEQS,), generator=gen).tolist()
    q_lens[5], k_lens[7] = 0, 0
    case = JaggedCase(tuple(q_lens), tuple(k_lens), hq=16, hkv=4, head_dim=head_dim, dtype=torch.bfloat16, causal=causal)
    _gpu_case(backend, case)
    assert _path() == "decode"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["portable", "tlx-sm90"])
def test_gpu_forced_decode_up_to_64_queries(backend) -> None:
    """The issue's (1-64 queries vs ~1,024 keys) rows, 96 sequences, ``decode=True`` (64 rows a
    program)."""
    gen = torch.Generator().manual_seed(64)
    q_lens = torch.randint(1, 65, (SEQS,), generator=gen).tolist()
    k_lens = torch.randint(960, 1090, (SEQS,), generator=gen).tolist()
    case = JaggedCase(tuple(q_lens), tuple(k_lens), hq=16, hkv=16, head_dim=128, dtype=torch.bfloat16, causal=True)
    _gpu_case(backend, case, decode=True)
    assert _path() == "decode"


@pytest.mark.gpu
def test_gpu_decode_no_host_sync() -> None:
    t = make_jagged((1,) * 300, (200,) * 300, 8, 2, 128, torch.bfloat16, "cuda", requires_grad=False)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    jagged_attention(*args, causal=True, max_seqlen_q=1, max_seqlen_kv=200)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        jagged_attention(*args, causal=True, max_seqlen_q=1, max_seqlen_kv=200)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert _path() == "decode"
