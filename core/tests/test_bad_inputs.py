"""The catalogue of bad inputs (``jagflash.core.checks``, docs/semantics.md "Bad inputs"): each
class is refused with a typed error naming the problem before any kernel runs, or, where the
input is valid (empty batches, NaN/inf, odd strides), gets the result the semantics give.

Refusals read no kernel, so they run anywhere; the cases that compute run the interpreter
(CPU) or the portable kernels (GPU) on tiny shapes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from jagflash.core.capability import InterpreterChanged, InvalidInput, UnsupportedProblem
from jagflash.testing import make_jagged

jagged = pytest.importorskip("jagflash.variants.jagged")
dense = pytest.importorskip("jagflash.variants.dense")
broadcast_q = pytest.importorskip("jagflash.variants.broadcast_q")

ON_GPU = torch.cuda.is_available()
DEV = "cuda" if ON_GPU else "cpu"
FLOAT = torch.float16 if ON_GPU else torch.float32


def _args(q_lens=(3, 4), k_lens=(3, 4), hq=2, hkv=1, dim=32, dtype=torch.float32, device="cpu", grad=False):
    t = make_jagged(q_lens, k_lens, hq, hkv, dim, dtype, device, requires_grad=grad)
    return {"q": t["q"], "k": t["k"], "v": t["v"], "q_offsets": t["q_offsets"], "kv_offsets": t["kv_offsets"]}


def _i32(*xs):
    return torch.tensor(xs, dtype=torch.int32)


def _with(**over):
    def build():
        a = _args()
        a.update({k: (f(a) if callable(f) else f) for k, f in over.items()})
        return a

    return build


def _plan_of_other_offsets():
    a = _args()
    other = _args(q_lens=(4, 3), k_lens=(4, 3))  # same B, Tq, Tk: only the values differ
    a["plan"] = jagged.make_plan(other["q"], other["k"], other["q_offsets"], other["kv_offsets"], backend="interpreter")
    return a


def _plan_of_other_shapes():
    a = _args()
    other = _args(q_lens=(3, 5), k_lens=(3, 5))
    a["plan"] = jagged.make_plan(other["q"], other["k"], other["q_offsets"], other["kv_offsets"], backend="interpreter")
    return a


def _plan_without_backward():
    a = _args(grad=True)
    a["plan"] = jagged.make_plan(a["q"], a["k"], a["q_offsets"], a["kv_offsets"], backward=False, backend="interpreter")
    return a


def _float_offsets_requiring_grad(a):
    return a["q_offsets"].float().requires_grad_()


# (class, build the call's arguments, error type, what the message must name)
JAGGED_REFUSED = [
    ("offsets-not-a-tensor", _with(q_offsets=[0, 3, 7]), InvalidInput, "q_offsets must be a torch.Tensor, got list"),
    ("offsets-dtype", _with(q_offsets=lambda a: a["q_offsets"].to(torch.int16)), InvalidInput, "q_offsets must be int32 or int64, got torch.int16"),
    ("offsets-device", _with(kv_offsets=lambda a: a["kv_offsets"].to("meta")), InvalidInput, "kv_offsets is on meta but q is on cpu"),
    ("offsets-rank", _with(q_offsets=lambda a: a["q_offsets"].view(1, -1)), InvalidInput, "q_offsets must be 1-D"),
    ("offsets-empty", _with(q_offsets=torch.zeros(0, dtype=torch.int32)), InvalidInput, "q_offsets must have at least one element"),
    ("offsets-decreasing", _with(q_offsets=_i32(0, 5, 3, 7), kv_offsets=_i32(0, 1, 3, 7)), InvalidInput, "q_offsets must be non-decreasing"),
    ("offsets-first-not-0", _with(q_offsets=_i32(1, 3, 7)), InvalidInput, "q_offsets[0] must be 0, got 1"),
    ("offsets-last-not-T", _with(kv_offsets=_i32(0, 3, 6)), InvalidInput, "kv_offsets[-1] must equal the number of rows 7, got 6"),
    ("offsets-overflow-int32", _with(kv_offsets=torch.tensor([0, 3, 2**31 + 7])), InvalidInput, "beyond int32"),
    ("offsets-batch-mismatch", _with(kv_offsets=_i32(0, 7)), InvalidInput, "q_offsets and kv_offsets must both have B+1 entries, got 3 and 2"),
    ("offsets-requires-grad", _with(q_offsets=_float_offsets_requiring_grad), InvalidInput, "q_offsets must not require grad"),
    ("max-seqlen-below-a-length", _with(max_seqlen_q=3), InvalidInput, "max_seqlen_q=3 is below the longest sequence (4)"),
    ("max-seqlen-negative", _with(max_seqlen_kv=-2), InvalidInput, "max_seqlen_kv must be >= 0, got -2"),
    ("max-seqlen-not-int", _with(max_seqlen_q=4.0), InvalidInput, "max_seqlen_q must be an int or None, got float"),
    ("qkv-not-a-tensor", _with(q=lambda a: a["q"].tolist()), InvalidInput, "q must be a torch.Tensor, got list"),
    ("qkv-rank", _with(q=lambda a: a["q"].flatten(1)), InvalidInput, "q must be 3-D [T, H, D], got shape (7, 64)"),
    ("qkv-sparse-layout", _with(k=lambda a: a["k"].to_sparse()), InvalidInput, "k must be a strided (dense) tensor"),
    ("kv-shapes-differ", _with(v=lambda a: a["v"][:, :, :16]), InvalidInput, "k and v shapes differ"),
    ("head-dims-differ", _with(k=lambda a: a["k"][:, :, :16], v=lambda a: a["v"][:, :, :16]), InvalidInput, "head dims differ: q has 32, k has 16"),
    ("dtype-not-float", _with(q=lambda a: a["q"].to(torch.int32)), InvalidInput, "q must be a floating-point tensor, got torch.int32"),
    ("dtypes-differ", _with(v=lambda a: a["v"].half()), InvalidInput, "q, k, v dtypes differ"),
    ("head-dim-0", lambda: _args(dim=0), InvalidInput, "head dim must be at least 1"),
    ("zero-heads", lambda: _args(hq=0), InvalidInput, "q must have at least one head"),
    ("gqa-ratio", lambda: _args(hq=3, hkv=2), InvalidInput, "Hq (3) must be a multiple of Hkv (2)"),
    ("hkv-above-hq", lambda: _args(hq=2, hkv=4), InvalidInput, "Hq (2) must be a multiple of Hkv (4)"),
    ("device-mismatch", _with(k=lambda a: a["k"].to("meta"), v=lambda a: a["v"].to("meta")), InvalidInput, "q, k, v devices differ: cpu, meta, meta"),
    ("plan-not-a-plan", _with(plan=("tiles", "meta")), InvalidInput, "plan must be a jagflash.core.plan.model.Plan, got tuple"),
    ("plan-other-offsets", _plan_of_other_offsets, InvalidInput, "the plan was built for other offsets"),
    ("plan-other-shapes", _plan_of_other_shapes, InvalidInput, "the plan was built for Tq=8, this call has 7"),
    ("plan-without-backward", _plan_without_backward, InvalidInput, "the plan has no backward passes"),
    ("scale-nan", _with(scale=float("nan")), InvalidInput, "scale must be finite, got nan"),
    ("scale-inf", _with(scale=float("-inf")), InvalidInput, "scale must be finite, got -inf"),
    ("scale-not-a-number", _with(scale="0.1"), InvalidInput, "scale must be a real number or None, got str"),
    # valid problems the kernels do not take: refused, never run on the reference silently
    ("dtype-no-kernel", lambda: _args(dtype=torch.float64), UnsupportedProblem, "interpreter: dtype float64 not in"),
    ("head-dim-no-kernel", lambda: _args(dim=7), UnsupportedProblem, "interpreter: head_dim 7 not in"),
]


@pytest.mark.parametrize(("build", "exc", "expected"), [c[1:] for c in JAGGED_REFUSED], ids=[c[0] for c in JAGGED_REFUSED])
def test_jagged_refuses(build, exc, expected, monkeypatch) -> None:
    monkeypatch.delenv("JAGFLASH_ALLOW_REFERENCE", raising=False)
    monkeypatch.delenv("JAGFLASH_BACKEND", raising=False)
    a = build()
    with pytest.raises(exc) as err:
        jagged.jagged_attention(**a)
    assert expected in str(err.value)


def test_catalogue_has_25_classes() -> None:
    assert len({c[0] for c in JAGGED_REFUSED}) >= 25


def test_every_reason_at_once() -> None:
    a = _args()
    with pytest.raises(InvalidInput) as err:
        jagged.jagged_attention(
            a["q"], a["k"], a["v"].half(), a["q_offsets"].float(), a["kv_offsets"].view(1, -1), max_seqlen_q=-1
        )
    reasons = err.value.reasons
    assert any("dtypes differ" in r for r in reasons)
    assert any("q_offsets must be int32 or int64" in r for r in reasons)
    assert any("kv_offsets must be 1-D" in r for r in reasons)
    assert any("max_seqlen_q must be >= 0" in r for r in reasons)
    with pytest.raises(InvalidInput) as err:  # the values' problems, with the batch mismatch
        jagged.jagged_attention(a["q"], a["k"], a["v"], _i32(1, 9, 7), _i32(0, 7))
    assert len(err.value.reasons) == 3, err.value.reasons


def test_slow_path_needs_asking(monkeypatch) -> None:
    """No silent slow path: the refusal names every backend's reasons and the opt-in; the
    reference runs with backend="reference" or JAGFLASH_ALLOW_REFERENCE=1."""
    monkeypatch.delenv("JAGFLASH_ALLOW_REFERENCE", raising=False)
    monkeypatch.delenv("JAGFLASH_BACKEND", raising=False)
    a = _args(dim=7)
    with pytest.raises(UnsupportedProblem) as err:
        jagged.jagged_attention(**a)
    names = {r.split(":")[0] for r in err.value.reasons}
    assert names == set(jagged.SPEC.backend_names())
    assert "JAGFLASH_ALLOW_REFERENCE=1" in str(err.value)
    want = jagged.jagged_attention(**a, backend="reference")
    monkeypatch.setenv("JAGFLASH_ALLOW_REFERENCE", "1")
    torch.testing.assert_close(jagged.jagged_attention(**a), want)
    monkeypatch.setenv("JAGFLASH_ALLOW_REFERENCE", "0")
    with pytest.raises(UnsupportedProblem):
        jagged.jagged_attention(**a)


def test_dense_refuses() -> None:
    q = torch.zeros(2, 4, 2, 32)
    with pytest.raises(InvalidInput, match="q and k batch sizes differ: 2 vs 3"):
        dense.dense_attention(q, torch.zeros(3, 4, 2, 32), torch.zeros(3, 4, 2, 32))
    with pytest.raises(InvalidInput, match=r"q must be 4-D \[B, N, H, D\]"):
        dense.dense_attention(q[0], q, q)


def test_broadcast_q_refuses() -> None:
    a = _args()
    with pytest.raises(InvalidInput) as err:
        broadcast_q.broadcast_q_attention(a["q"], a["k"], a["v"], _i32(0, 5, 3, 7), max_seqlen_kv=-1)
    assert "max_seqlen_kv must be >= 0" in str(err.value)
    with pytest.raises(InvalidInput, match="kv_offsets must be non-decreasing"):
        broadcast_q.broadcast_q_attention(a["q"], a["k"], a["v"], _i32(0, 5, 3, 7))


# --- valid inputs: what they get ------------------------------------------------------------


def _kernel_backend() -> str | None:
    return None if ON_GPU else "interpreter"


@pytest.mark.parametrize(("q_lens", "k_lens"), [((), ()), ((0, 0), (0, 0)), ((3, 0), (0, 2))], ids=["B0", "T0", "no-keys"])
def test_empty_batches_give_empty_results(q_lens, k_lens) -> None:
    """B = 0 and T = 0 give an empty result (and empty gradients); a query with no key gets 0."""
    a = _args(q_lens=q_lens, k_lens=k_lens, dtype=FLOAT, device=DEV, grad=True)
    out, lse = jagged.jagged_attention(**a, return_lse=True, backend=_kernel_backend())
    assert out.shape == a["q"].shape
    assert lse.shape == (2, sum(q_lens))
    assert torch.all(out == 0)
    assert torch.all(lse == float("-inf"))
    out.sum().backward()
    for t in ("q", "k", "v"):
        assert a[t].grad.shape == a[t].shape
        assert torch.all(a[t].grad == 0)


def test_empty_dense_and_broadcast_q() -> None:
    """Dense B = 0, broadcast-Q B = 0 and Lq = 0: empty results, empty or zero gradients."""
    q = torch.randn(0, 3, 2, 32, dtype=FLOAT, device=DEV, requires_grad=True)
    out = dense.dense_attention(q, q, q, backend=_kernel_backend())
    assert out.shape == q.shape
    out.sum().backward()
    assert q.grad.shape == q.shape
    q = torch.randn(3, 2, 32, dtype=FLOAT, device=DEV, requires_grad=True)
    k = torch.randn(0, 2, 32, dtype=FLOAT, device=DEV)
    out = broadcast_q.broadcast_q_attention(q, k, k, torch.zeros(1, dtype=torch.int32, device=DEV), backend=_kernel_backend())
    assert out.shape == (0, 3, 2, 32)
    out.sum().backward()
    assert torch.all(q.grad == 0)
    k = torch.randn(5, 2, 32, dtype=FLOAT, device=DEV)
    out = broadcast_q.broadcast_q_attention(q[:0], k, k, torch.tensor([0, 2, 5], device=DEV), backend=_kernel_backend())
    assert out.shape == (2, 0, 2, 32)


# numpy (the interpreter) warns on the NaN arithmetic the test asks for
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_nan_and_inf_propagate_like_sdpa() -> None:
    """NaN/inf in q, k, v are not refused nor turned into zeros: each sequence's rows match
    torch's SDPA (math backend) on the same sequence, NaN for NaN and inf for inf."""
    q_lens, k_lens = (3, 5, 4), (4, 6, 3)
    a = _args(q_lens=q_lens, k_lens=k_lens, hq=2, hkv=2, dim=32, dtype=FLOAT, device=DEV)
    q, k, v = a["q"].clone(), a["k"].clone(), a["v"].clone()
    q[1, 0, 3] = float("nan")  # one query row of sequence 0, head 0
    k[4 + 2, 1, 0] = float("inf")  # one key of sequence 1, head 1: every score of it is +-inf
    v[10 + 0, 0, 5] = float("-inf")  # one value of sequence 2, head 0: column 5 is -inf
    v[1, 1, 7] = float("nan")  # one value of sequence 0, head 1: column 7 is NaN
    out = jagged.jagged_attention(q, k, v, a["q_offsets"], a["kv_offsets"], backend=_kernel_backend())
    qo, ko = a["q_offsets"].tolist(), a["kv_offsets"].tolist()
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        want = torch.cat([
            torch.nn.functional.scaled_dot_product_attention(
                q[qo[b] : qo[b + 1]].transpose(0, 1).float(), k[ko[b] : ko[b + 1]].transpose(0, 1).float(),
                v[ko[b] : ko[b + 1]].transpose(0, 1).float(),
            ).transpose(0, 1)
            for b in range(len(q_lens))
        ])
    assert want.isnan().any()  # the case poses both
    assert want.isinf().any()
    torch.testing.assert_close(out.float(), want, equal_nan=True, atol=2e-3, rtol=2e-3)


