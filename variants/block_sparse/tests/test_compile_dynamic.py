"""block_sparse_attention inside a block under torch.compile(fullgraph=True, dynamic=True): one
graph for batches of new lengths and batch sizes (each with its own BlockMask, built outside the
compiled step), forward and backward. Inductor on the GPU; aot_eager under the interpreter on the
CPU."""

from __future__ import annotations

import pytest
import torch

from jagflash.testing.integration import assert_jagged_block_compiles_once
from jagflash.variants.block_sparse import block_sparse_attention, local_global

# The first batch's sizes set dynamo's guards: its batch size, offsets length, q-blocks and
# kv-blocks differ (3, 4, 11, 16 at 64-blocks; 3, 4, 6, 8 at 128), or duck sizing would tie them,
# and every later batch has at least 2 of each (a size of 1 is specialised): 4, 5, 3, 4 / 2, 2 and
# 2, 3, 3, 7 / 2, 4.
BATCHES = [((9, 700, 4), (12, 1000, 4)), ((5, 170, 22, 3), (5, 250, 22, 9)), ((140, 2), (400, 6))]


def _attend(q, k, v, qo, ko, mask):
    return block_sparse_attention(q, k, v, qo, ko, mask, causal=True)


@pytest.mark.parametrize(
    ("device", "dtype", "head_dim", "block", "backend", "tol"),
    [
        pytest.param("cpu", torch.float32, 16, 64, "aot_eager", {}, marks=pytest.mark.interpret, id="cpu-aot_eager"),
        *(
            pytest.param("cuda", torch.bfloat16, d, 128, "inductor", {"atol": 2e-2, "rtol": 2e-2}, marks=pytest.mark.gpu, id=f"gpu-inductor-d{d}")
            for d in (64, 128)
        ),
    ],
)
def test_one_graph_for_new_lengths(device, dtype, head_dim, block, backend, tol) -> None:
    def mask(q_lens, k_lens, t):
        return (local_global(t["q_offsets"], t["kv_offsets"], before=0, sinks=1, block_size=(block, block)),)

    assert_jagged_block_compiles_once(_attend, BATCHES, mask, device=device, dtype=dtype, head_dim=head_dim, backend=backend, **tol)
