"""dense_attention inside a block under torch.compile(fullgraph=True, dynamic=True, inductor) on
the GPU: one graph for batches of new sizes and lengths, forward and backward."""

from __future__ import annotations

import pytest
import torch

from jagflash.testing.integration import AttentionBlock, assert_compiles_once
from jagflash.variants.dense import dense_attention

pytestmark = pytest.mark.gpu


def _attend(q, k, v):
    return dense_attention(q, k, v, causal=True)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_inductor_one_graph_for_new_shapes_gpu(head_dim: int) -> None:
    torch.manual_seed(0)
    dim = 2 * head_dim
    block = AttentionBlock(_attend, dim, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    batches = [
        (torch.randn(b, n, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True), None)
        for b, n in ((2, 200), (3, 77), (5, 300))
    ]

    def step(x, x_kv):
        return block(x, x_kv).float().square().mean()

    assert_compiles_once(step, batches, list(block.parameters()), atol=2e-2, rtol=2e-2)
