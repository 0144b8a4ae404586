"""dense_attention on Plans: every schedule through the persistent kernels against the fp64
reference (causal, where tiles' costs differ), a plan reused across calls, and refusals."""

from __future__ import annotations

import pytest
import torch

from jagflash.core.backend import last_choice
from jagflash.core.capability import InvalidInput
from jagflash.core.plan.model import SCHEDULES
from jagflash.testing import check_against_reference, dense_reference, make_dense
from jagflash.variants.dense import SPEC, dense_attention, make_plan

pytestmark = pytest.mark.interpret if not torch.cuda.is_available() else pytest.mark.gpu


def _dtype(device: str) -> torch.dtype:
    """fp32 under the interpreter; the GPU kernels take fp16/bf16."""
    return torch.float16 if device == "cuda" else torch.float32


@pytest.mark.parametrize("schedule", [*SCHEDULES, "static/none"])
def test_schedules_match_reference(schedule: str, device: str) -> None:
    t = make_dense(2, 70, 45, 4, 2, 32, _dtype(device), device, seed=1)  # Nq > Nk: rows see no key
    dout = t.pop("dout")
    fwd, _, bwd = schedule.partition("/")
    plan = make_plan(t["q"], t["k"], causal=True, schedule=fwd, backward_schedule=bwd or None, workers=3)

    def kernel(q, k, v):
        return dense_attention(q, k, v, causal=True, return_lse=True, plan=plan)

    def reference(q, k, v, dtype):
        return dense_reference(q, k, v, causal=True, dtype=dtype)

    check_against_reference(kernel, reference, t, atol=SPEC.atol[t["q"].dtype], dout=dout)
    assert last_choice("dense").name != "reference"


def test_plan_reused_and_refused(device: str) -> None:
    a = make_dense(1, 40, 40, 2, 1, 16, _dtype(device), device, seed=2)
    b = make_dense(1, 40, 40, 2, 1, 16, _dtype(device), device, seed=3)
    plan = make_plan(a["q"], a["k"], schedule="dynamic")
    for t in (a, b):
        dout = t.pop("dout")
        check_against_reference(
            lambda **x: dense_attention(**x, plan=plan, return_lse=True),
            lambda dtype, **x: dense_reference(**x, dtype=dtype), t, atol=SPEC.atol[t["q"].dtype],
            dout=dout,
        )
    other = make_dense(1, 41, 40, 2, 1, 16, _dtype(device), device)
    with pytest.raises(InvalidInput) as info:
        dense_attention(other["q"], other["k"], other["v"], causal=True, plan=plan)
    msg = str(info.value)
    assert "the plan was built for Tq=40, this call has 41" in msg
    assert "mask (left, right)=(-1, -1), this call has (-1, 0)" in msg


def test_default_schedules_follow_the_plan_backend_and_the_mask(monkeypatch) -> None:
    """make_plan with schedule="default": for the TLX kernels static without a mask (every
    tile costs the same: nothing for a tile counter to balance) and dynamic with one; for the
    portable ones grouped / batch order (the plan backend stubbed, so this runs on the CPU)."""
    from jagflash.core import backend
    from jagflash.core.tile_scheduler import default_workers
    from jagflash.variants.dense import make_plan

    q = torch.zeros(2, 64, 4, 128, dtype=torch.float16)

    def schedules(plan):
        return plan.info.schedule, plan.info.backward_schedule

    monkeypatch.setattr(backend, "plan_backend", lambda *a, **k: "tlx-sm90")
    assert schedules(make_plan(q, q)) == ("grouped", "none")
    # the one-pass backward's: grouped order where a sequence's kv-tiles (here one 128-key tile
    # x 4 heads) fit the workers (4 on the CPU, the SMs on a GPU), else cost order
    assert default_workers(q.device) >= 4
    assert schedules(make_plan(q, q, causal=True)) == ("dynamic", "dynamic-grouped")
    long = torch.zeros(2, 1024, 4, 128, dtype=torch.float16)  # 8 kv-tiles x 4 heads a sequence
    assert schedules(make_plan(long, long, causal=True)) == ("dynamic", "dynamic")
    monkeypatch.setattr(backend, "plan_backend", lambda *a, **k: "portable")
    assert schedules(make_plan(q, q, causal=True)) == ("grouped", "none")
