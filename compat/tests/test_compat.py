"""jagflash.compat on the CPU: the drop-ins against the fp64 reference (forward, backward, LSE),
FlashAttention's window and LSE conventions, the signatures against torch's, and the refusals."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from jagflash.compat import flash_attn_varlen_func, varlen_attn
from jagflash.compat._call import fa_mask
from jagflash.core.capability import InvalidInput, UnsupportedProblem
from jagflash.testing import JaggedCase, check_against_reference, jagged_reference

pytestmark = pytest.mark.interpret

# Lq != Lk per sequence, a zero-length and a 1-token sequence, GQA; no row without a key (see
# test_empty_rows_lse_is_plus_inf for those).
CASE = JaggedCase(q_lens=(5, 0, 1, 19), k_lens=(9, 3, 4, 19), hq=4, hkv=2, head_dim=16)


def _fa(causal: bool):
    def kernel(q, k, v, q_offsets, kv_offsets):
        lq = (q_offsets[1:] - q_offsets[:-1]).max().item()
        lk = (kv_offsets[1:] - kv_offsets[:-1]).max().item()
        return flash_attn_varlen_func(q, k, v, q_offsets, kv_offsets, lq, lk, causal=causal, return_lse=True)

    return kernel


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_varlen_func_matches_reference(device: str, causal: bool) -> None:
    t = CASE.build(device)
    dout = t.pop("dout")

    def reference(**kw):
        return jagged_reference(**kw, causal=causal)

    check_against_reference(_fa(causal), reference, t, atol=1e-5, dout=dout)


def test_varlen_attn_matches_reference(device: str) -> None:
    from torch.nn.attention.varlen import AuxRequest

    t = CASE.build(device)
    dout = t.pop("dout")

    def kernel(q, k, v, q_offsets, kv_offsets):
        out, lse = varlen_attn(
            q, k, v, q_offsets, kv_offsets, 19, 19, return_aux=AuxRequest(lse=True),
            window_size=(-1, 0), enable_gqa=True, scale=0.3,
        )
        assert lse.shape == (q.shape[1], q.shape[0])  # torch's [H_q, T_q]
        return out, lse

    def reference(**kw):
        return jagged_reference(**kw, causal=True, scale=0.3)

    check_against_reference(kernel, reference, t, atol=1e-5, dout=dout)


def test_empty_rows_lse_is_plus_inf(device: str) -> None:
    """Lq > Lk causal: the first Lq - Lk queries see no key: out 0, LSE +inf (FlashAttention's
    convention, where jagflash's own functions give -inf)."""
    t = JaggedCase(q_lens=(6,), k_lens=(2,), head_dim=16).build(device, requires_grad=False)
    out, lse = flash_attn_varlen_func(
        t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], 6, 2, causal=True, return_lse=True
    )
    assert lse.shape == (2, 6)
    assert torch.all(lse[:, :4] == math.inf)
    assert torch.isfinite(lse[:, 4:]).all()
    assert torch.all(out[:4] == 0)


@pytest.mark.parametrize(
    ("causal", "window", "max_k", "expected"),
    [
        (False, (-1, -1), 8, (False, (-1, -1))),
        (False, (-1, 0), 8, (True, (-1, -1))),
        (True, (-1, -1), 8, (True, (-1, -1))),
        (True, (3, 5), 8, (True, (3, 0))),          # causal clips the right side to 0
        (False, (8, 0), 8, (True, (-1, -1))),       # left >= max_seqlen_k: unbounded
        (False, (-7, 9), 8, (False, (-1, -1))),     # negatives are unbounded, 9 >= 8 too
        (False, (2, 1), 8, (False, (2, 1))),
    ],
)
def test_fa_window_normalisation(causal, window, max_k, expected) -> None:
    assert fa_mask("t", causal, window, max_k) == expected


def test_window_reduced_to_causal_runs_as_causal(device: str) -> None:
    t = JaggedCase(q_lens=(7, 3), k_lens=(7, 5), head_dim=16).build(device, requires_grad=False)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], 7, 7)
    want = flash_attn_varlen_func(*args, causal=True)
    for window in ((-1, 0), (7, 0), (100, 0)):
        torch.testing.assert_close(flash_attn_varlen_func(*args, window_size=window), want, rtol=0, atol=0)


