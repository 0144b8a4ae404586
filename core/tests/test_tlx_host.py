"""The TLX kernels' host side that needs no GPU: refusals (they come before any launch),
and the policy that picks the one-pass backward."""

from __future__ import annotations

import pytest
import torch

tlx_attention = pytest.importorskip("jagflash.core.tlx_attention", reason="needs triton-utlx")


def test_one_pass_backward_lists_every_reason_it_refuses() -> None:
    """An unknown dQ write and a head dim the kernel does not split (D 64): both named."""
    q = torch.zeros(4, 1, 64, dtype=torch.float16)
    offs = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="dq_write must be one of") as err:
        tlx_attention.backward(q, q, q, q, q, torch.zeros(1, 4), offs, offs, left=-1, right=-1, scale=0.125, dq_write="scatter")
    assert "head dims (128,)" in str(err.value)
    assert "got 64" in str(err.value)


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
