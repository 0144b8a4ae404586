"""sliding_window_attention on an sm_90 GPU: forward and backward on the tlx-sm90 and portable
backends against the fp64 reference, fp16 and bf16, D 64 and 128, jagged and dense, the
deterministic two-pass backward and the default one (one pass where
``jagflash.core.tuning.use_one_pass`` runs it for a window), and the band-scaling sanity check
(a narrow window visits a fraction of causal's tiles). Needs an sm_90 GPU; the tlx-sm90 cases
need TLX (they skip with the spec's reasons without it)."""

from __future__ import annotations

import pytest
import torch

from jagflash.core.backend import last_choice
from jagflash.core.ops import make_problem
from jagflash.testing import (
    check_against_reference,
    dense_reference,
    jagged_reference,
    make_dense,
    make_jagged,
)
from jagflash.testing.plugin import require
from jagflash.variants.sliding_window import SPEC, sliding_window_attention

pytestmark = pytest.mark.sm90

#: (window, causal): a causal local window, a two-sided one, a right-only one, one wider than
#: every sequence, and one narrower than a tile with Lq > Lk rows that see no key.
WINDOWS = [((256, -1), True), ((100, 37), False), ((-1, 65), False), ((5000, 0), False), ((0, 3), False)]


def _lognormal(seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    lens = torch.clamp(torch.exp(torch.randn(20, generator=gen) + 5.5), 1, 1500).long().tolist()
    lens[2] = 0
    lens[5] = 1
    return lens


@pytest.mark.parametrize("backend", ["tlx-sm90", "portable"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize(("window", "causal"), WINDOWS)
@pytest.mark.parametrize("deterministic", [False, True])
def test_gpu_jagged_forward_and_backward(backend, dtype, head_dim, window, causal, deterministic) -> None:
    require(SPEC, make_problem("jagged", torch.empty(1, 8, head_dim, device="cuda", dtype=dtype),
                               torch.empty(1, 2, head_dim, device="cuda", dtype=dtype), causal=causal,
                               window=window, backward=True, deterministic=deterministic), backend)
    lens = _lognormal(head_dim + len(window))
    kv_lens = [n if i % 3 else max(n // 2, 0) for i, n in enumerate(lens)]  # Lq > Lk in a third
    t = make_jagged(lens, kv_lens, 8, 2, head_dim, dtype, "cuda", seed=head_dim)
    dout = t.pop("dout")

    def kernel(q, k, v, q_offsets, kv_offsets):
        return sliding_window_attention(
            q, k, v, q_offsets, kv_offsets, window=window, causal=causal, return_lse=True,
            deterministic=deterministic, backend=backend,
        )

    def reference(q, k, v, q_offsets, kv_offsets, dtype):
        return jagged_reference(q, k, v, q_offsets, kv_offsets, causal=causal, window=window, dtype=dtype)

    check_against_reference(kernel, reference, t, atol=SPEC.atol[dtype], dout=dout)
    assert last_choice("sliding_window").name == backend


@pytest.mark.parametrize("backend", ["tlx-sm90", "portable"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("nq", "nk", "head_dim", "window", "causal"), [(1000, 1000, 128, (200, -1), True), (333, 700, 64, (50, 50), False), (700, 333, 128, (0, 9), False)])
def test_gpu_dense_forward_and_backward(backend, dtype, nq, nk, head_dim, window, causal) -> None:
    t = make_dense(2, nq, nk, 8, 2, head_dim, dtype, "cuda", seed=nq)
    dout = t.pop("dout")

    def kernel(q, k, v):
        return sliding_window_attention(q, k, v, window=window, causal=causal, return_lse=True, backend=backend)

    def reference(q, k, v, dtype):
        return dense_reference(q, k, v, causal=causal, window=window, dtype=dtype)

    check_against_reference(kernel, reference, t, atol=SPEC.atol[dtype], dout=dout)
    assert last_choice("sliding_window").name == backend


@pytest.mark.parametrize(("window", "causal"), [((20, -1), True), ((8, 8), False), ((0, 3), False)])
def test_gpu_short_batch_runs_solo(window, causal) -> None:
    """A batch of 600 short sequences (0 to 70 keys, GQA, D 128): the TLX forward runs the
    policy's ``SOLO`` (``jagflash.core.tuning.default_solo``; its halves each walk their own
    window band), forward and backward against the reference."""
    from jagflash.core.mask import mask_bounds
    from jagflash.core.tlx import fwd_sm90

    gen = torch.Generator().manual_seed(11)
    lens = torch.randint(0, 71, (600,), generator=gen).tolist()
    t = make_jagged(lens, lens, 4, 2, 128, torch.bfloat16, "cuda", seed=3)
    dout = t.pop("dout")
    left, right = mask_bounds(causal, window)
    _, config = fwd_sm90.plan_and_config(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], max(lens), left=left, right=right, scale=0.1)
    assert config.SOLO

    def kernel(q, k, v, q_offsets, kv_offsets):
        return sliding_window_attention(q, k, v, q_offsets, kv_offsets, window=window, causal=causal, return_lse=True, backend="tlx-sm90")

    def reference(q, k, v, q_offsets, kv_offsets, dtype):
        return jagged_reference(q, k, v, q_offsets, kv_offsets, causal=causal, window=window, dtype=dtype)

    check_against_reference(kernel, reference, t, atol=SPEC.atol[torch.bfloat16], dout=dout)


def test_gpu_tlx_is_the_default_and_the_deterministic_backward_repeats() -> None:
    t = make_jagged(_lognormal(7), _lognormal(7), 8, 8, 128, torch.bfloat16, "cuda")
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    grads = []
    for _ in range(2):
        out = sliding_window_attention(*args, window=(128, 0), deterministic=True)
        grads.append(torch.autograd.grad(out, args[:3], t["dout"]))
        assert last_choice("sliding_window").name == "tlx-sm90"
    for a, b in zip(*grads):
        assert torch.equal(a, b)
