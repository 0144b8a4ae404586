"""The TLX kernels' host side that needs no GPU: refusals (they come before any launch),
the policy that picks the one-pass backward, and where its dQ accumulator keeps each query."""

from __future__ import annotations

import pytest
import torch

tlx_attention = pytest.importorskip("jagflash.core.tlx_attention", reason="needs triton-utlx")


def test_one_pass_backward_refuses_an_unknown_write() -> None:
    q = torch.zeros(4, 1, 64, dtype=torch.float16)
    offs = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="dq_write must be one of"):
        tlx_attention.backward(q, q, q, q, q, torch.zeros(1, 4), offs, offs, left=-1, right=-1, scale=0.125, dq_write="scatter")


def test_one_pass_only_where_it_measured_faster(monkeypatch) -> None:
    """When on: unmasked D 128 only, never for a deterministic call; off: never."""
    monkeypatch.setattr(tlx_attention, "ONE_PASS_BACKWARD", True)
    assert tlx_attention.use_one_pass(False, -1, -1, 128)
    assert not tlx_attention.use_one_pass(True, -1, -1, 128)
    assert not tlx_attention.use_one_pass(False, -1, 0, 128)  # causal
    assert not tlx_attention.use_one_pass(False, 64, -1, 128)  # window
    assert not tlx_attention.use_one_pass(False, -1, -1, 64)
    monkeypatch.setattr(tlx_attention, "ONE_PASS_BACKWARD", False)
    assert not tlx_attention.use_one_pass(False, -1, -1, 128)


@pytest.mark.parametrize("lens", [(37, 300, 129), (0, 1, 0, 4, 5), (128,), ()])
def test_dq_columns_start_aligned_and_keep_every_query(lens) -> None:
    """The one-pass dQ^T accumulator: each sequence starts at a multiple of 4 columns, its
    queries are contiguous from there, no two queries share a column, all lie below width."""
    offsets = torch.tensor([0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    total = int(offsets[-1])
    acc_cols, width, token_cols = tlx_attention.dq_columns(offsets, total)
    assert (acc_cols % 4 == 0).all()
    assert token_cols.unique().numel() == total
    assert (token_cols < width).all()
    for b, n in enumerate(lens):
        start = int(offsets[b])
        assert token_cols[start:start + n].tolist() == list(range(int(acc_cols[b]), int(acc_cols[b]) + n))
