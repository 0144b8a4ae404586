"""core.plan and core.tile_scheduler: plan tables (every valid tile exactly once, none empty,
deterministic, forward and backward consistent), plan checks, the simulator, the deal flags, and
the efficiency of the static and dynamic schedules on skewed jagged batches with W = 132
workers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from jagflash.core.capability import InvalidInput
from jagflash.core.jagged import offsets_from_lengths
from jagflash.core.mask import dkdv_q_ranges, kv_tile_ranges
from jagflash.core.plan.build import build_plan, make_plan
from jagflash.core.plan.check import check_plan
from jagflash.core.plan.cost import MIN_SORT_COST, _seq_cost
from jagflash.core.plan.model import PASSES, SCHEDULES, PlanInfo, sort_kind
from jagflash.core.plan.simulate import (
    section_costs,
    sequences_in_flight,
    simulate,
    simulate_plan,
)
from jagflash.core.tuning import plan_blocks
from jagflash.testing.strategies import length_lists, lengths

SIDE = {"fwd": "q", "dq": "q", "dkdv": "kv"}
BLOCKS = st.sampled_from(((16, 16), (32, 32), (16, 64), (64, 16), (32, 128)))


@st.composite
def batches(draw):
    """Offsets (q and kv, sometimes of different lengths), heads, mask, tile sizes, schedule."""
    q_lens = draw(length_lists(max_batch=6, max_len=150, min_batch=0))
    if draw(st.booleans()):
        k_lens = [draw(lengths(150)) for _ in q_lens]
    else:
        k_lens = list(q_lens)
    hkv = draw(st.sampled_from((1, 2)))
    return {
        "q_lens": q_lens,
        "k_lens": k_lens,
        "heads_q": hkv * draw(st.sampled_from((1, 2, 4))),
        "heads_kv": hkv,
        "causal": draw(st.booleans()),
        "window": draw(st.sampled_from((None, None, (7, 0), (40, 5)))),
        "blocks": {p: draw(BLOCKS) for p in PASSES},
        "schedule": draw(st.sampled_from(SCHEDULES)),
        "backward_schedule": draw(st.sampled_from((None, *SCHEDULES))),
        "offsets_dtype": draw(st.sampled_from((torch.int32, torch.int64))),
    }


def _plan(b, schedule=None, device="cpu", offsets=None, **kw):
    qo, ko = offsets or (
        offsets_from_lengths(b["q_lens"], device, b["offsets_dtype"]),
        offsets_from_lengths(b["k_lens"], device, b["offsets_dtype"]),
    )
    bl = b["blocks"]
    return make_plan(
        qo, ko, total_q=sum(b["q_lens"]), total_kv=sum(b["k_lens"]), heads_q=b["heads_q"],
        heads_kv=b["heads_kv"], causal=b["causal"], window=b["window"], block_m=bl["fwd"][0],
        block_n=bl["fwd"][1], dq_blocks=bl["dq"], dkdv_blocks=bl["dkdv"],
        schedule=schedule or b["schedule"], backward_schedule=None if schedule else b.get("backward_schedule"),
        **kw,
    )


def _expected(b, pass_):
    lens = b["q_lens"] if SIDE[pass_] == "q" else b["k_lens"]
    bm, bn = b["blocks"][pass_]
    block = bm if SIDE[pass_] == "q" else bn
    heads = b["heads_q"] if SIDE[pass_] == "q" else b["heads_kv"]
    return sorted((s, h, r) for s, n in enumerate(lens) for r in range(0, n, block) for h in range(heads))


@given(batches())
def test_every_valid_tile_exactly_once_and_none_empty(b) -> None:
    plan = _plan(b)
    for pass_ in PASSES:
        section = plan.section(pass_)
        count = plan.count(pass_)
        rows = [tuple(r) for r in section[:count].tolist()]
        assert sorted(rows) == _expected(b, pass_), pass_
        assert len(set(rows)) == len(rows)
        # none empty: every tile starts inside its sequence (the expected set has no others)
        assert bool((section[count:] == -1).all()), "rows past the count are unused"
        table, costs = section_costs(plan, pass_)
        costs = costs.clamp(min=MIN_SORT_COST)  # the sort's floor: a tile that visits nothing still writes
        kind = sort_kind(plan.info.schedule_of(pass_))
        if kind == 0:
            assert rows == sorted(rows, key=lambda r: (r[0], r[2], r[1])), "batch order"
        elif kind == 1:
            assert bool((costs[1:] <= costs[:-1]).all()), "largest first"
        else:  # grouped: sequences heaviest first (q-tiles x kv-tiles), each one's tiles largest first
            lay = plan.info.layout(pass_)
            lq, lk = (torch.tensor(x, dtype=torch.int64) for x in (b["q_lens"], b["k_lens"]))
            seq = table[:, 0]
            seq_cost = _seq_cost(lq[seq], lk[seq], lay.block_m, lay.block_n)
            keys = list(zip(seq_cost.tolist(), costs.tolist()))
            assert keys == sorted(keys, reverse=True), "heaviest sequence first, then largest tile"


@given(batches())
def test_deterministic(b) -> None:
    one = _plan(b)
    two = _plan(b, offsets=(one.q_offsets, one.kv_offsets))
    assert torch.equal(one.tiles, two.tiles)
    assert torch.equal(one.meta, two.meta)
    assert one.info == two.info


def _visited(plan, pass_, b):
    """(sequence, q-tile start, kv-tile start) pairs the pass's tiles visit."""
    rows, _ = section_costs(plan, pass_)
    bm, bn = b["blocks"][pass_]
    left, right = plan.info.left, plan.info.right
    out = set()
    for s, _h, start in rows.tolist():
        lq, lk = b["q_lens"][s], b["k_lens"][s]
        if SIDE[pass_] == "q":
            lo, _, _, hi = (int(x) for x in kv_tile_ranges(start, lq, lk, bm, bn, left, right))
            out.update((s, start, n0) for n0 in range(lo, hi, bn))
        else:
            lo, _, _, hi = (int(x) for x in dkdv_q_ranges(start, lq, lk, bm, bn, left, right))
            out.update((s, m0, start) for m0 in range(lo, hi, bm))
    return out


