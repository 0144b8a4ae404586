"""block_sparse_attention inside a block under torch.compile(fullgraph=True, dynamic=True): one
graph for batches of new lengths and batch sizes (each with its own BlockMask, built outside the
compiled step), forward and backward. Inductor on the GPU; aot_eager under the interpreter on the
CPU."""

from __future__ import annotations

import pytest
import torch

from jagflash.testing import make_jagged
from jagflash.testing.integration import AttentionBlock, assert_compiles_once
from jagflash.variants.block_sparse import block_sparse_attention, local_global

# In the first batch the batch size, offsets length, q-blocks and kv-blocks differ (3, 4, 11, 16 at
# 64; 3, 4, 6, 8 at 128): dynamo's duck sizing ties sizes that happen to be equal in the first batch
# (a later batch without the equality would recompile).
BATCHES = [((9, 700, 4), (12, 1000, 4)), ((5, 70, 22, 3), (5, 150, 22, 9)), ((140, 2), (400, 6))]


def _attend(q, k, v, qo, ko, mask):
    return block_sparse_attention(q, k, v, qo, ko, mask, causal=True)


def _run(device: str, dtype: torch.dtype, head_dim: int, block: int, backend: str, **tol) -> None:
    torch.manual_seed(0)
    dim = 2 * head_dim
    attn = AttentionBlock(_attend, dim, 2, head_dim, device=device, dtype=dtype)
    batches = []
    for q_lens, k_lens in BATCHES:
        t = make_jagged(q_lens, k_lens, 1, 1, dim, dtype, device)
        x, x_kv = t["q"][:, 0].detach().requires_grad_(), t["k"][:, 0].detach().requires_grad_()
        mask = local_global(t["q_offsets"], t["kv_offsets"], before=0, sinks=1, block_size=(block, block))
        batches.append((x, x_kv, t["q_offsets"], t["kv_offsets"], mask))

    def step(x, x_kv, qo, ko, mask):
        return attn(x, x_kv, qo, ko, mask).float().square().mean()

    assert_compiles_once(step, batches, list(attn.parameters()), backend=backend, **tol)


@pytest.mark.interpret
def test_one_graph_for_new_lengths_cpu() -> None:
    _run("cpu", torch.float32, 16, 64, "aot_eager")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_inductor_one_graph_for_new_lengths_gpu(head_dim: int) -> None:
    _run("cuda", torch.bfloat16, head_dim, 128, "inductor", atol=2e-2, rtol=2e-2)
