"""The host-side memos and shortcuts of a call (issue 20: a small call's host time): each one
must miss when anything it depends on changes, and none may change a refusal.

- ``core.ops.make_problem``: kept per (layout, device type, dtype, head dim, heads, flags);
- ``core.portable.persistent.config``: kept per (backend, pass, heads, head dim, mask, block size);
- ``core.backend.record_path``: one "choice with its path" per (choice, path, why);
- ``core.backend.select``: its key reads the environment at every call;
- ``core.plan.check.check_plan``: the ints compared at once, every reason still listed.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from jagflash.core import ops
from jagflash.core.backend import ENV_VAR, kernel_backends, last_choice, record_path, select
from jagflash.core.capability import DEFAULT_ATOL, InvalidInput, UnsupportedProblem, VariantSpec
from jagflash.core.plan.build import make_plan
from jagflash.core.plan.check import check_plan
from jagflash.core.portable import persistent

#: A variant of core's kernels as the jagged one declares it (core's tests import no variant).
SPEC = VariantSpec(
    name="hostmemo", layouts=frozenset({"jagged"}), backends=kernel_backends(frozenset({"causal", "gqa", "lse"})),
    atol=DEFAULT_ATOL,
)


def _qk(dtype=torch.float32, dim=32, hq=4, hkv=2):
    return torch.zeros(6, hq, dim, dtype=dtype), torch.zeros(6, hkv, dim, dtype=dtype)


def test_make_problem_misses_on_every_input_it_reads() -> None:
    """Every variation of what a problem is made of gives the problem made afresh (never a kept
    one of other inputs); the same inputs give the kept object."""
    base = {"causal": False, "window": (-1, -1), "return_lse": False, "backward": False, "deterministic": False,
            "features": frozenset()}
    tensors = {
        "base": _qk(), "dtype": _qk(torch.float16), "dim": _qk(dim=64), "hq": _qk(hq=8), "hkv": _qk(hkv=1),
    }
    flags = [
        {}, {"causal": True}, {"window": (3, -1)}, {"window": [3, -1]}, {"return_lse": True}, {"backward": True},
        {"backward": True, "deterministic": True}, {"features": frozenset({"block_sparse"})},
    ]
    for layout, (name, (q, k)), flag in itertools.product(("jagged", "dense"), tensors.items(), flags):
        kw = {**base, **flag}
        got = ops.make_problem(layout, q, k, **kw)
        assert got == ops._make_problem(layout, q, k, *kw.values()), (layout, name, flag)
        assert ops.make_problem(layout, q, k, **kw) is got  # kept
    meta = torch.zeros(6, 4, 32, device="meta"), torch.zeros(6, 2, 32, device="meta")
    assert ops.make_problem("jagged", *meta, causal=False).device_type == "meta"
    assert ops.make_problem("jagged", *_qk(), causal=False).device_type == "cpu"


def test_portable_config_misses_on_every_input_and_is_read_only() -> None:
    """The kept launch config equals the one computed afresh for every backend, pass, heads,
    head dim, mask side and block size, and nobody can edit a kept one."""
    grid = itertools.product(
        ("interpreter", "portable"), ("fwd", "dq", "dkdv"), ((4, 2), (4, 4)), (32, 64, 128), ((-1, -1), (8, 0)),
        (None, (64, 64), (128, 64)),
    )
    for backend, pass_, (hq, hkv), dim, (left, right), size in grid:
        q, k = _qk(dim=dim, hq=hq, hkv=hkv)
        got = persistent.config(backend, pass_, q, k, left, right, size)
        fresh = persistent._config.__wrapped__(backend, pass_, hq, hkv, dim, left, right, size)
        assert dict(got) == dict(fresh), (backend, pass_, hq, hkv, dim, left, right, size)
    with pytest.raises(TypeError):
        got["num_warps"] = 1  # type: ignore[index]


def test_record_path_follows_the_latest_choice_and_path() -> None:
    """``last_choice`` shows the path of the latest call, for the choice that call made: a kept
    "choice with path" never stands in for another choice, path or reason."""
    q, k = _qk()
    first = select(SPEC, ops.make_problem("jagged", q, k, causal=False), q.device, "reference")
    record_path(SPEC.name, "tiles", "why one")
    kept = last_choice(SPEC.name)
    assert (kept.name, kept.path, kept.path_why) == ("reference", "tiles", "why one")
    select(SPEC, ops.make_problem("jagged", q, k, causal=False), q.device, "reference")
    record_path(SPEC.name, "decode", "why two")
    assert (last_choice(SPEC.name).path, last_choice(SPEC.name).path_why) == ("decode", "why two")
    select(SPEC, ops.make_problem("jagged", q, k, causal=False), q.device, "reference")
    record_path(SPEC.name, "tiles", "why one")
    assert last_choice(SPEC.name).path_why == "why one"
    other = select(SPEC, ops.make_problem("jagged", q, k, causal=True), q.device, "reference")
    assert other is not first
    record_path(SPEC.name, "tiles", "why one")
    assert last_choice(SPEC.name) is not kept  # the other choice's own, though its fields read the same
    assert last_choice(SPEC.name) == dataclasses.replace(other, path="tiles", path_why="why one")
    select(SPEC, ops.make_problem("jagged", q, k, causal=False), q.device, "reference")
    assert last_choice(SPEC.name).path is None  # a new call's choice carries no old path


def test_select_reads_the_backend_variable_at_every_call(monkeypatch) -> None:
    q, k = _qk()
    problem = ops.make_problem("jagged", q, k, causal=False)

    def auto():  # the automatic choice, or its refusal (no kernel backend in this process)
        try:
            return select(SPEC, problem, q.device).name
        except UnsupportedProblem as e:
            return type(e)

    monkeypatch.delenv(ENV_VAR, raising=False)
    before = auto()
    monkeypatch.setenv(ENV_VAR, "reference")
    assert select(SPEC, problem, q.device).name == "reference"
    monkeypatch.delenv(ENV_VAR)
    assert auto() == before


def test_check_plan_lists_every_mismatch_at_once() -> None:
    """An int that differs and a plan on other tensors are reported together (the ints are
    compared in one go first, then every reason is formatted)."""
    offs = torch.tensor([0, 3, 8], dtype=torch.int32)
    plan = make_plan(offs, offs, total_q=8, total_kv=8, heads_q=2, heads_kv=2, block_m=32, block_n=32)
    ok = {"q_offsets": offs, "kv_offsets": offs, "batch": 2, "total_q": 8, "total_kv": 8, "heads_q": 2, "heads_kv": 2,
          "left": -1, "right": -1, "blocks": {"fwd": (32, 32)}, "device": offs.device}
    check_plan("t", plan.info, tiles=plan.tiles, meta=plan.meta, **ok)
    assert plan.info.rows == plan.tiles.shape[0]
    bad = {**ok, "total_q": 9, "heads_kv": 1, "blocks": {"fwd": (32, 32), "dq": (64, 32)}}
    with pytest.raises(InvalidInput) as e:
        check_plan("t", plan.info, tiles=plan.tiles[1:], meta=plan.meta, **bad)
    msg = str(e.value)
    for part in ("Tq=8, this call has 9", "heads_kv=2, this call has 1", "dq tiles (block_m, block_n)=(32, 32)",
                 "plan tensors do not match their info"):
        assert part in msg, msg
    for one in ({"left": 4}, {"blocks": {"fwd": (64, 32)}}, {"batch": 3}):
        with pytest.raises(InvalidInput):
            check_plan("t", plan.info, tiles=plan.tiles, meta=plan.meta, **{**ok, **one})


def test_plan_info_misses_on_every_argument() -> None:
    """A kept PlanInfo is the one made afresh for every change of any argument, its ints decode
    back to it, and a refusal is never kept (each call raises it again)."""
    from jagflash.core.plan.model import PlanInfo, _plan_info, plan_info

    base = {"batch": 3, "total_q": 40, "total_kv": 50, "heads_q": 4, "heads_kv": 2, "causal": False, "window": None,
            "blocks": {"fwd": (32, 32)}, "max_seqlen_q": None, "max_seqlen_kv": None, "workers": None,
            "schedule": "static", "backward_schedule": None, "backward": True, "q_ptr": 0, "kv_ptr": 0}
    changes = [{}, {"batch": 4}, {"total_q": 41}, {"total_kv": 51}, {"heads_q": 8}, {"heads_kv": 1}, {"causal": True},
               {"window": (4, -1)}, {"blocks": {"fwd": (64, 32)}}, {"blocks": {"fwd": (32, 32), "dkdv": (16, 64)}},
               {"max_seqlen_q": 20}, {"max_seqlen_kv": 20}, {"workers": 5}, {"schedule": "dynamic"},
               {"backward_schedule": "none"}, {"backward": False}, {"q_ptr": -2}, {"kv_ptr": 7},
               {"blocks": {"fwd": [32, 32]}}]
    for change in changes:
        kw = {**base, **change}
        got = plan_info(**kw)
        fresh = _plan_info(*({**kw, "blocks": tuple(kw["blocks"].items())}).values())
        assert got == fresh, change
        assert got.to_ints() == fresh.to_ints()
        assert PlanInfo.from_ints(got.to_ints()) == got
        assert got.to_ints() is not got.to_ints()  # a fresh list: a caller may edit its own
    for _ in range(2):
        with pytest.raises(InvalidInput, match="heads_q"):
            plan_info(**{**base, "heads_q": 3})


def test_tlx_configs_miss_on_every_argument_and_give_fresh_constexprs() -> None:
    """``fwd_config`` / ``bwd_config`` are kept per arguments: each change gives the config made
    afresh; ``constexprs()`` is every field, in a dict the caller may edit."""
    from jagflash.core.tuning import bwd_config, fwd_config

    fwd = {"head_dim": 128, "group": 1, "left": -1, "right": -1, "q_shared": False, "scale": 0.1, "dynamic": True,
           "zigzag": False, "total_kv": 4096, "batch": 4, "sparse": False}
    bwd = {"head_dim": 128, "group": 1, "left": -1, "right": -1, "q_shared": False, "fused_dq": True, "dynamic": True,
           "zigzag": False, "total_kv": 4096, "batch": 4, "sparse": False}
    for make, base, changes in (
        (fwd_config, fwd, [{"head_dim": 64}, {"group": 4}, {"left": 8}, {"right": 0}, {"q_shared": True},
                           {"scale": -0.1}, {"dynamic": False}, {"zigzag": True}, {"total_kv": 100}, {"batch": 64},
                           {"sparse": True}]),
        (bwd_config, bwd, [{"head_dim": 64}, {"group": 4}, {"left": 8}, {"right": 0}, {"q_shared": True},
                           {"fused_dq": False}, {"dynamic": False}, {"zigzag": True}, {"total_kv": 100}, {"batch": 64},
                           {"sparse": True}]),
    ):
        for change in [{}, *changes]:
            kw = {**base, **change}
            got, fresh = make(**kw), make.__wrapped__(**kw)
            assert got == fresh, change
            assert got.constexprs() == dataclasses.asdict(fresh)
        edited = got.constexprs()
        edited["HEAD_DIM"] = -1
        assert got.constexprs()["HEAD_DIM"] == got.HEAD_DIM