@given(batches(), BLOCKS)
def test_forward_and_backward_plans_consistent(b, blocks) -> None:
    """With one tile size for every pass, the forward, dQ and dK/dV tables visit exactly the
    same (q-tile, kv-tile) pairs, and their costs add up alike (dK/dV per kv head of a group)."""
    b = {**b, "blocks": dict.fromkeys(PASSES, blocks), "backward_schedule": None}
    plan = _plan(b)
    assert plan.info.layout("dq").row0 == plan.info.layout("fwd").row0  # dQ shares the rows
    assert plan.count("dq") == plan.count("fwd")
    fwd, dkdv = _visited(plan, "fwd", b), _visited(plan, "dkdv", b)
    assert fwd == dkdv
    group = b["heads_q"] // b["heads_kv"]
    assert int(section_costs(plan, "fwd")[1].sum()) == group * int(section_costs(plan, "dkdv")[1].sum())


@pytest.mark.interpret
@given(batches(), st.booleans())
def test_triton_build_matches_torch_build(b, backward) -> None:
    """The GPU's build (three small Triton kernels a pass and a sort), run by the interpreter,
    gives the torch build's tables bit for bit."""
    from jagflash.core.plan.build import _build_torch, _build_triton

    plan = _plan(b, backward=backward)
    want = _build_torch(plan.q_offsets, plan.kv_offsets, plan.info)
    got = _build_triton(plan.q_offsets, plan.kv_offsets, plan.info)
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1], want[1])


def test_schedules_share_tiles_and_costs() -> None:
    b = {
        "q_lens": [0, 1, 300, 7, 64, 0, 129], "k_lens": [0, 1, 300, 7, 64, 0, 129], "heads_q": 4,
        "heads_kv": 2, "causal": True, "window": None, "offsets_dtype": torch.int32,
        "blocks": {"fwd": (64, 32), "dq": (32, 32), "dkdv": (16, 64)},
    }
    plans = {s: _plan(b, s) for s in SCHEDULES}
    for pass_ in PASSES:
        rows = [sorted(map(tuple, section_costs(p, pass_)[0].tolist())) for p in plans.values()]
        assert rows[0] == rows[1] == rows[2]
    assert torch.equal(plans["static"].tiles, plans["dynamic"].tiles)


