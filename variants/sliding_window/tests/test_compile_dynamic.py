"""sliding_window_attention inside a block under torch.compile(fullgraph=True, dynamic=True): one
graph for batches of new lengths, batch sizes and max_seqlen ints, forward and backward. Inductor
on the GPU; aot_eager under the interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from jagflash.testing.integration import assert_jagged_block_compiles_once
from jagflash.variants.sliding_window import sliding_window_attention

BATCHES = [((9, 30, 4), (12, 30, 4)), ((5, 17, 22, 3), (5, 20, 22, 9)), ((13, 2), (13, 6))]


def _attend(q, k, v, qo, ko, mq, mk):
    return sliding_window_attention(q, k, v, qo, ko, window=(7, 0), max_seqlen_q=mq, max_seqlen_kv=mk)


def _lengths(q_lens, k_lens, t):
    return max(q_lens), max(k_lens)


GPU_TOL = {"atol": 2e-2, "rtol": 2e-2}


@pytest.mark.parametrize(
    ("device", "dtype", "head_dim", "backend", "tol"),
    [
        pytest.param("cpu", torch.float32, 16, "aot_eager", {}, marks=pytest.mark.interpret, id="cpu-aot_eager"),
        *(
            pytest.param("cuda", torch.bfloat16, d, "inductor", GPU_TOL, marks=pytest.mark.gpu, id=f"gpu-inductor-d{d}")
            for d in (64, 128)
        ),
    ],
)
def test_one_graph_for_new_lengths(device, dtype, head_dim, backend, tol) -> None:
    assert_jagged_block_compiles_once(
        _attend, BATCHES, _lengths, device=device, dtype=dtype, head_dim=head_dim, backend=backend, **tol
    )
