"""Capabilities, backend choice and the front door."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import jagflash.core as jc
from jagflash.core.backend import (
    last_choice,
    plan_backend,
    portable_family,
    select,
    tlx_sm90_backend,
)
from jagflash.core.capability import (
    InvalidInput,
    Problem,
    UnsupportedProblem,
    VariantSpec,
    not_supported_reasons,
)
from jagflash.core.ops import call_problem
from jagflash.testing import make_dense, make_jagged

SPEC = VariantSpec("toy", frozenset({"jagged"}), portable_family(frozenset({"causal"})))


def _problem(**kw) -> Problem:
    base = dict(layout="jagged", device_type="cuda", dtype=torch.float16, head_dim=64, hq=4, hkv=4)
    base.update(kw)
    return Problem(**base)


def test_reasons_list_everything() -> None:
    p = _problem(dtype=torch.float64, head_dim=40, features=frozenset({"window", "gqa"}), capability=(7, 5))
    reasons = SPEC.backend("portable").reasons(p)
    text = "; ".join(reasons)
    for want in (
        "compute capability 7.5 below 8.0",
        "dtype float64 not in {bfloat16, float16}",
        "head_dim 40 not in {16, 32, 64, 96, 128, 256}",
        "forward with gqa not supported",
        "forward with window not supported",
    ):
        assert want in text


def test_backward_head_dims_and_layout() -> None:
    p = _problem(head_dim=256, backward=True, capability=(9, 0))
    assert "backward with head_dim 256 not in {16, 32, 64, 96, 128}" in SPEC.backend("portable").reasons(p)
    assert not_supported_reasons(SPEC, _problem(layout="dense")) == ["layout dense not in {jagged}"]
    ref = not_supported_reasons(SPEC, _problem(head_dim=600, device_type="cpu"), "reference")
    assert ref == ["reference: head_dim 600 not in 1..512"]


def test_unsupported_problem_message() -> None:
    e = UnsupportedProblem("toy (portable)", ["a", "b"])
    assert str(e) == "toy (portable) cannot run this: a; b"
    assert isinstance(e, NotImplementedError)
    assert isinstance(InvalidInput("f", ["x"]), ValueError)


def test_select_records_choice_and_reasons() -> None:
    p = _problem(device_type="cpu", dtype=torch.float32)
    choice = select(SPEC, p, torch.device("cpu"), "reference")
    assert choice.name == "reference"
    assert last_choice("toy") is choice
    assert set(choice.reasons) == {"portable", "interpreter"}
    with pytest.raises(UnsupportedProblem, match="device cpu not in"):
        select(SPEC, p, torch.device("cpu"), "portable")


def test_front_door_dispatches_by_layout() -> None:
    names = set(jc.variants())
    assert {"dense", "jagged"} <= names
    t = make_jagged((3, 5), (4, 5), 2, 2, 32, torch.float32, "cpu", requires_grad=False)
    out = jc.attention(t["q"], t["k"], t["v"], q_offsets=t["q_offsets"], kv_offsets=t["kv_offsets"], backend="reference")
    assert out.shape == t["q"].shape
    assert last_choice("jagged").name == "reference"
    d = make_dense(1, 4, 4, 2, 2, 32, torch.float32, "cpu", requires_grad=False)
    assert jc.attention(d["q"], d["k"], d["v"], causal=True, backend="reference").shape == d["q"].shape


def test_front_door_refuses_with_each_variants_reasons() -> None:
    t = make_jagged((3,), (3,), 2, 2, 32, torch.float32, "cpu", requires_grad=False)
    with pytest.raises(UnsupportedProblem) as info:  # (the sliding-window variant takes a window, not on a CPU's portable)
        jc.attention(
            t["q"], t["k"], t["v"], q_offsets=t["q_offsets"], kv_offsets=t["kv_offsets"], window=(4, 0),
            backend="portable",
        )
    assert "jagged: portable: forward with window not supported" in str(info.value)
    if "sliding_window" in jc.variants():
        assert "sliding_window: portable: device cpu not in {cuda}" in str(info.value)
    with pytest.raises(UnsupportedProblem, match="broadcast_q: reference: forward with causal not supported"):
        jc.attention(t["q"], t["k"], t["v"], kv_offsets=t["kv_offsets"], causal=True)
    with pytest.raises(InvalidInput, match="q of rank 3 with no offsets"):
        jc.attention(t["q"], t["k"], t["v"])


def test_forward_only_backend_hands_its_backward_on() -> None:
    fwd_only = dataclasses.replace(tlx_sm90_backend(frozenset({"causal"})), name="fwd-only", head_dims_bwd=frozenset())
    spec = VariantSpec("toy2", frozenset({"jagged"}), (*SPEC.backends, fwd_only))
    fwd = _problem(device_type="cpu", dtype=torch.float32)
    with pytest.raises(UnsupportedProblem) as info:
        select(spec, fwd, torch.device("cpu"), "fwd-only")
    assert "device cpu not in {cuda}" in str(info.value)
    bwd = _problem(device_type="cpu", dtype=torch.float32, backward=True)
    assert "backward not implemented (forward only)" in spec.backend("fwd-only").reasons(bwd)
    choice = select(spec, bwd, torch.device("cpu"), "fwd-only")
    assert choice.name != "fwd-only"
    assert "fwd-only has no backward" in choice.why


def test_look_ahead_choice_records_nothing() -> None:
    spec = VariantSpec("toy3", frozenset({"jagged"}), (tlx_sm90_backend(frozenset({"causal"})), *SPEC.backends))
    problem = _problem(device_type="cpu", dtype=torch.float32)
    name = plan_backend(spec, problem, torch.device("cpu"), None)
    assert name == select(spec, problem, torch.device("cpu"), record=False).name != "tlx-sm90"
    assert last_choice("toy3") is None
    assert plan_backend(spec, problem, torch.device("cpu"), "tlx-sm90") == "portable"  # refused: any


def test_front_door_drops_neutral_flags_a_variant_does_not_take() -> None:
    d = make_dense(1, 4, 4, 2, 2, 32, torch.float32, "cpu", requires_grad=False)
    out = jc.attention(
        d["q"], d["k"], d["v"], causal=False, window=(-1, -1), q_offsets=None, kv_offsets=None,
        backend="reference",
    )
    assert out.shape == d["q"].shape


def test_call_problem_reads_deterministic_for_a_backward_only() -> None:
    """A front-door call poses ``deterministic`` when it will run a backward; a call without one
    does not (no forward declares the feature, so it would be refused everywhere)."""
    d = make_dense(1, 4, 4, 2, 2, 32, torch.float32, "cpu")
    problem = call_problem("dense")
    assert "deterministic" in problem(d["q"], d["k"], d["v"], deterministic=True).features
    assert "deterministic" not in problem(d["q"], d["k"], d["v"]).features
    plain = [d[n].detach() for n in ("q", "k", "v")]
    assert "deterministic" not in problem(*plain, deterministic=True).features


def test_a_requested_backend_hands_on_a_backward_it_lacks_for_this_head_dim() -> None:
    """A backend that runs D 64 forward only (tlx-sm90 did, until session 8): asked for by name,
    its D 64 backward goes to the fastest backend that has one (and says why); a D 128
    backward stays on it."""
    cpu_tlx = dataclasses.replace(
        tlx_sm90_backend(frozenset()), devices=frozenset({"cpu"}), dtypes=frozenset({torch.float32}),
        min_capability=None, max_capability=None, available=lambda: [], head_dims_bwd=frozenset({128}),
    )
    spec = VariantSpec("toy4", frozenset({"jagged"}), (cpu_tlx, *SPEC.backends))
    bwd64 = _problem(device_type="cpu", dtype=torch.float32, head_dim=64, backward=True)
    choice = select(spec, bwd64, torch.device("cpu"), "tlx-sm90", record=False)
    assert choice.name != "tlx-sm90"
    assert "tlx-sm90 has no backward for this problem (backward with head_dim 64 not in {128})" in choice.why
    bwd128 = _problem(device_type="cpu", dtype=torch.float32, head_dim=128, backward=True)
    assert select(spec, bwd128, torch.device("cpu"), "tlx-sm90", record=False).name == "tlx-sm90"


def test_stepped_arange_is_kept_in_plain_eager_mode_only() -> None:
    """arange(n) * step, right for a zero step and n = 1; the same tensor again for the same
    (n, step, device, dtype) in plain eager mode (no kernels per call); a fresh one under a
    dispatch mode or for a tensor subclass among the call's tensors (never a cached fake)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jagflash.core.ops import stepped_arange

    cpu = torch.device("cpu")
    assert stepped_arange(4, 3, cpu, torch.int32).tolist() == [0, 3, 6, 9]
    assert stepped_arange(3, 0, cpu, torch.int64).tolist() == [0, 0, 0]
    assert stepped_arange(1, 5, cpu, torch.int32).tolist() == [0]
    x = torch.zeros(2)
    kept = stepped_arange(5, 2, cpu, torch.int32, (x,))
    assert stepped_arange(5, 2, cpu, torch.int32, (x,)) is kept
    assert stepped_arange(5, 2, cpu, torch.int64, (x,)) is not kept
    with FakeTensorMode() as mode:
        fresh = stepped_arange(5, 2, cpu, torch.int32, (mode.from_tensor(x),))
    assert fresh is not kept
    sub = torch.nn.Parameter(x)  # a tensor subclass among the arguments
    assert stepped_arange(5, 2, cpu, torch.int32, (sub,)) is not kept



