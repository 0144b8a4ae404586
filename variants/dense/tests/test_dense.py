"""dense_attention against the fp64 reference, forward and backward; refusals; torch
integration. Runs the portable kernels under the interpreter on a CPU, compiled on a GPU."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from jagflash.core.backend import last_choice
from jagflash.core.capability import InvalidInput
from jagflash.testing import check_against_reference, dense_reference, make_dense
from jagflash.variants.dense import SPEC, dense_attention
from jagflash.variants.dense import op as dop

ON_GPU = torch.cuda.is_available()
pytestmark = pytest.mark.gpu if ON_GPU else pytest.mark.interpret
#: The interpreter runs fp32; the GPU kernels take fp16/bf16 only, so there fp32 cases run in bf16.
FLOAT = torch.bfloat16 if ON_GPU else torch.float32


def _check(batch, nq, nk, hq, hkv, dim, dtype, causal, device, seed=0) -> None:
    dtype = FLOAT if dtype == torch.float32 else dtype
    t = make_dense(batch, nq, nk, hq, hkv, dim, dtype, device, seed=seed)
    dout = t.pop("dout")

    def kernel(q, k, v):
        return dense_attention(q, k, v, causal=causal, return_lse=True)

    def reference(q, k, v, dtype):
        return dense_reference(q, k, v, causal=causal, dtype=dtype)

    check_against_reference(kernel, reference, t, atol=SPEC.atol[dtype], dout=dout)
    assert last_choice("dense").name != "reference"


@pytest.mark.parametrize(
    ("batch", "nq", "nk", "hq", "hkv", "dim", "dtype", "causal"),
    [
        (2, 64, 64, 2, 2, 32, torch.float32, True),
        (1, 45, 70, 4, 1, 96, torch.float32, True),  # Nq < Nk, MQA, head dim not a power of two
        (2, 70, 45, 4, 2, 64, torch.float32, True),  # Nq > Nk: top rows see no key
        (1, 33, 33, 2, 2, 16, torch.float16, False),
        (1, 40, 40, 2, 2, 32, torch.bfloat16, True),
    ],
)
def test_matches_reference(batch, nq, nk, hq, hkv, dim, dtype, causal, device) -> None:
    _check(batch, nq, nk, hq, hkv, dim, dtype, causal, device)


@given(
    batch=st.integers(1, 2),
    nq=st.integers(1, 70),
    nk=st.integers(1, 70),
    group=st.sampled_from((1, 2, 4)),
    dim=st.sampled_from((16, 32, 64)),
    causal=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_reference_property(batch, nq, nk, group, dim, causal, seed) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    _check(batch, nq, nk, group, 1, dim, torch.float32, causal, device, seed)


def test_deterministic_flag(device: str) -> None:
    """deterministic=True is accepted; the portable backward is always deterministic, so its
    gradients are bit for bit those of the default, run after run."""
    t = make_dense(1, 20, 33, 2, 1, 16, FLOAT, device)
    args = (t["q"], t["k"], t["v"])
    grads = []
    for det in (False, True, True):
        out = dense_attention(*args, causal=True, deterministic=det)
        grads.append(torch.autograd.grad(out, args, t["dout"]))
        assert last_choice("dense").name in ("portable", "interpreter")
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            assert torch.equal(a, b)


def _op_args(device: str, deterministic: bool = False):
    t = make_dense(2, 20, 33, 4, 2, 16, FLOAT, device)
    return t, (t["q"], t["k"], t["v"], True, 0.25, False, deterministic, "")


def test_opcheck_forward(device: str) -> None:
    _, args = _op_args(device)
    torch.library.opcheck(dop.dense_fwd, args)


@pytest.mark.parametrize("deterministic", [False, True])
def test_opcheck_backward(device: str, deterministic: bool) -> None:
    t, args = _op_args(device, deterministic)
    out, lse = dop.dense_fwd(*args)
    bwd = (t["dout"], t["q"].detach(), t["k"].detach(), t["v"].detach(), out.detach(), lse, *args[3:])
    torch.library.opcheck(dop.dense_bwd, bwd)


@pytest.mark.parametrize("deterministic", [False, True])
def test_torch_compile_fullgraph(device: str, deterministic: bool) -> None:
    t = make_dense(1, 30, 30, 2, 2, 32, FLOAT, device)

    def step(q, k, v):
        return dense_attention(q, k, v, causal=True, deterministic=deterministic).square().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    args = (t["q"], t["k"], t["v"])
    g1 = torch.autograd.grad(compiled(*args), args)
    g2 = torch.autograd.grad(step(*args), args)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


def test_refuses_invalid_input() -> None:
    t = make_dense(2, 8, 8, 2, 2, 32, torch.float32, "cpu", requires_grad=False)
    with pytest.raises(InvalidInput) as info:
        dense_attention(t["q"], t["k"][:1], t["v"].half())
    msg = str(info.value)
    assert "dtypes differ" in msg
    assert "k and v shapes differ" in msg
    with pytest.raises(InvalidInput, match="q and k batch sizes differ"):
        dense_attention(t["q"], t["k"][:1], t["v"][:1])
    with pytest.raises(InvalidInput, match=r"q must be 4-D \[B, N, H, D\]"):
        dense_attention(t["q"][0], t["k"], t["v"])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_large(dtype, causal) -> None:
    _check(2, 1000, 1000, 8, 2, 128, dtype, causal, "cuda")