def _expanded_k(a):
    return a["k"][:1].expand_as(a["k"])


@pytest.mark.parametrize(
    "strides", ["last-dim-not-contiguous", "expanded-overlapping", "packed-qkv-views"],
)
def test_odd_strides_give_the_contiguous_result(strides) -> None:
    """A last dim that is not contiguous and an input whose elements overlap (expand) are
    copied before the kernels; q, k, v sharing one buffer (packed QKV views) are read as they
    are. Each gives the result of the same values made contiguous."""
    a = _args(q_lens=(3, 4), k_lens=(3, 4), hq=2, hkv=2, dim=32, dtype=FLOAT, device=DEV)
    if strides == "last-dim-not-contiguous":
        a["q"] = a["q"].transpose(1, 2).contiguous().transpose(1, 2)
        assert a["q"].stride(-1) != 1
    elif strides == "expanded-overlapping":
        a["k"] = _expanded_k(a)
        assert torch._debug_has_internal_overlap(a["k"]) == 1
    else:
        qkv = torch.stack([a["q"], a["k"], a["v"]], dim=1)  # [T, 3, H, D]
        a["q"], a["k"], a["v"] = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    got = jagged.jagged_attention(**a, backend=_kernel_backend())
    want = jagged.jagged_attention(**{n: t.contiguous() for n, t in a.items()}, backend=_kernel_backend())
    torch.testing.assert_close(got, want)


