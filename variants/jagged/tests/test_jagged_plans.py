"""jagged_attention on load-balancing Plans: every schedule (none, static, dynamic) through the
persistent kernels against the fp64 reference, a plan shared by two layers' forward and
backward, refusals of a plan built for another problem, and on a GPU: no host sync with a
prebuilt plan, and forward + backward captured in a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from jagflash.core.backend import last_choice
from jagflash.core.capability import InvalidInput
from jagflash.core.plan.model import SCHEDULES
from jagflash.testing import (
    check_against_reference,
    jagged_reference,
    make_jagged,
    replay_in_cuda_graph,
)
from jagflash.variants.jagged import SPEC, jagged_attention, make_plan

pytestmark = pytest.mark.interpret if not torch.cuda.is_available() else pytest.mark.gpu

# One long sequence among short and empty ones, cross lengths, GQA: the tiles' costs differ.
Q_LENS = (3, 0, 90, 1, 17, 33)
K_LENS = (3, 5, 90, 1, 40, 20)


def _dtype(device: str) -> torch.dtype:
    """fp32 under the interpreter; the GPU kernels take fp16/bf16."""
    return torch.float16 if device == "cuda" else torch.float32


def _case(device: str, seed: int = 0):
    return make_jagged(Q_LENS, K_LENS, 4, 2, 32, _dtype(device), device, seed=seed)


def _check_with(plan, t, causal: bool) -> None:
    dout = t.pop("dout")

    def kernel(q, k, v, q_offsets, kv_offsets):
        return jagged_attention(q, k, v, q_offsets, kv_offsets, causal=causal, return_lse=True, plan=plan)

    def reference(q, k, v, q_offsets, kv_offsets, dtype):
        return jagged_reference(q, k, v, q_offsets, kv_offsets, causal=causal, dtype=dtype)

    check_against_reference(kernel, reference, t, atol=SPEC.atol[t["q"].dtype], dout=dout)
    assert last_choice("jagged").name != "reference"


@pytest.mark.parametrize(
    ("schedule", "workers"),
    [("none", None), ("static", None), ("static", 3), ("dynamic", 3), ("dynamic/none", None)],
)
def test_schedules_match_reference(schedule: str, workers: int | None, device: str) -> None:
    """Every schedule computes the same attention; 3 workers deal several zigzag rounds;
    ``fwd/bwd`` gives the backward its own schedule."""
    t = _case(device)
    fwd, _, bwd = schedule.partition("/")
    plan = make_plan(
        t["q"], t["k"], t["q_offsets"], t["kv_offsets"], causal=True, schedule=fwd,
        backward_schedule=bwd or None, workers=workers,
    )
    _check_with(plan, t, causal=True)


def test_one_worker_noncausal(device: str) -> None:
    t = _case(device, seed=3)
    plan = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], schedule="dynamic", workers=1)
    _check_with(plan, t, causal=False)


def test_kept_tile_counters_give_the_fresh_counters_bits(device: str, monkeypatch) -> None:
    """Dynamic plans' launches on counters of the kept buffer (``tile_scheduler.tile_counter``,
    made small here so that it is zeroed again between calls) compute the same bits, forward
    and backward, as on a fresh zeroed counter per launch."""
    from jagflash.core import tile_scheduler

    t = _case(device, seed=5)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    plan = make_plan(
        t["q"], t["k"], t["q_offsets"], t["kv_offsets"], causal=True, schedule="dynamic",
        backward_schedule="dynamic", workers=2,
    )
    assert plan.info.backward_schedule == "dynamic"

    def step():
        out = jagged_attention(*args, causal=True, plan=plan)
        return (out, *torch.autograd.grad(out, args[:3], t["dout"]))

    monkeypatch.setattr(tile_scheduler, "memo_allowed", lambda tensors: False)
    want = step()
    monkeypatch.undo()
    monkeypatch.setattr(tile_scheduler, "_counter_pools", {})
    monkeypatch.setattr(tile_scheduler, "COUNTER_SLOTS", 2)
    for _ in range(2):  # 3 launches a step on 2 slots: zeroed again inside each step
        for a, b in zip(want, step(), strict=True):
            assert torch.equal(a, b)
    (pool,) = tile_scheduler._counter_pools.values()  # the kept buffer served the calls
    if device == "cpu":  # portable: 3 launches a step, 6 on 2 slots, the buffer zeroed twice between
        assert pool[2] == 2


def test_plan_shared_by_two_layers(device: str) -> None:
    """One plan, built once, serves two layers' forward and backward; the second layer passes
    offsets that are other tensors with the same values."""
    layers = [_case(device, seed=s) for s in (1, 2)]
    first = layers[0]
    plan = make_plan(first["q"], first["k"], first["q_offsets"], first["kv_offsets"], causal=True, schedule="dynamic")
    layers[1]["q_offsets"] = layers[1]["q_offsets"].clone()
    for t in layers:
        _check_with(plan, t, causal=True)


def test_schedules_agree_bitwise(device: str) -> None:
    """A tile computes the same bits whichever worker runs it: the schedules agree exactly."""
    t = make_jagged((40, 0, 3, 70), (40, 5, 3, 70), 2, 1, 16, _dtype(device), device, seed=4)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    results = []
    for schedule in SCHEDULES:
        plan = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], causal=True, schedule=schedule, workers=2)
        out = jagged_attention(*args, causal=True, plan=plan)
        results.append((out, *torch.autograd.grad(out, args[:3], t["dout"])))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


def _refused(t, plan, **kw) -> str:
    with pytest.raises(InvalidInput) as info:
        jagged_attention(t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], plan=plan, **kw)
    return str(info.value)


def test_refuses_a_plan_for_another_problem(device: str) -> None:
    def batch(q_lens, hq=4, dim=32):
        return make_jagged(q_lens, (5, 30, 7), hq, 2, dim, _dtype(device), device)

    t = batch((5, 30, 7))
    plan = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], causal=True)
    msg = _refused(t, plan)  # not causal
    assert "the plan was built for mask (left, right)=(-1, 0), this call has (-1, -1)" in msg
    assert "heads_q=4, this call has 8" in _refused(batch((5, 30, 7), hq=8), plan, causal=True)
    assert "Tq=42, this call has 43" in _refused(batch((5, 31, 7)), plan, causal=True)
    if device == "cpu":  # on a GPU other offsets' values fail the stream (torch._assert_async)
        assert "built for other offsets" in _refused(batch((6, 29, 7)), plan, causal=True)
    wide = batch((5, 30, 7), dim=128)
    other_backend = "interpreter" if device == "cuda" else "portable"
    plan_wide = make_plan(wide["q"], wide["k"], wide["q_offsets"], wide["kv_offsets"], causal=True, backend=other_backend)
    assert "fwd tiles (block_m, block_n)=" in _refused(wide, plan_wide, causal=True)
    fwd_only = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], causal=True, backward=False)
    assert "build it with backward=True" in _refused(t, fwd_only, causal=True)
    assert "plan must be a jagflash.core.plan.model.Plan" in _refused(t, "static", causal=True)


def test_inference_plan_without_backward(device: str) -> None:
    t = make_jagged((5, 30, 7), (5, 30, 7), 2, 2, 32, _dtype(device), device, requires_grad=False)
    plan = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], backward=False)
    assert plan.info.layout("dkdv").rows == 0
    t.pop("dout")
    check_against_reference(
        lambda **a: jagged_attention(**a, plan=plan, return_lse=True),
        lambda dtype, **a: jagged_reference(**a, dtype=dtype), t, atol=SPEC.atol[t["q"].dtype],
    )


def test_opcheck_with_plan(device: str) -> None:
    from jagflash.variants.jagged import op as jop

    t = make_jagged((9, 0, 20), (12, 5, 20), 2, 1, 16, _dtype(device), device)
    plan = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], causal=True, schedule="dynamic")
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"], 20, 20, True, 0.25, False, False, "", *plan.op_args())
    torch.library.opcheck(jop.jagged_fwd, args)


# --- GPU only -----------------------------------------------------------------------------


def _gpu_batch():
    lens = (700, 3, 0, 129, 1500, 64, 1)
    return make_jagged(lens, lens, 8, 2, 64, torch.bfloat16, "cuda"), max(lens)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_no_host_sync_with_plan(schedule: str) -> None:
    t, longest = _gpu_batch()
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    kw = {"causal": True, "max_seqlen_q": longest, "max_seqlen_kv": longest}

    def step():
        plan = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], schedule=schedule, causal=True, max_seqlen_q=longest, max_seqlen_kv=longest)
        jagged_attention(*args, plan=plan, **kw).backward(t["dout"])
        jagged_attention(*args, **kw).backward(t["dout"])  # a plan of its own

    step()  # warm-up: compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_cuda_graph_forward_backward_with_prebuilt_plan(schedule: str) -> None:
    t, longest = _gpu_batch()
    plan = make_plan(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], schedule=schedule, causal=True)
    # new inputs in place, then replay twice: the dynamic counter starts from zero each time
    _replay_matches_eager(t, {"causal": True, "max_seqlen_q": longest, "max_seqlen_kv": longest, "plan": plan})


def _replay_matches_eager(t, kw, edit=None) -> None:
    """A jagged forward + backward on ``t`` with ``kw``, captured in a CUDA graph and replayed on
    fresh inputs (after ``edit``): output and gradients bitwise equal to an eager call on them."""
    leaves = [t[n].detach().clone().requires_grad_() for n in ("q", "k", "v")]

    def step():
        for x in leaves:
            x.grad = None
        out = jagged_attention(*leaves, t["q_offsets"], t["kv_offsets"], **kw)
        out.backward(t["dout"])
        return out

    out = replay_in_cuda_graph(step, leaves, edit)
    eager = [x.detach().clone().requires_grad_() for x in leaves]
    want = jagged_attention(*eager, t["q_offsets"], t["kv_offsets"], **kw)
    grads = torch.autograd.grad(want, eager, t["dout"])
    assert torch.equal(out, want)
    for x, g in zip(leaves, grads):
        assert torch.equal(x.grad, g)


def test_default_schedules_follow_the_plan_backend(monkeypatch) -> None:
    """make_plan with schedule="default" (its default) resolves per backend (the plan backend
    stubbed, so this runs on the CPU): for the TLX kernels dynamic forward and backward at
    D 64 and 128, causal or not (the one pass runs at both); for the portable ones grouped / batch
    order; a schedule the caller names stands."""
    from jagflash.core import backend
    from jagflash.variants.jagged import make_plan

    q = torch.zeros(300, 4, 128, dtype=torch.float16)
    offs = torch.tensor([0, 100, 300], dtype=torch.int32)

    def schedules(plan):
        return plan.info.schedule, plan.info.backward_schedule

    monkeypatch.setattr(backend, "plan_backend", lambda *a, **k: "tlx-sm90")
    assert schedules(make_plan(q, q, offs, offs)) == ("dynamic", "dynamic")
    assert schedules(make_plan(q, q, offs, offs, causal=True)) == ("dynamic", "dynamic")
    assert schedules(make_plan(q[..., :64], q[..., :64], offs, offs)) == ("dynamic", "dynamic")
    assert schedules(make_plan(q, q, offs, offs, schedule="grouped", backward_schedule=None)) == ("grouped", "grouped")
    monkeypatch.setattr(backend, "plan_backend", lambda *a, **k: "portable")
    assert schedules(make_plan(q, q, offs, offs, causal=True)) == ("grouped", "none")



def test_own_plan_is_kept_per_offsets_and_an_in_place_edit_builds_a_fresh_one(device: str, monkeypatch) -> None:
    """A call without ``plan=`` builds its plan once per offsets tensor (storage and version);
    writing the offsets in place makes the next call build a fresh plan, and its results are
    those of the new offsets."""
    from jagflash.core import jagged_call

    builds = []
    real = jagged_call.build_plan
    monkeypatch.setattr(jagged_call, "build_plan", lambda *a: builds.append(1) or real(*a))
    jagged_call.PLAN_MEMO.clear()
    t = make_jagged((5, 0, 20, 7), (6, 3, 20, 9), 2, 1, 16, _dtype(device), device)
    args = [t[n] for n in ("q", "k", "v", "q_offsets", "kv_offsets")]
    with torch.no_grad():
        first = jagged_attention(*args, causal=True)
        again = jagged_attention(*args, causal=True)
    assert len(builds) == 1
    assert torch.equal(first, again)
    for name, lens in (("q_offsets", (20, 5, 7, 0)), ("kv_offsets", (9, 20, 3, 6))):
        t[name].copy_(torch.tensor([0, *lens], device=device).cumsum(0))  # same B and totals
    t.pop("dout")

    def kernel(q, k, v, q_offsets, kv_offsets):
        return jagged_attention(q, k, v, q_offsets, kv_offsets, causal=True, return_lse=True)

    def reference(q, k, v, q_offsets, kv_offsets, dtype):
        return jagged_reference(q, k, v, q_offsets, kv_offsets, causal=True, dtype=dtype)

    with torch.no_grad():  # the ints of the first calls: only the edit can make this a miss
        check_against_reference(kernel, reference, t, atol=SPEC.atol[t["q"].dtype])
    assert len(builds) == 2


@pytest.mark.gpu
def test_cuda_graph_of_a_call_without_plan_replays_on_offsets_written_in_place() -> None:
    """Captured without ``plan=``, a call builds its plan inside the graph (no plan memo during
    a capture: ``jagflash.core.memo``), so replays after an in-place write to the offsets run on
    the new offsets, not on a plan the warm-up kept."""
    t, longest = _gpu_batch()
    lens = (1500, 1, 64, 0, 700, 3, 129)  # the batch's lengths reordered: same B, totals, longest
    kw = {"causal": True, "max_seqlen_q": longest, "max_seqlen_kv": longest, "deterministic": True}

    def edit():
        new = torch.tensor([0, *lens], device="cuda").cumsum(0)
        t["q_offsets"].copy_(new)
        t["kv_offsets"].copy_(new)

    _replay_matches_eager(t, kw, edit)
