"""jagged_attention_backward: the backward at a given out/LSE, the piece context parallelism
runs on (VARIANT.backward). Keys split in two calls, each call's backward at the merged
output and LSE, summed, equals the gradients of attention over all keys."""

from __future__ import annotations

import pytest
import torch

from jagflash.core.capability import InvalidInput
from jagflash.core.ops import make_problem
from jagflash.core.softmax import merge_partials
from jagflash.testing import assert_close_all, jagged_reference, make_jagged
from jagflash.testing.plugin import require
from jagflash.variants.jagged import SPEC, VARIANT, jagged_attention, jagged_attention_backward


@pytest.mark.parametrize("backend", ["interpreter", "reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_at_merged_output_equals_the_whole_attention(backend: str, causal: bool) -> None:
    if backend == "interpreter":
        from jagflash.core.backend import interpreter_reasons

        if interpreter_reasons():
            pytest.skip("; ".join(interpreter_reasons()))
    _check_split("cpu", torch.float32, 16, backend, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["tlx-sm90", "portable"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_backward_at_merged_output(backend: str, causal: bool) -> None:
    """The GPU kernels' backward at a merged out/LSE (bf16, D 128, GQA 2:1), as the ring runs it."""
    q = torch.empty(1, 2, 128, dtype=torch.bfloat16, device="cuda")
    require(SPEC, make_problem("jagged", q, q[:, :1], causal=causal, return_lse=True, backward=True), backend)
    _check_split("cuda", torch.bfloat16, 128, backend, causal)


def _check_split(device: str, dtype: torch.dtype, head_dim: int, backend: str, causal: bool) -> None:
    t = make_jagged([5, 0, 9, 1], [6, 3, 0, 4], hq=2, hkv=1, head_dim=head_dim, dtype=dtype, device=device, seed=4)
    q, k, v, dout = (t[n].detach() for n in ("q", "k", "v", "dout"))
    qo, ko = t["q_offsets"], t["kv_offsets"]
    # keys of each sequence split into a front [0, cut) and a back: the back keeps the causal
    # mask (bottom-right over the back is bottom-right over the sequence), the front runs
    # without one, which is the causal mask's answer where every query sees the whole front
    lk = (ko[1:] - ko[:-1]).tolist()
    cut = [min(2, n) for n in lk]
    kol = ko.tolist()
    idx_a = torch.cat([torch.arange(kol[b], kol[b] + cut[b]) for b in range(len(lk))]).to(device)
    idx_b = torch.cat([torch.arange(kol[b] + cut[b], kol[b + 1]) for b in range(len(lk))]).to(device)
    off_a = torch.tensor([0, *torch.tensor(cut).cumsum(0).tolist()], dtype=torch.int32, device=device)
    off_b = (ko - off_a).to(torch.int32)
    lq = (qo[1:] - qo[:-1]).tolist()
    if causal:  # query 0 sees key cut - 1: Lq <= Lk - cut + 1
        assert all(nq <= nk - c + 1 or nq == 0 or nk == 0 for nq, nk, c in zip(lq, lk, cut))
    parts = []
    for idx, off, masked in ((idx_a, off_a, False), (idx_b, off_b, causal)):
        o, lse = jagged_attention(q, k[idx], v[idx], qo, off, causal=masked, return_lse=True, backend=backend)
        parts.append((idx, off, masked, o, lse))
    out, lse = merge_partials(parts[0][3], parts[0][4], parts[1][3], parts[1][4])
    out = out.to(q.dtype)
    dq, dk, dv = (torch.zeros_like(x, dtype=torch.float32) for x in (q, k, v))  # as the ring sums
    for idx, off, masked, _, _ in parts:
        gq, gk, gv = VARIANT.backward(dout, q, k[idx], v[idx], out, lse, qo, off, causal=masked, backend=backend)
        dq += gq
        dk[idx] += gk
        dv[idx] += gv
    refs = []
    for rdtype in (torch.float64, dtype):
        leaves = [x.to(rdtype).requires_grad_() for x in (q, k, v)]
        ro, rl = jagged_reference(*leaves, qo, ko, causal=causal, dtype=rdtype)
        refs.append([ro.detach(), rl.detach(), *torch.autograd.grad(ro, leaves, dout.to(rdtype))])
    assert_close_all(["out", "lse", "dq", "dk", "dv"], [out, lse, dq, dk, dv], *refs, SPEC.atol[dtype])


def test_backward_at_refuses_mismatched_out_and_lse() -> None:
    t = make_jagged([3], [3], hq=2, hkv=2, head_dim=16, dtype=torch.float32, device="cpu")
    q, k, v = t["q"].detach(), t["k"].detach(), t["v"].detach()
    with pytest.raises(InvalidInput) as err:
        jagged_attention_backward(q[:2], q, k, v, q, torch.zeros(3, 2), t["q_offsets"], t["kv_offsets"])
    assert err.value.reasons == [
        "dout must be shaped like q (3, 2, 16), got torch.Size([2, 2, 16])",
        "lse must be fp32 [Hq, Tq] = [2, 3], got torch.float32 torch.Size([3, 2])",
    ]
