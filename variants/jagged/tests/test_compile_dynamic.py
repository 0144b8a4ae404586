"""jagged_attention inside a block under torch.compile(fullgraph=True, dynamic=True): one graph
for batches of new lengths, batch sizes and max_seqlen ints, forward and backward. Inductor on
the GPU; aot_eager under the interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from jagflash.testing.integration import assert_jagged_block_compiles_once
from jagflash.variants.jagged import jagged_attention

BATCHES = [((9, 30, 4), (12, 30, 4)), ((5, 17, 22, 3), (5, 20, 22, 9)), ((13, 2), (13, 6))]


def _attend(q, k, v, qo, ko, mq, mk):
    return jagged_attention(q, k, v, qo, ko, causal=True, max_seqlen_q=mq, max_seqlen_kv=mk)


def _lengths(q_lens, k_lens, t):
    return max(q_lens), max(k_lens)


def _run(device: str, dtype: torch.dtype, head_dim: int, backend: str, **tol) -> None:
    assert_jagged_block_compiles_once(_attend, BATCHES, _lengths, device=device, dtype=dtype, head_dim=head_dim, backend=backend, **tol)


@pytest.mark.interpret
def test_one_graph_for_new_lengths_cpu() -> None:
    _run("cpu", torch.float32, 16, "aot_eager")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_inductor_one_graph_for_new_lengths_gpu(head_dim: int) -> None:
    _run("cuda", torch.bfloat16, head_dim, "inductor", atol=2e-2, rtol=2e-2)
