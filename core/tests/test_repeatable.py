"""``deterministic=True`` is bitwise repeatable: 100 forward + backward calls of every variant
on every GPU backend give the same bits (output, LSE and the three gradients), each call from
scratch (its own plan, its own buffers). Also the out-of-memory case: a call that runs out of
device memory leaves nothing behind that spoils the next call."""

from __future__ import annotations

import gc

import pytest
import torch

from jagflash.core.ops import make_problem
from jagflash.testing import make_dense, make_jagged
from jagflash.testing.plugin import require

jagged = pytest.importorskip("jagflash.variants.jagged")
dense = pytest.importorskip("jagflash.variants.dense")
broadcast_q = pytest.importorskip("jagflash.variants.broadcast_q")

pytestmark = pytest.mark.gpu

RUNS = 100


def _lognormal(n: int, seed: int, cap: int = 700) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.clamp(torch.exp(torch.randn(n, generator=gen) + 4.5), 0, cap).long().tolist()


def _jagged(causal: bool):
    lens = _lognormal(12, 3)
    t = make_jagged(lens, lens, 8, 2, 128, torch.bfloat16, "cuda", requires_grad=True)
    args = (t["q"], t["k"], t["v"], t["q_offsets"], t["kv_offsets"])
    return jagged.SPEC, "jagged", args, lambda *a, **kw: jagged.jagged_attention(*a, causal=causal, **kw)


def _dense(causal: bool):
    t = make_dense(3, 333, 333, 8, 2, 128, torch.bfloat16, "cuda", requires_grad=True)
    return dense.SPEC, "dense", (t["q"], t["k"], t["v"]), lambda *a, **kw: dense.dense_attention(*a, causal=causal, **kw)


def _broadcast_q(causal: bool):
    if causal:
        pytest.skip("broadcast-Q has no causal mask (docs/semantics.md)")
    lens = _lognormal(10, 5)
    t = make_jagged(lens, lens, 8, 2, 128, torch.bfloat16, "cuda", requires_grad=True)
    q = torch.randn(77, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return broadcast_q.SPEC, "broadcast_q", (q, t["k"], t["v"], t["kv_offsets"]), broadcast_q.broadcast_q_attention


VARIANTS = {"jagged": _jagged, "dense": _dense, "broadcast_q": _broadcast_q}


def _dout(out: torch.Tensor) -> torch.Tensor:
    """A fixed, varied output gradient."""
    return torch.cos(torch.arange(out.numel(), device=out.device, dtype=torch.float32)).view_as(out).to(out.dtype)


def _call(run, args, backend):
    """One forward and backward from scratch: ``[out, lse, grads of the floating inputs]``."""
    out, lse = run(*args, return_lse=True, deterministic=True, backend=backend)
    leaves = [a for a in args if a.is_floating_point()]
    return [out.detach(), lse, *torch.autograd.grad(out, leaves, _dout(out))]


@pytest.mark.parametrize("backend", ["tlx-sm90", "portable"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_deterministic_is_bitwise_repeatable(variant: str, causal: bool, backend: str) -> None:
    spec, layout, args, run = VARIANTS[variant](causal)
    q, k = args[0], args[1]
    feats = {"causal": causal}
    require(spec, make_problem(layout, q, k, **feats, return_lse=True, backward=True, deterministic=True), backend)
    first = _call(run, args, backend)
    for i in range(1, RUNS):
        again = _call(run, args, backend)
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"run {i}: {name} differs from run 0"


#: The device memory this process may use while it provokes an out-of-memory (the allocator's
#: cap, so the test spends no memory that other test processes on the GPU need).
CAP_BYTES = 12 << 30


def _huge_call(jagged_attention) -> None:
    """A causal jagged call (sequences of 512) whose q, k, v take 60 % of the memory left under
    :data:`CAP_BYTES`: its forward fits, its backward's buffers do not."""
    free = CAP_BYTES - torch.cuda.memory_reserved()
    rows = int(free // 5 // (16 * 128 * 2)) // 512 * 512
    big = [torch.empty(rows, 16, 128, device="cuda", dtype=torch.bfloat16).normal_().requires_grad_() for _ in range(3)]
    offs = torch.arange(0, rows + 1, 512, device="cuda", dtype=torch.int32)
    out = jagged_attention(*big, offs, offs, causal=True)
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()


def test_out_of_memory_leaves_the_next_call_correct() -> None:
    """A jagged call too big for the device raises torch's OutOfMemoryError; a smaller call
    afterwards (same process, same kernels, same plan cache) matches the reference, and a repeat
    of a call made before the failure gives the same bits."""
    from jagflash.core.tolerance import assert_close_all
    from jagflash.testing import jagged_reference, reference_grads
    jagged_attention = jagged.jagged_attention
    lens = _lognormal(9, 11)
    small = make_jagged(lens, lens, 4, 4, 128, torch.bfloat16, "cuda", requires_grad=True)
    args = (small["q"], small["k"], small["v"], small["q_offsets"], small["kv_offsets"])
    before = _call(lambda *a, **kw: jagged_attention(*a, causal=True, **kw), args, None)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(CAP_BYTES / total)
    try:
        with pytest.raises(torch.OutOfMemoryError) as failed:
            _huge_call(jagged_attention)
        del failed  # its traceback holds the failed call's frames, and so its tensors
        gc.collect()
        torch.cuda.empty_cache()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    after = _call(lambda *a, **kw: jagged_attention(*a, causal=True, **kw), args, None)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), before, after):
        assert torch.equal(a, b), f"{name} changed after the out-of-memory call"
    dout = _dout(after[0])
    leaves = [t.detach() for t in args[:3]]
    extra = [small["q_offsets"], small["kv_offsets"]]
    ref_out, ref_grads = reference_grads(jagged_reference, [*leaves, *extra], dout, torch.float64, causal=True)
    low_out, low_grads = reference_grads(jagged_reference, [*leaves, *extra], dout, torch.bfloat16, causal=True)
    assert_close_all(
        ["out", "dq", "dk", "dv"], [after[0], *after[2:]], [ref_out, *ref_grads], [low_out, *low_grads],
        atol=jagged.SPEC.atol[torch.bfloat16],
    )
