"""dense_attention on the TLX (Hopper) kernels, forward and backward, against the fp64
reference: the default backend on an sm_90 GPU with TLX. Needs that GPU."""

from __future__ import annotations

import pytest
import torch

from jagflash.core.backend import last_choice
from jagflash.testing import check_against_reference, dense_reference, make_dense
from jagflash.variants.dense import SPEC, dense_attention

pytestmark = pytest.mark.sm90


@pytest.mark.parametrize(("nq", "nk", "hq", "hkv", "head_dim", "causal"), [(300, 300, 4, 4, 128, True), (200, 333, 8, 2, 64, False), (333, 200, 4, 1, 128, True)])
def test_dense_tlx_forward_and_backward(nq, nk, hq, hkv, head_dim, causal) -> None:
    t = make_dense(2, nq, nk, hq, hkv, head_dim, torch.float16, "cuda", seed=nq + nk)
    dout = t.pop("dout")

    def kernel(q, k, v):
        return dense_attention(q, k, v, causal=causal, return_lse=True)

    def reference(q, k, v, dtype):
        return dense_reference(q, k, v, causal=causal, dtype=dtype)

    check_against_reference(kernel, reference, t, atol=SPEC.atol[torch.float16], dout=dout)
    # The backward (the last call) runs on TLX at D 64 and 128 (D 64 since session 8).
    assert last_choice("dense").name == "tlx-sm90"
