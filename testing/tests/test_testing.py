"""The test infrastructure itself must be able to fail."""

from __future__ import annotations

import pytest
import torch

from jagflash.core.ops import alloc, poison_outputs
from jagflash.testing import assert_close, broadcast_q_reference, dense_reference, jagged_reference
from jagflash.testing.inputs import make_jagged, offsets_of

pytest_plugins = ["pytester"]


def test_rule_passes_within_twice_torch_error() -> None:
    ref = torch.zeros(4, dtype=torch.float64)
    low = torch.tensor([0.0, 1e-3, 0.0, 0.0])
    assert_close("x", torch.tensor([1.9e-3, 0, 0, 0]), ref, low, atol=0.0)
    with pytest.raises(AssertionError, match=r"max error 2\.100e-03 > 2 \* 1\.000e-03"):
        assert_close("x", torch.tensor([2.1e-3, 0, 0, 0]), ref, low, atol=0.0)


def test_rule_rejects_nan_and_misplaced_infinities() -> None:
    ref = torch.tensor([float("-inf"), 1.0], dtype=torch.float64)
    with pytest.raises(AssertionError, match="1 NaN elements"):
        assert_close("lse", torch.tensor([float("-inf"), float("nan")]), ref, ref, atol=1.0)
    with pytest.raises(AssertionError, match="infinities differ"):
        assert_close("lse", torch.tensor([0.0, 1.0]), ref, ref, atol=1.0)
    assert_close("lse", torch.tensor([float("-inf"), 1.0]), ref, ref, atol=0.0)


def test_poisoning_is_on_in_tests() -> None:
    assert torch.isnan(alloc((3,), torch.float32, torch.device("cpu"))).all()
    previous = poison_outputs(False)
    try:
        assert previous is True
    finally:
        poison_outputs(previous)


def test_references_agree_with_each_other() -> None:
    """Dense and broadcast-Q references are the jagged one seen through other layouts."""
    t = make_jagged((6, 6), (9, 9), 4, 2, 16, torch.float64, "cpu", requires_grad=False)
    out, lse = jagged_reference(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], causal=True)
    dq, dk, dv = (t[n].view(2, -1, *t[n].shape[1:]) for n in ("q", "k", "v"))
    dout, dlse = dense_reference(dq, dk, dv, causal=True)
    torch.testing.assert_close(dout.flatten(0, 1), out)
    torch.testing.assert_close(dlse.transpose(0, 1).flatten(1), lse)
    q = t["q"][:6]
    bout, blse = broadcast_q_reference(q, t["k"], t["v"], offsets_of((9, 9), "cpu"))
    jout, jlse = jagged_reference(q.repeat(2, 1, 1), t["k"], t["v"], offsets_of((6, 6), "cpu"), offsets_of((9, 9), "cpu"))
    torch.testing.assert_close(bout.flatten(0, 1), jout)
    torch.testing.assert_close(blse.transpose(0, 1).flatten(1), jlse)


def test_row_without_keys_is_zero_with_zero_grad() -> None:
    q = torch.randn(3, 1, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 8, dtype=torch.float64, requires_grad=True)
    out, lse = jagged_reference(q, k, k, offsets_of((3,), "cpu"), offsets_of((1,), "cpu"), causal=True)
    assert torch.equal(out[:2], torch.zeros_like(out[:2]))
    assert torch.isinf(lse[0, :2]).all()
    out.sum().backward()
    assert torch.equal(q.grad[:2], torch.zeros_like(q.grad[:2]))
    assert not torch.isnan(q.grad).any()


SHARD_SUITE = """
import pytest

@pytest.mark.parametrize("i", range(7))
def test_a(i):
    pass

def test_b():
    pass
"""


@pytest.mark.parametrize(("shard", "expected"), [("1/3", 3), ("2/3", 3), ("3/3", 2)])
def test_shards_split_the_selection_round_robin(pytester, shard, expected) -> None:
    """--shard I/N: the N shares of 8 tests hold 3, 3 and 2 of them, the rest deselected."""
    pytester.makepyfile(SHARD_SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider", "--shard", shard)
    result.assert_outcomes(passed=expected, deselected=8 - expected)


def test_a_bad_shard_is_a_usage_error(pytester) -> None:
    pytester.makepyfile(SHARD_SUITE)
    result = pytester.runpytest("--shard", "4/3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--shard I/N needs 1 <= I <= N*"])