# --- TRITON_INTERPRET changed after import -------------------------------------------------

_AFTER_IMPORT = textwrap.dedent(
    """
    import os, sys, torch
    from jagflash.core.capability import InterpreterChanged
    from jagflash.variants.jagged import jagged_attention
    import jagflash.variants.jagged.kernels_portable  # the kernels are built now
    os.environ["TRITON_INTERPRET"] = sys.argv[1]
    q = torch.randn(7, 2, 32); o = torch.tensor([0, 3, 7], dtype=torch.int32)
    try:
        jagged_attention(q, q, q, o, o)
    except InterpreterChanged as e:
        print("REFUSED", e)
    jagged_attention(q, q, q, o, o, backend="reference")
    print("REFERENCE OK")
    """
)


@pytest.mark.parametrize(("at_import", "later", "expected"), [("0", "1", "was set after"), ("1", "0", "was unset after")])
def test_interpret_changed_after_import_is_refused(at_import, later, expected) -> None:
    env = {**os.environ, "TRITON_INTERPRET": at_import, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        [sys.executable, "-c", _AFTER_IMPORT, later], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert "REFUSED" in run.stdout
    assert expected in run.stdout
    assert "REFERENCE OK" in run.stdout


def test_interpreter_changed_is_typed() -> None:
    assert issubclass(InterpreterChanged, RuntimeError)


# --- GPU: offsets checked on the device, no host sync --------------------------------------

_DEVICE_CHECK = textwrap.dedent(
    """
    import torch
    from jagflash.variants.jagged import jagged_attention
    q = torch.randn(7, 2, 64, device="cuda", dtype=torch.float16)
    good = torch.tensor([0, 3, 7], dtype=torch.int32, device="cuda")
    bad = torch.tensor([0, 5, 7], dtype=torch.int32, device="cuda")  # a length 5 > max_seqlen 4
    jagged_attention(q, q, q, good, good, max_seqlen_q=4, max_seqlen_kv=4)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync in the call raises
    jagged_attention(q, q, q, bad, good, max_seqlen_q=4, max_seqlen_kv=4)
    torch.cuda.set_sync_debug_mode("default")
    print("NO SYNC")
    torch.cuda.synchronize()  # the device-side check fails the stream here
    print("NOT REFUSED")
    """
)


@pytest.mark.gpu
def test_device_checks_do_not_sync_and_fail_the_stream() -> None:
    run = subprocess.run([sys.executable, "-c", _DEVICE_CHECK], capture_output=True, text=True, timeout=300)
    assert "NO SYNC" in run.stdout, run.stderr
    assert "NOT REFUSED" not in run.stdout
    assert run.returncode != 0
    # the assert's own text where the CUDA build keeps it, else CUDA's device-side assert
    assert "max_seqlen_q below a length" in run.stderr or "device-side assert" in run.stderr, run.stderr
