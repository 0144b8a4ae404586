"""Address arithmetic past 2^31 elements.

Two ways a kernel's int32 index arithmetic can wrap: a tensor whose rows lie more than 2^31
elements from its start (a big batch), and a row offset inside one sequence times a wide row
stride (a long sequence, or a packed view). The CPU test builds the second without the memory
of the first: q, k, v and dO are views into one buffer whose rows are ``2^24 - 2^10`` elements
apart, so row 129 of a sequence already lies past 2^31 elements; the buffer is allocated but
never touched outside the few columns the views use, so it costs virtual memory only. The
result must equal the one on contiguous copies bit for bit (same kernel, same values).

The GPU test runs a real batch of more than 2^31 elements per tensor forward and backward
through the default backend and checks sampled sequences against the fp64 reference with the
tolerance rule, and every output for unwritten (NaN-poisoned) elements.
"""

from __future__ import annotations

import pytest
import torch

from jagflash.core.ops import MAX_ROW_STRIDE
from jagflash.core.tolerance import assert_close_all
from jagflash.testing import jagged_reference, reference_grads

jagged = pytest.importorskip("jagflash.variants.jagged")

INT32_LIMIT = 2**31


def _wide_views(lens: tuple[int, ...], heads: int, dim: int, dtype: torch.dtype):
    """q, k, v, dO ``[T, heads, dim]`` as views into one buffer with a row stride just below
    :data:`MAX_ROW_STRIDE` (so the kernels read them in place), filled with random values."""
    total = sum(lens)
    width = heads * dim
    stride = MAX_ROW_STRIDE - 1024
    buf = torch.empty(total, stride, dtype=dtype)  # virtual memory: only 4 * width columns touched
    gen = torch.Generator().manual_seed(7)
    buf[:, : 4 * width] = torch.randn(total, 4 * width, generator=gen, dtype=torch.float32).to(dtype)
    views = [buf[:, i * width : (i + 1) * width].unflatten(1, (heads, dim)) for i in range(4)]
    assert views[0].stride(0) * (max(lens) - 1) >= INT32_LIMIT
    return views


@pytest.mark.interpret
def test_wide_row_stride_reads_past_2_31_elements() -> None:
    """Sequences of 40 and 150 rows (the second's rows 129..149 lie past 2^31 elements of its
    views' storage), GQA 2:1, causal, forward and backward under the interpreter: equal bit for
    bit to the same call on contiguous copies."""
    lens = (40, 150)
    offsets = torch.tensor([0, 40, 190], dtype=torch.int32)
    q, k, v, do = _wide_views(lens, heads=2, dim=16, dtype=torch.float32)
    k, v = k[:, :1], v[:, :1]

    def run(q, k, v, do):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = jagged.jagged_attention(*leaves, offsets, offsets, causal=True, backend="interpreter")
        out.backward(do)
        return [out.detach()] + [t.grad for t in leaves]

    got = run(q, k, v, do)
    want = run(*(t.contiguous() for t in (q, k, v, do)))
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.equal(g, w), f"{name} differs from the contiguous call"
    del q, k, v, do


def _sample(lens: list[int]) -> list[int]:
    """Sequences worth checking: the first, the last (its rows lie past 2^31 elements), the
    longest, an empty one if any, and a few in between."""
    picks = {0, len(lens) - 1, max(range(len(lens)), key=lens.__getitem__)}
    picks |= {i for i, n in enumerate(lens) if n == 0}
    picks |= set(range(len(lens) // 3, len(lens), len(lens) // 3))
    return sorted(picks)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_batch_past_2_31_elements_forward_backward(causal: bool) -> None:
    """2,048 sequences, 1.1 M tokens, H 16, D 128, bf16 (2.3 G elements per tensor): forward and
    backward through the default backend; sampled sequences against the fp64 reference."""
    dev = "cuda"
    heads, dim, dtype = 16, 128, torch.bfloat16
    gen = torch.Generator().manual_seed(2031)
    lens = torch.randint(1, 1075, (2048,), generator=gen)
    lens[5] = 0
    lens[-1] = 1074
    total = int(lens.sum())
    assert total * heads * dim > INT32_LIMIT
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32).to(dev)
    q, k, v, do = (torch.randn(total, heads, dim, device=dev, dtype=dtype) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out, lse = jagged.jagged_attention(*leaves, offsets, offsets, causal=causal, return_lse=True)
    out.backward(do)
    torch.cuda.synchronize()
    for name, t in (("out", out), ("lse", lse), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        assert not torch.isnan(t).any(), f"{name} has NaN elements (unwritten?)"
    cpu_off = offsets.cpu().tolist()
    for b in _sample(lens.tolist()):
        s, e = cpu_off[b], cpu_off[b + 1]
        one = torch.tensor([0, e - s], dtype=torch.int32, device=dev)
        parts = [t.detach()[s:e] for t in (q, k, v)]
        ref_out, ref_grads = reference_grads(jagged_reference, [*parts, one, one], do[s:e], torch.float64, causal=causal)
        low_out, low_grads = reference_grads(jagged_reference, [*parts, one, one], do[s:e], dtype, causal=causal)
        ref_lse = jagged_reference(*parts, one, one, causal=causal)[1]
        low_lse = jagged_reference(*parts, one, one, causal=causal, dtype=torch.float32)[1]
        got = [out[s:e], lse[:, s:e], q.grad[s:e], k.grad[s:e], v.grad[s:e]]
        assert_close_all(
            [f"seq {b} {n}" for n in ("out", "lse", "dq", "dk", "dv")], got,
            [ref_out, ref_lse, *ref_grads], [low_out, low_lse, *low_grads], atol=jagged.SPEC.atol[dtype],
        )
