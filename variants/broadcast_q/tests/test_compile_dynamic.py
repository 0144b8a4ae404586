"""broadcast_q_attention inside a block under torch.compile(fullgraph=True, dynamic=True,
inductor) on the GPU: one graph for batches of new K/V lengths, batch sizes, query counts and
max_seqlen_kv ints, forward and backward."""

from __future__ import annotations

import pytest
import torch

from jagflash.core.jagged import offsets_from_lengths
from jagflash.testing.integration import AttentionBlock, assert_compiles_once
from jagflash.variants.broadcast_q import broadcast_q_attention

pytestmark = pytest.mark.gpu


def _attend(q, k, v, ko, mk):
    return broadcast_q_attention(q, k, v, ko, max_seqlen_kv=mk)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_inductor_one_graph_for_new_lengths_gpu(head_dim: int) -> None:
    torch.manual_seed(0)
    dim = 2 * head_dim
    block = AttentionBlock(_attend, dim, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    batches = []
    for lq, k_lens in ((64, (30, 200, 7)), (17, (5, 90, 0, 33)), (128, (300, 12))):
        x = torch.randn(lq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        x_kv = torch.randn(sum(k_lens), dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        batches.append((x, x_kv, offsets_from_lengths(k_lens, "cuda", torch.int32), max(k_lens)))

    def step(x, x_kv, ko, mk):
        return block(x, x_kv, ko, mk).float().square().mean()

    assert_compiles_once(step, batches, list(block.parameters()), atol=2e-2, rtol=2e-2)
