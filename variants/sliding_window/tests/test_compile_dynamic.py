"""sliding_window_attention inside a block under torch.compile(fullgraph=True, dynamic=True): one
graph for batches of new lengths, batch sizes and max_seqlen ints, forward and backward. Inductor
on the GPU; aot_eager under the interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from jagflash.testing import make_jagged
from jagflash.testing.integration import AttentionBlock, assert_compiles_once
from jagflash.variants.sliding_window import sliding_window_attention

BATCHES = [((9, 30, 4), (12, 30, 4)), ((5, 17, 22, 3), (5, 20, 22, 9)), ((13, 2), (13, 6))]


def _attend(q, k, v, qo, ko, mq, mk):
    return sliding_window_attention(q, k, v, qo, ko, window=(7, 0), max_seqlen_q=mq, max_seqlen_kv=mk)


def _run(device: str, dtype: torch.dtype, head_dim: int, backend: str, **tol) -> None:
    torch.manual_seed(0)
    dim = 2 * head_dim
    block = AttentionBlock(_attend, dim, 2, head_dim, device=device, dtype=dtype)
    batches = []
    for q_lens, k_lens in BATCHES:
        t = make_jagged(q_lens, k_lens, 1, 1, dim, dtype, device)
        x, x_kv = t["q"][:, 0].detach().requires_grad_(), t["k"][:, 0].detach().requires_grad_()
        batches.append((x, x_kv, t["q_offsets"], t["kv_offsets"], max(q_lens), max(k_lens)))

    def step(x, x_kv, qo, ko, mq, mk):
        return block(x, x_kv, qo, ko, mq, mk).float().square().mean()

    assert_compiles_once(step, batches, list(block.parameters()), backend=backend, **tol)


@pytest.mark.interpret
def test_one_graph_for_new_lengths_cpu() -> None:
    _run("cpu", torch.float32, 16, "aot_eager")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_inductor_one_graph_for_new_lengths_gpu(head_dim: int) -> None:
    _run("cuda", torch.bfloat16, head_dim, "inductor", atol=2e-2, rtol=2e-2)
