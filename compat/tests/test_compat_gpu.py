"""jagflash.compat on the GPU against the originals: the same calls through torch's
``varlen_attn`` (FlashAttention 2) and, where importable, ``flash_attn.flash_attn_varlen_func``;
jagflash passes when its error against the fp64 reference is at most twice the peer's plus the
variant's atol (the tolerance rule, with the peer as the low-precision baseline)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from jagflash.compat import flash_attn_varlen_func, varlen_attn
from jagflash.core.tolerance import assert_close_all
from jagflash.testing import jagged_reference, make_jagged
from jagflash.variants.jagged import SPEC

pytestmark = pytest.mark.gpu

# Lq <= Lk per sequence (no row without a key: test_rows_without_keys has those), a zero-length
# and a 1-token sequence, one long sequence among short ones, lengths off the tile multiples.
Q_LENS = (1, 0, 77, 300, 5, 1024)
K_LENS = (1, 3, 77, 333, 64, 1024)


def _peer():
    try:
        from torch.nn.attention.varlen import varlen_attn as torch_varlen
    except ImportError as e:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen ({e})")
    return torch_varlen


def _torch_kwargs(fn, *, causal: bool, gqa: bool, lse: bool) -> dict:
    """Keywords of this torch's ``varlen_attn`` for the call (2.10 spelled causal ``is_causal``)."""
    params = inspect.signature(fn).parameters
    kw = {}
    if "window_size" in params:
        kw["window_size"] = (-1, 0) if causal else (-1, -1)
    elif causal:
        kw["is_causal"] = True
    if gqa:
        if "enable_gqa" not in params:
            pytest.skip("this torch's varlen_attn has no enable_gqa")
        kw["enable_gqa"] = True
    if lse:
        from torch.nn.attention.varlen import AuxRequest

        kw["return_aux"] = AuxRequest(lse=True)
    return kw


def _inputs(dtype, head_dim, hq, hkv, q_lens=Q_LENS, k_lens=K_LENS):
    t = make_jagged(q_lens, k_lens, hq, hkv, head_dim, dtype, "cuda")
    return t, max(q_lens), max(k_lens)


def _grads(out, t):
    return list(torch.autograd.grad(out, (t["q"], t["k"], t["v"]), t["dout"]))


def _reference(t, causal):
    leaves = [t[n].detach().double().requires_grad_() for n in ("q", "k", "v")]
    out, lse = jagged_reference(*leaves, t["q_offsets"], t["kv_offsets"], causal=causal)
    return [out, *torch.autograd.grad(out, leaves, t["dout"].double())], lse


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (8, 2)])
def test_varlen_attn_against_torch(dtype, head_dim, causal, hq, hkv) -> None:
    torch_varlen = _peer()
    t, mq, mk = _inputs(dtype, head_dim, hq, hkv)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], mq, mk)
    kw = _torch_kwargs(torch_varlen, causal=causal, gqa=hq != hkv, lse="return_aux" in inspect.signature(torch_varlen).parameters)
    theirs = torch_varlen(*args, **kw)
    ours = varlen_attn(
        *args, window_size=(-1, 0) if causal else (-1, -1), enable_gqa=hq != hkv,
        return_aux=_aux() if "return_aux" in kw else None,
    )
    if "return_aux" in kw:
        (theirs, t_lse), (ours, o_lse) = theirs, ours
        assert o_lse.shape == t_lse.shape, (o_lse.shape, t_lse.shape)
        torch.testing.assert_close(o_lse.float(), t_lse.float(), atol=2e-2, rtol=0)
    ref, _ = _reference(t, causal)
    names = ["out", "dq", "dk", "dv"]
    assert_close_all(names, [ours, *_grads(ours, t)], ref, [theirs, *_grads(theirs, t)], SPEC.atol[dtype])


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_varlen_func_against_torch(causal) -> None:
    """flash_attn_varlen_func's FA2 conventions against torch's FA2 kernel: out, grads, and
    softmax_lse [nheads, total_q] (torch's LSE, the same kernel's)."""
    torch_varlen = _peer()
    t, mq, mk = _inputs(torch.bfloat16, 128, 8, 2)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], mq, mk)
    has_lse = "return_aux" in inspect.signature(torch_varlen).parameters
    theirs = torch_varlen(*args, **_torch_kwargs(torch_varlen, causal=causal, gqa=True, lse=has_lse))
    ours, lse = flash_attn_varlen_func(*args, causal=causal, return_lse=True)
    assert lse.shape == (8, t["q"].shape[0])
    if has_lse:
        theirs, t_lse = theirs
        torch.testing.assert_close(lse, t_lse.float(), atol=2e-2, rtol=0)
    ref, _ = _reference(t, causal)
    assert_close_all(["out", "dq", "dk", "dv"], [ours, *_grads(ours, t)], ref, [theirs, *_grads(theirs, t)], SPEC.atol[torch.bfloat16])


def test_rows_without_keys_match_torch() -> None:
    """Lq > Lk, causal: the first Lq - Lk queries of a sequence see no key. Output 0 in both;
    LSE +inf in jagflash.compat (FlashAttention 2's convention), compared with torch's."""
    torch_varlen = _peer()
    t, mq, mk = _inputs(torch.bfloat16, 64, 4, 4, q_lens=(40, 3, 200), k_lens=(10, 3, 64))
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], mq, mk)
    has_lse = "return_aux" in inspect.signature(torch_varlen).parameters
    theirs = torch_varlen(*args, **_torch_kwargs(torch_varlen, causal=True, gqa=False, lse=has_lse))
    ours, o_lse = varlen_attn(*args, window_size=(-1, 0), return_aux=_aux())
    if has_lse:
        theirs, t_lse = theirs
        finite = torch.isfinite(t_lse)
        torch.testing.assert_close(o_lse[finite], t_lse[finite].float(), atol=2e-2, rtol=0)
        assert torch.equal(torch.isinf(o_lse), ~finite), "rows without keys differ from torch's"
        assert torch.equal(o_lse[~finite], t_lse[~finite].float()), "LSE of rows without keys differs from torch's"
    empty = torch.isinf(o_lse).all(dim=0)  # [H_q, T_q]: a query row without keys
    assert empty.any()
    assert torch.all(ours[empty] == 0)
    torch.testing.assert_close(ours[~empty].float(), theirs[~empty].float(), atol=2e-2, rtol=0)
    assert o_lse[:, empty].eq(math.inf).all()


def _aux():
    from torch.nn.attention.varlen import AuxRequest

    return AuxRequest(lse=True)


def test_against_flash_attn_itself() -> None:
    """Where flash_attn (FlashAttention 2) is importable: its positional parameters are ours,
    and the same call gives the same out and gradients by the tolerance rule."""
    fa = pytest.importorskip("flash_attn", reason="flash_attn is not installed here")
    theirs_fn = fa.flash_attn_varlen_func
    ours_params = [p for p in inspect.signature(flash_attn_varlen_func).parameters.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    theirs_params = list(inspect.signature(theirs_fn).parameters.values())
    assert [(p.name, p.default) for p in ours_params] == [(p.name, p.default) for p in theirs_params]
    t, mq, mk = _inputs(torch.bfloat16, 128, 8, 2)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], mq, mk)
    theirs = theirs_fn(*args, causal=True)
    ours = flash_attn_varlen_func(*args, causal=True)
    ref, _ = _reference(t, True)
    assert_close_all(["out", "dq", "dk", "dv"], [ours, *_grads(ours, t)], ref, [theirs, *_grads(theirs, t)], SPEC.atol[torch.bfloat16])
