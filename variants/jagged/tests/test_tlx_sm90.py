"""The TLX (Hopper) forward kernel against the fp64 reference, both consumer versions.
Needs an sm_90 GPU and TLX."""

from __future__ import annotations

import pytest
import torch

from jagflash.core.jagged import mask_bounds
from jagflash.testing import JaggedCase, check_against_reference, jagged_reference
from jagflash.variants.jagged import SPEC

pytestmark = pytest.mark.sm90


def _forward(causal: bool, pipeline: bool):
    from jagflash.core import tlx_attention

    left, right = mask_bounds(causal)

    def run(q, k, v, q_offsets, kv_offsets):
        max_q = int((q_offsets[1:] - q_offsets[:-1]).max()) if q_offsets.numel() > 1 else 0
        return tlx_attention.forward(
            q, k, v, q_offsets, kv_offsets, max_q, left=left, right=right,
            scale=q.shape[-1] ** -0.5, pipeline=pipeline,
        )

    return run


def _reference(causal: bool):
    def run(q, k, v, q_offsets, kv_offsets, dtype):
        return jagged_reference(q, k, v, q_offsets, kv_offsets, causal=causal, dtype=dtype)

    return run


def _lognormal(n: int, seed: int, cap: int = 1500) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.clamp(torch.exp(torch.randn(n, generator=gen) + 5.0), 1, cap).long().tolist())


CASES = {
    "odd_lengths": ((0, 1, 37, 128, 129, 300, 0, 64), None, 8, 2),
    "cross_lq_lt_lk": ((5, 40, 200), (40, 70, 450), 4, 4),
    "cross_lq_gt_lk": ((70, 300), (40, 9), 4, 1),  # rows that see no key
    "lognormal": (_lognormal(24, 0), None, 8, 2),
}


@pytest.mark.parametrize("pipeline", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", CASES)
def test_tlx_forward_matches_reference(name, causal, head_dim, dtype, pipeline) -> None:
    q_lens, k_lens, hq, hkv = CASES[name]
    case = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=head_dim, dtype=dtype, causal=causal)
    t = case.build("cuda", requires_grad=False)
    t.pop("dout")
    check_against_reference(_forward(causal, pipeline), _reference(causal), t, atol=SPEC.atol[dtype])