@pytest.mark.interpret
def test_front_door_passes_over_a_variant_whose_only_fit_is_the_reference(monkeypatch) -> None:
    """An fp64 call: the higher-priority variant takes fp64 on its reference alone, so the front
    door runs the next variant, whose kernel takes it; asked for the reference (or with the
    opt-in), it runs the first. With the first alone: its reasons, the reference's among them."""
    from jagflash.core.backend import ALLOW_REFERENCE_ENV, kernel_backends
    from jagflash.core.registry import Variant

    ran: list[str] = []

    def variant(name: str, backends, priority: int) -> Variant:
        spec = VariantSpec(name, frozenset({"jagged"}), backends)
        return Variant(spec, call_problem("jagged"), lambda q, k, v, **call: ran.append(name), priority)

    plain = kernel_backends(frozenset())
    interp = next(b for b in plain if b.name == "interpreter")
    wide = dataclasses.replace(interp, dtypes=interp.dtypes | {torch.float64})
    found = {"plain": variant("plain", plain, 2), "wide": variant("wide", (wide,), 1)}
    monkeypatch.setattr("jagflash.core.registry.variants", lambda: found)
    t = make_jagged((3,), (3,), 2, 2, 32, torch.float64, "cpu", requires_grad=False)
    args = (t["q"], t["k"], t["v"])
    offs = {"q_offsets": t["q_offsets"], "kv_offsets": t["kv_offsets"]}
    jc.attention(*args, **offs)
    jc.attention(*args, **offs, backend="reference")
    monkeypatch.setenv(ALLOW_REFERENCE_ENV, "1")
    jc.attention(*args, **offs)
    assert ran == ["wide", "plain", "plain"]
    monkeypatch.delenv(ALLOW_REFERENCE_ENV)
    monkeypatch.setattr("jagflash.core.registry.variants", lambda: {"plain": found["plain"]})
    with pytest.raises(UnsupportedProblem, match="plain: reference: would run it, but the slow PyTorch reference runs only when"):
        jc.attention(*args, **offs)
