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


def test_dkdv_tiles_follow_head_dim_and_mask() -> None:
    """64-query dK/dV steps only at D 128 without a mask bound (the one pass needs them), 32
    elsewhere; what plans are laid out with for the TLX backend (plan_blocks) agrees."""
    from jagflash.core.backend import tlx_sm90_blocks
    from jagflash.core.portable import plan_blocks

    assert tlx_sm90_blocks(128, False)["dkdv"] == (64, 128)
    assert tlx_sm90_blocks(128, True)["dkdv"] == (32, 128)
    assert tlx_sm90_blocks(64, False)["dkdv"] == (32, 128)
    for dim in (64, 128):
        for bounded in (False, True):
            assert plan_blocks("tlx-sm90", dim, bounded=bounded)["dkdv"] == tlx_sm90_blocks(dim, bounded)["dkdv"]


def test_one_pass_backward_refuses_a_plan_laid_out_for_32_query_steps() -> None:
    """A causal plan (32-query dK/dV tiles) handed to the one pass: refused before any launch,
    naming both tile shapes."""
    from jagflash.core.schedule import make_plan

    q = torch.zeros(8, 1, 128, dtype=torch.float16)
    offs = torch.tensor([0, 8], dtype=torch.int32)
    plan = make_plan(
        offs, offs, total_q=8, total_kv=8, heads_q=1, heads_kv=1, window=(-1, 0), block_m=128,
        block_n=128, dkdv_blocks=(32, 128), backward=True,
    )
    with pytest.raises(ValueError, match=r"dK/dV tiles are 32x128; the one-pass backward takes 64x128"):
        tlx_attention.backward(q, q, q, q, q, torch.zeros(1, 8), offs, offs, left=-1, right=0, scale=0.125, plan=plan)