def test_backward_false_and_bounds() -> None:
    qo = offsets_from_lengths([5, 300, 0, 33])
    p = make_plan(qo, qo, total_q=338, total_kv=338, heads_q=2, heads_kv=2, block_m=32, block_n=32, backward=False)
    assert p.info.layout("dq").rows == p.info.layout("dkdv").rows == 0
    assert p.count("fwd") == 2 * (1 + 10 + 2)
    # the table is sized from ints: (T + B*(block-1)) // block tiles a head, or B*ceil(max/block)
    assert p.info.layout("fwd").tiles == (338 + 4 * 31) // 32
    tight = make_plan(qo, qo, total_q=338, total_kv=338, heads_q=2, heads_kv=2, block_m=128, block_n=32, max_seqlen_q=300)
    assert tight.info.layout("fwd").tiles == min((338 + 4 * 127) // 128, 4 * 3)
    assert tight.count("fwd") == 2 * (1 + 3 + 1)


def test_plan_info_roundtrip_and_repr() -> None:
    qo = offsets_from_lengths([5, 30])
    p = make_plan(qo, qo, total_q=35, total_kv=35, heads_q=4, heads_kv=1, causal=True, block_m=16, block_n=32, dkdv_blocks=(16, 64), workers=7, schedule="dynamic")
    assert PlanInfo.from_ints(p.info.to_ints()) == p.info
    assert p.info.workers == 7
    assert "Plan(dynamic, workers=7, B=2" in repr(p)
    mixed = make_plan(qo, qo, total_q=35, total_kv=35, heads_q=4, heads_kv=1, block_m=16, block_n=16, schedule="static", backward_schedule="none")
    assert PlanInfo.from_ints(mixed.info.to_ints()) == mixed.info
    assert [mixed.info.schedule_of(p) for p in PASSES] == ["static", "none", "none"]
    assert mixed.info.layout("dq").row0 != mixed.info.layout("fwd").row0  # other order: own rows
    assert "Plan(static/none," in repr(mixed)
    tiles, meta, ints = p.op_args()
    assert tiles is p.tiles
    assert meta is p.meta
    assert ints == p.info.to_ints()
    with pytest.raises(InvalidInput, match="not the info of a jagflash Plan"):
        PlanInfo.from_ints([1, 2, 3])
    with pytest.raises(InvalidInput, match="not the info of a jagflash Plan"):
        PlanInfo.from_ints([1, 2, 3])  # a refusal is not kept
    # the decoded infos are kept: the same ints (of any int type) decode to the same info, of ints
    assert PlanInfo.from_ints(ints) is PlanInfo.from_ints(list(ints))
    as_numpy = PlanInfo.from_ints(np.array(ints, dtype=np.int64))
    assert as_numpy is PlanInfo.from_ints(ints)
    assert type(as_numpy.batch) is int
    assert PlanInfo.from_ints(mixed.info.to_ints()) != PlanInfo.from_ints(ints)


def test_build_plan_opcheck() -> None:
    qo, ko = offsets_from_lengths([5, 0, 30]), offsets_from_lengths([9, 3, 30])
    p = make_plan(qo, ko, total_q=35, total_kv=42, heads_q=2, heads_kv=1, causal=True, block_m=16, block_n=16)
    torch.library.opcheck(build_plan, (qo, ko, p.info.to_ints()))


def test_make_plan_refusals_list_every_reason() -> None:
    qo = offsets_from_lengths([5, 30])
    with pytest.raises(InvalidInput) as info:
        make_plan(qo, qo, total_q=35, total_kv=35, heads_q=3, heads_kv=2, block_m=0, block_n=16, workers=0, schedule="lpt")
    msg = str(info.value)
    for part in ("schedule 'lpt' not in", "blocks['fwd'] must be two positive ints", "heads_q (3) must be a positive multiple of heads_kv (2)", "workers must be at least 1"):
        assert part in msg
    with pytest.raises(InvalidInput, match="both have B\\+1 entries"):
        make_plan(qo, offsets_from_lengths([5]), total_q=35, total_kv=5, heads_q=1, heads_kv=1, block_m=16, block_n=16)
    with pytest.raises(InvalidInput, match="q_offsets must be a 1-D int32/int64 tensor"):
        make_plan(qo.float(), qo, total_q=35, total_kv=35, heads_q=1, heads_kv=1, block_m=16, block_n=16)


def _check(p, qo, ko, **over):
    call = dict(batch=p.info.batch, total_q=p.info.total_q, total_kv=p.info.total_kv, heads_q=p.info.heads_q, heads_kv=p.info.heads_kv, left=p.info.left, right=p.info.right, blocks={"fwd": (32, 32), "dq": (32, 32), "dkdv": (32, 32)}, device=torch.device("cpu"))
    call.update(over)
    check_plan("toy", p.info, tiles=p.tiles, meta=p.meta, q_offsets=qo, kv_offsets=ko, **call)


def test_check_plan_refuses_another_problem() -> None:
    qo = offsets_from_lengths([5, 30, 7])
    p = make_plan(qo, qo, total_q=42, total_kv=42, heads_q=4, heads_kv=2, causal=True, block_m=32, block_n=32)
    _check(p, qo, qo)
    _check(p, qo.clone(), qo.clone())  # other tensors, same values: accepted
    with pytest.raises(InvalidInput) as info:
        _check(p, qo, qo, heads_q=8, right=-1, blocks={"fwd": (64, 32)}, total_kv=41)
    msg = str(info.value)
    assert msg.startswith("toy: invalid input: ")
    for part in ("heads_q=4, this call has 8", "mask (left, right)=(-1, 0), this call has (-1, -1)", "fwd tiles (block_m, block_n)=(32, 32), this call has (64, 32)", "Tk=42, this call has 41"):
        assert part in msg
    other = offsets_from_lengths([6, 29, 7])
    with pytest.raises(InvalidInput, match="built for other offsets"):
        _check(p, other, qo)
    with pytest.raises(InvalidInput, match="built for other offsets"):
        _check(p, qo, other)
    # offsets given as None are not value-checked (broadcast-Q's derived output offsets); the
    # other side still is
    _check(p, None, qo.clone())
    with pytest.raises(InvalidInput, match="built for other offsets"):
        _check(p, None, other)
    fwd_only = make_plan(qo, qo, total_q=42, total_kv=42, heads_q=4, heads_kv=2, block_m=32, block_n=32, causal=True, backward=False)
    with pytest.raises(InvalidInput, match="the plan has no dq pass: build it with backward=True"):
        _check(fwd_only, qo, qo)


# --- simulator ----------------------------------------------------------------------------


def test_simulator_by_hand() -> None:
    costs = [5, 4, 3, 3, 2, 2, 1]
    zz = simulate(costs, 2, "zigzag")  # rounds (5, 4), (3, 3) mirrored, (2, 2), (1,) mirrored
    assert zz.loads.tolist() == [5 + 3 + 2, 4 + 3 + 2 + 1]
    assert (zz.makespan, zz.lower_bound, zz.efficiency) == (10, 10, 1.0)
    rr = simulate(costs, 2, "round-robin")
    assert rr.loads.tolist() == [5 + 3 + 2 + 1, 4 + 3 + 2]
    assert rr.efficiency == 10 / 11
    assert simulate([5, 4, 3, 3], 2, "zigzag").loads.tolist() == [8, 7]
    assert simulate([5, 4, 3, 3], 2, "round-robin").loads.tolist() == [8, 7]
    assert simulate([4, 4, 1, 1, 1, 1], 2, "zigzag").loads.tolist() == [6, 6]
    assert simulate([4, 4, 1, 1, 1, 1], 2, "round-robin").loads.tolist() == [6, 6]
    assert simulate([3, 2, 2, 1, 1, 1], 2, "zigzag").loads.tolist() == [5, 5]
    assert simulate([3, 2, 2, 1, 1, 1], 2, "round-robin").loads.tolist() == [6, 4]
    greedy = simulate([3, 2, 2, 1, 1, 1], 2, "greedy")  # the first worker free takes the next
    assert greedy.loads.tolist() == [3 + 1 + 1, 2 + 2 + 1]
    assert (greedy.lower_bound, greedy.efficiency) == (5, 1.0)
    # one tile ahead: w0 takes 3 and then 2, w1 takes 2 and then 1; w1 starts its 1 at t=2 and
    # takes the fifth tile, w0 starts its 2 at t=3 and takes the sixth
    ahead = simulate([3, 2, 2, 1, 1, 1], 2, "dynamic", lookahead=1)
    assert ahead.loads.tolist() == [3 + 2 + 1, 2 + 1 + 1]
    assert simulate([3, 2, 2, 1, 1, 1], 2, "dynamic", lookahead=0).loads.tolist() == greedy.loads.tolist()
    one = simulate([10, 1, 1], 4, "greedy")
    assert (one.lower_bound, one.makespan, one.efficiency) == (10, 10, 1.0)
    assert simulate([], 3, "zigzag").efficiency == 1.0
    assert simulate([], 3, "dynamic").efficiency == 1.0
    with pytest.raises(ValueError, match="unknown rule"):
        simulate([1], 1, "lpt")


# --- skewed jagged batches (hand-made lengths, the shapes of the bench's jagged workloads) --

#: Deterministic lengths: two long sequences among many short ones, short and long groups,
#: thousands of tiny ones, lengths spread evenly over 16..1536.
SKEWED = {
    "heavy-tail": (4096, 4096, *(32 + 53 * i % 736 for i in range(120))),
    "bimodal": (*(64 + 29 * i % 192 for i in range(112)), *(2048 + 131 * i % 2048 for i in range(16))),
    "tiny": tuple(1 + 7 * i % 63 for i in range(1024)),
    "spread": tuple(16 * (1 + 13 * i % 96) for i in range(64)),
}
#: (batch, causal, kv heads, head dim) with 16 query heads, as the bench's jagged workloads.
SKEWED_CASES = (
    ("spread", False, 16, 128),
    ("spread", True, 16, 128),
    ("heavy-tail", False, 16, 128),
    ("tiny", False, 16, 128),
    ("bimodal", False, 16, 128),
    ("spread", False, 16, 64),
    ("spread", True, 16, 64),
    ("spread", False, 4, 128),
    ("spread", True, 4, 128),
    ("heavy-tail", True, 4, 128),
)


def _skewed_plan(name: str, schedule: str, *, causal: bool = False, kv_heads: int = 16, head_dim: int = 128):
    """A plan of ``SKEWED[name]`` (self-attention, 16 query heads) with the portable GPU tile
    sizes."""
    lens = list(SKEWED[name])
    offsets = offsets_from_lengths(lens, "cpu")
    bl = plan_blocks("portable", head_dim)
    return make_plan(
        offsets, offsets, total_q=sum(lens), total_kv=sum(lens), heads_q=16, heads_kv=kv_heads,
        causal=causal, block_m=bl["fwd"][0], block_n=bl["fwd"][1], dq_blocks=bl["dq"],
        dkdv_blocks=bl["dkdv"], max_seqlen_q=max(lens), max_seqlen_kv=max(lens), schedule=schedule,
    )


@pytest.mark.parametrize(("name", "causal", "kv_heads", "head_dim"), SKEWED_CASES)
def test_simulated_efficiency_on_skewed_batches(name: str, causal: bool, kv_heads: int, head_dim: int) -> None:
    """Static (zigzag LPT) and dynamic (greedy on the sorted list) schedules reach 97 % of the
    lower bound on 132 workers (the H200's SMs), forward and both backward passes, with the GPU
    tile sizes."""
    for schedule in ("static", "dynamic"):
        plan = _skewed_plan(name, schedule, causal=causal, kv_heads=kv_heads, head_dim=head_dim)
        for pass_ in PASSES:
            eff = simulate_plan(plan, pass_, workers=132).efficiency
            assert eff >= 0.97, (schedule, pass_, eff)


# --- GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_gpu_build_is_sync_free_and_matches_cpu(schedule: str, cross: bool) -> None:
    """The Triton build (the GPU's) gives the torch build's table; ``cross``: twice as many
    queries as keys and a left window, so that many forward and dQ q-tiles see no key: tiles
    that visit nothing, which sort at the cost floor (``MIN_SORT_COST``)."""
    b = {
        "q_lens": list(SKEWED["spread"]), "heads_q": 16, "heads_kv": 4,
        "causal": True, "window": (96, 0) if cross else None, "offsets_dtype": torch.int32,
        "blocks": {"fwd": (128, 64), "dq": (64, 64), "dkdv": (32, 64)},
    }
    b["k_lens"] = [max(n // 2, 1) for n in b["q_lens"]] if cross else b["q_lens"]
    cpu = _plan(b, schedule)
    offsets = (cpu.q_offsets.cuda(), cpu.kv_offsets.cuda())
    _plan(b, schedule, offsets=offsets)  # warm-up: compiles the build kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gpu = _plan(b, schedule, offsets=offsets)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(gpu.tiles.cpu(), cpu.tiles)
    assert torch.equal(gpu.meta.cpu(), cpu.meta)


def test_tlx_kernels_deal_static_tables_zigzag_and_dynamic_ones_by_counter() -> None:
    """How the TLX kernels walk a plan: zigzag for grouped and static, in order for batch order,
    and from a fresh zeroed tile counter per launch for a dynamic plan (host side; no GPU)."""
    from jagflash.core.tile_scheduler import deal_flags, tile_counter
    qo = torch.tensor([0, 5, 300], dtype=torch.int32)
    want = {"grouped": (True, False), "static": (True, False), "none": (False, False), "dynamic": (False, True)}
    for schedule, (zigzag, dynamic) in want.items():
        plan = make_plan(qo, qo, total_q=300, total_kv=300, heads_q=2, heads_kv=2, block_m=128, block_n=128, schedule=schedule)
        for pass_ in ("fwd", "dkdv"):
            first, deal = tile_counter(plan, pass_), deal_flags(plan.info, pass_)
            assert deal == (dynamic, zigzag), (schedule, pass_)
            if dynamic:
                second = tile_counter(plan, pass_)
                assert first.dtype == torch.int32
                assert first.tolist() == [0]
                assert first.data_ptr() != second.data_ptr()


class _Passthrough(torch.overrides.TorchFunctionMode):
    """A torch function mode that changes nothing (as a tracer's or a mode's presence)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_tile_counters_are_unshared_aligned_zeros_refilled_by_one_fill(monkeypatch) -> None:
    """The dynamic launches' counters (``tile_counter``): in plain eager mode slots of one kept
    buffer, each 16-byte aligned (the alignment class of a fresh allocation: the same Triton
    specialisation), no two launches given the same one; a slot a kernel counted up is never
    handed out again before the buffer is zeroed, once, when its slots are used up. Under a
    torch function mode (as under tracing; so during a CUDA graph capture) a fresh zeroed tensor."""
    from jagflash.core import tile_scheduler

    monkeypatch.setattr(tile_scheduler, "_counter_pools", {})
    monkeypatch.setattr(tile_scheduler, "COUNTER_SLOTS", 3)
    qo = torch.tensor([0, 5, 300], dtype=torch.int32)
    plan = make_plan(qo, qo, total_q=300, total_kv=300, heads_q=2, heads_kv=2, block_m=128, block_n=128, schedule="dynamic")
    seen = []
    for _ in range(3):
        c = tile_scheduler.tile_counter(plan, "fwd")
        assert c.dtype == torch.int32
        assert c.tolist() == [0]
        assert c.data_ptr() % 16 == 0
        c[0] = 7  # what a launch leaves in it
        seen.append(c.data_ptr())
    assert len(set(seen)) == 3
    after = tile_scheduler.tile_counter(plan, "fwd")  # the buffer's slots are used up: zeroed
    assert after.data_ptr() == seen[0]
    assert after.tolist() == [0]
    buffer = tile_scheduler._counter_pools[(qo.device, None)][0]
    assert buffer.sum().item() == 0
    with _Passthrough():
        fresh = tile_scheduler.tile_counter(plan, "fwd")
    assert fresh.data_ptr() not in seen
    assert fresh.tolist() == [0]


def test_sequences_in_flight_counts_distinct_sequences_per_round() -> None:
    assert sequences_in_flight(np.array([0, 0, 1, 2, 2, 2, 3]), 3) == pytest.approx((2 + 1 + 1) / 3)
    assert np.isnan(sequences_in_flight(np.array([], dtype=np.int64), 3))


def test_grouped_keeps_fewer_sequences_in_flight_than_static_on_causal_batches() -> None:
    """The simulator's L2 proxy on a causal batch of spread lengths: batch order < grouped <
    static, the order of the forward times measured on the H200 on the bench's causal lognormal
    batch (bench/NOTES.md)."""
    flight = {s: simulate_plan(_skewed_plan("spread", s, causal=True), "fwd", workers=132).sequences_in_flight for s in ("none", "grouped", "static")}
    assert flight["none"] < flight["grouped"] < flight["static"], flight
