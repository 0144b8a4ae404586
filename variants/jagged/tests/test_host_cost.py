"""The shortcuts a small jagged call takes on the host (issue 20) give the results and the
refusals of the long way: a forward autograd would not record runs the op body without the
autograd.Function; self-attention's offsets are checked once for both sides."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwad

from jagflash.core.capability import InvalidInput
from jagflash.testing import make_jagged
from jagflash.variants.jagged import jagged_attention, make_plan

ON_GPU = torch.cuda.is_available()
pytestmark = pytest.mark.gpu if ON_GPU else pytest.mark.interpret
FLOAT = torch.bfloat16 if ON_GPU else torch.float32


def _batch(device: str, requires_grad: bool = True):
    return make_jagged((9, 30, 0, 1), (12, 30, 5, 1), 4, 2, 32, FLOAT, device, requires_grad=requires_grad)


@pytest.mark.parametrize("with_plan", [False, True], ids=["own-plan", "plan="])
def test_a_forward_autograd_would_not_record_equals_the_recorded_one(device: str, with_plan: bool) -> None:
    """no_grad, and inputs that require no grad: the op body alone (no graph node), bit for bit
    the forward of a call that records its graph, LSE included."""
    t = _batch(device)
    args = [t[n] for n in ("q", "k", "v", "q_offsets", "kv_offsets")]
    kw = {"causal": True, "return_lse": True}
    if with_plan:
        kw["plan"] = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], causal=True)
    recorded, lse = jagged_attention(*args, **kw)
    assert recorded.grad_fn is not None
    with torch.no_grad():
        out, lse_nograd = jagged_attention(*args, **kw)
    plain = [a.detach() for a in args[:3]] + args[3:]
    out_plain, lse_plain = jagged_attention(*plain, **kw)
    for got, lse_got in ((out, lse_nograd), (out_plain, lse_plain)):
        assert got.grad_fn is None
        assert not got.requires_grad
        assert torch.equal(got, recorded.detach())
        assert torch.equal(lse_got, lse)


def test_forward_mode_ad_is_refused_as_before(device: str) -> None:
    """A dual input under an open forward-AD level still reaches the autograd.Function, which
    refuses it (no jvp), with or without grad mode: the shortcut never drops a tangent."""
    t = _batch(device, requires_grad=False)
    q, k, v, qo, ko = (t[n] for n in ("q", "k", "v", "q_offsets", "kv_offsets"))
    with fwad.dual_level():
        dual = fwad.make_dual(q, torch.randn_like(q))
        with pytest.raises(NotImplementedError, match="jvp"):
            jagged_attention(dual, k, v, qo, ko)
        with torch.no_grad(), pytest.raises(NotImplementedError, match="jvp"):
            jagged_attention(dual, k, v, qo, ko)


def test_one_offsets_tensor_for_both_sides_is_refused_on_both(device: str) -> None:
    """Self-attention passes one offsets tensor twice: it is checked once where that answers
    both questions, and every reason of both sides is listed where it is invalid."""
    t = _batch(device, requires_grad=False)
    q = t["q"]
    offs = torch.tensor([0, 9, 39, 39, 40], dtype=torch.int32, device=device)  # ends at 40, q has 40 rows
    bad_end = torch.tensor([0, 9, 39, 39, 41], dtype=torch.int32, device=device)
    with torch.no_grad():
        out = jagged_attention(q, q, q, offs, offs, max_seqlen_q=30, max_seqlen_kv=30)
        assert torch.equal(out, jagged_attention(q, q, q, offs, offs.clone()))
        with pytest.raises(InvalidInput) as e:
            jagged_attention(q, q, q, bad_end, bad_end)
        assert "q_offsets[-1]" in str(e.value)
        assert "kv_offsets[-1]" in str(e.value)
        with pytest.raises(InvalidInput, match="max_seqlen_kv=29 is below the longest sequence"):
            jagged_attention(q, q, q, offs, offs, max_seqlen_q=30, max_seqlen_kv=29)
        with pytest.raises(InvalidInput, match="max_seqlen_q=29 is below the longest sequence"):
            jagged_attention(q, q, q, offs, offs, max_seqlen_q=29, max_seqlen_kv=30)