def test_sliding_window_goes_to_the_front_door(device: str) -> None:
    """A real window reaches the variants as ``window=``; a variant without the feature refuses
    it with its reason (the sliding-window variant, once installed, takes it)."""
    t = JaggedCase(q_lens=(7,), k_lens=(7,), head_dim=16).build(device, requires_grad=False)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], 7, 7)
    out, reasons = None, []
    try:
        out = flash_attn_varlen_func(*args, window_size=(2, 0))
    except UnsupportedProblem as e:
        reasons = e.reasons
    if out is None:
        assert any("window" in r for r in reasons), reasons
    else:
        want, _ = jagged_reference(*(x.double() if x.is_floating_point() else x for x in args[:5]), window=(2, 0))
        torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0)


def test_flash_attn_refusals_list_every_reason() -> None:
    q = torch.zeros(4, 2, 16)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(UnsupportedProblem) as e:
        flash_attn_varlen_func(
            q, q, q, cu, cu, 4, 4, dropout_p=0.1, softcap=30.0, alibi_slopes=torch.zeros(2),
            return_attn_probs=True, block_table=torch.zeros(1, 1, dtype=torch.int32),
        )
    text = " ".join(e.value.reasons)
    assert len(e.value.reasons) == 5
    for word in ("dropout_p", "softcap", "alibi_slopes", "return_attn_probs", "block_table"):
        assert word in text
    with pytest.raises(UnsupportedProblem, match="dropout_p"):
        flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, dropout_p=0.5)


def test_varlen_attn_refusals_list_every_reason() -> None:
    q = torch.zeros(4, 2, 16)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(UnsupportedProblem) as e:
        varlen_attn(q, q, q, cu, cu, 4, 4, seqused_k=torch.tensor([4]), block_table=torch.zeros(1, 1, dtype=torch.int32), num_splits=4)
    assert len(e.value.reasons) == 3
    with pytest.raises(InvalidInput) as e:
        varlen_attn(q, q[:, :1], q[:, :1], cu, None, 4, 4)
    assert len(e.value.reasons) == 2  # no cu_seq_k, GQA without enable_gqa
    with pytest.raises(InvalidInput, match="window_size"):
        varlen_attn(q, q, q, cu, cu, 4, 4, window_size=(1,))


def _params(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_varlen_attn_signature_is_torchs() -> None:
    from torch.nn.attention import varlen

    assert _params(varlen_attn) == _params(varlen.varlen_attn)


def test_flash_attn_signature_is_fa2s() -> None:
    """FlashAttention 2.8's positional parameters, in order, with its defaults; jagflash's
    additions are keyword-only. Against flash_attn itself where it is importable (GPU tests)."""
    fa2 = [
        ("q", None), ("k", None), ("v", None), ("cu_seqlens_q", None), ("cu_seqlens_k", None),
        ("max_seqlen_q", None), ("max_seqlen_k", None), ("dropout_p", 0.0), ("softmax_scale", None),
        ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
        ("deterministic", False), ("return_attn_probs", False), ("block_table", None),
    ]
    params = inspect.signature(flash_attn_varlen_func).parameters.values()
    positional = [(p.name, None if p.default is inspect.Parameter.empty else p.default)
                  for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == fa2
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params if p.name not in dict(fa2))


def test_under_torch_compile_fullgraph(device: str) -> None:
    """After one eager call (which looks the variants up), the drop-in traces whole under
    torch.compile(fullgraph=True) and gives eager's loss and gradients."""
    from jagflash.testing.integration import assert_compiled_matches_eager

    t = JaggedCase(q_lens=(9, 30), k_lens=(12, 30), head_dim=16).build(device)

    def step(q, k, v, qo, ko):
        return flash_attn_varlen_func(q, k, v, qo, ko, 30, 30, causal=True).square().sum()

    step(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    assert_compiled_matches_eager(step, (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"]))
