"""Refusals of the TLX kernels' host functions that need no GPU (they come before any launch)."""

from __future__ import annotations

import pytest
import torch

tlx_attention = pytest.importorskip("jagflash.core.tlx_attention", reason="needs triton-utlx")


def _args():
    q = torch.zeros(4, 1, 64, dtype=torch.float16)
    offs = torch.tensor([0, 4], dtype=torch.int32)
    return (q, q, q, q, q, torch.zeros(1, 4), offs, offs)


def test_one_pass_backward_refuses_the_trapping_tma_write(monkeypatch) -> None:
    monkeypatch.delenv("JAGFLASH_EXPERIMENTAL_TMA_REDUCE", raising=False)
    with pytest.raises(RuntimeError, match="illegal instruction"):
        tlx_attention.backward(*_args(), left=-1, right=-1, scale=0.125, dq_write="tma")


def test_one_pass_backward_refuses_an_unknown_write() -> None:
    with pytest.raises(ValueError, match="dq_write must be one of"):
        tlx_attention.backward(*_args(), left=-1, right=-1, scale=0.125, dq_write="scatter")

