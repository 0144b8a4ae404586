"""The TLX (Hopper) kernels against the fp64 reference: the forward's two consumer versions
under each schedule, the one-pass backward (dQ added from every kv-tile by TMA reduce-adds or atomics), the
dK/dV pass of the two-pass backward, and the tlx-sm90 backend through the public functions
(forward and backward, bitwise-repeatable backward; dense: variants/dense/tests). Needs an
sm_90 GPU and TLX."""

from __future__ import annotations

import pytest
import torch

from jagflash.core.mask import mask_bounds
from jagflash.testing import JaggedCase, check_against_reference, jagged_reference
from jagflash.variants.jagged import SPEC

pytestmark = pytest.mark.sm90


def _forward(causal: bool, schedule: str, sign: float = 1.0, **free):
    """The TLX forward on a plan of ``schedule``; ``free``: FwdConfig fields forced other than the
    policy picks them (``jagflash.core.tuning.FREE_FIELDS``)."""
    import dataclasses

    from jagflash.core.plan.build import make_plan
    from jagflash.core.tile_scheduler import deal_flags
    from jagflash.core.tlx import fwd_sm90
    from jagflash.core.tuning import forced_ring, fwd_config

    left, right = mask_bounds(causal)

    def run(q, k, v, q_offsets, kv_offsets):
        max_q = int((q_offsets[1:] - q_offsets[:-1]).max()) if q_offsets.numel() > 1 else 0
        plan = make_plan(
            q_offsets, kv_offsets, total_q=q.shape[0], total_kv=k.shape[0], heads_q=q.shape[1],
            heads_kv=k.shape[1], causal=causal, block_m=128, block_n=128, schedule=schedule, backward=False,
        )
        scale = sign * q.shape[-1] ** -0.5
        config = None
        if free:
            dynamic, zigzag = deal_flags(plan.info, "fwd")
            config = fwd_config(
                head_dim=q.shape[-1], group=q.shape[1] // k.shape[1], left=left, right=right, q_shared=False,
                scale=scale, dynamic=dynamic, zigzag=zigzag, total_kv=k.shape[0], batch=q_offsets.numel() - 1,
            )
            if "RING_TILES" in free:  # (the fields that ride on the ring follow it, unless forced too)
                config = forced_ring(config, free["RING_TILES"])
            config = dataclasses.replace(config, **free)
        return fwd_sm90.forward(q, k, v, q_offsets, kv_offsets, max_q, left=left, right=right, scale=scale, plan=plan, config=config)

    return run


def _forced_backward(plan, q, k, left, right, *, fused: bool, head_major: bool, ring: bool = False):
    """A BwdConfig for ``plan``'s dK/dV pass with the walk (``HEAD_MAJOR``) and the tile hand-off
    (``RING_TILES``) forced."""
    import dataclasses

    from jagflash.core.tlx import bwd_sm90
    from jagflash.core.tuning import forced_ring

    cfg = bwd_sm90.dkdv_config(plan, q, k, left=left, right=right, q_shared=False, fused_dq=fused)
    return dataclasses.replace(forced_ring(cfg, ring), HEAD_MAJOR=head_major)


def _reference(causal: bool, sign: float = 1.0):
    def run(q, k, v, q_offsets, kv_offsets, dtype):
        scale = sign * q.shape[-1] ** -0.5
        return jagged_reference(q, k, v, q_offsets, kv_offsets, causal=causal, scale=scale, dtype=dtype)

    return run


def _lognormal(n: int, seed: int, cap: int = 1500) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.clamp(torch.exp(torch.randn(n, generator=gen) + 5.0), 1, cap).long().tolist())


CASES = {
    "odd_lengths": ((0, 1, 37, 128, 129, 300, 0, 64), None, 8, 2),
    "cross_lq_lt_lk": ((5, 40, 200), (40, 70, 450), 4, 4),
    "cross_lq_gt_lk": ((70, 300), (40, 9), 4, 1),  # rows that see no key
    "lognormal": (_lognormal(24, 0), None, 8, 2),
}


# The static schedule at every dtype and head dim; the batch-order table ("none") and the atomic
# tile counter ("dynamic") at bf16 only (what they change does not depend on the dtype).
FORWARD_VARIANTS = [
    *((dtype, dim, "static") for dtype in (torch.bfloat16, torch.float16) for dim in (64, 128)),
    (torch.bfloat16, 64, "dynamic"),
    (torch.bfloat16, 128, "none"),
    (torch.bfloat16, 128, "dynamic"),
]


@pytest.mark.parametrize(("dtype", "head_dim", "schedule"), FORWARD_VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", CASES)
def test_tlx_forward_matches_reference(name, causal, head_dim, dtype, schedule) -> None:
    q_lens, k_lens, hq, hkv = CASES[name]
    case = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=head_dim, dtype=dtype, causal=causal)
    t = case.build("cuda", requires_grad=False)
    t.pop("dout")
    check_against_reference(_forward(causal, schedule), _reference(causal), t, atol=SPEC.atol[dtype])


@pytest.mark.parametrize("schedule", ["static", "none", "dynamic"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["odd_lengths", "lognormal"])
def test_tlx_forward_other_walk_matches_reference(name, causal, schedule) -> None:
    """The walk a call does not get by default (``tuning.default_head_major``): every tile is
    still computed once (GQA, zero-length sequences, a padded table)."""
    q_lens, k_lens, hq, hkv = CASES[name]
    case = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=128, dtype=torch.bfloat16, causal=causal)
    t = case.build("cuda", requires_grad=False)
    t.pop("dout")
    from jagflash.core.tuning import default_head_major

    left, right = mask_bounds(causal)
    other = not default_head_major(left, right, schedule == "dynamic")
    check_against_reference(_forward(causal, schedule, HEAD_MAJOR=other), _reference(causal), t, atol=SPEC.atol[torch.bfloat16])


@pytest.mark.parametrize(("ring_tiles", "schedule"), [(False, "dynamic"), (True, "dynamic"), (True, "static")])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["odd_lengths", "lognormal"])
def test_tlx_forward_tile_ring_on_and_off_match_reference(name, causal, ring_tiles, schedule) -> None:
    """``RING_TILES`` forced on or off (on: the producer walks the table alone and passes each
    decoded tile to the consumers through shared memory, on a dynamic or a static plan; the
    walk's end is a tile marked so; by default only batches of short K/V sequences take it, as
    odd_lengths does): every tile computed once, in order."""
    q_lens, k_lens, hq, hkv = CASES[name]
    case = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=128, dtype=torch.bfloat16, causal=causal)
    t = case.build("cuda", requires_grad=False)
    t.pop("dout")
    check_against_reference(_forward(causal, schedule, RING_TILES=ring_tiles), _reference(causal), t, atol=SPEC.atol[torch.bfloat16])


@pytest.mark.parametrize(
    ("num_kv", "q_bufs", "stage_o", "tma_o"), [(2, 2, True, False), (3, 1, True, False), (2, 2, False, False), (2, 2, True, True), (3, 1, True, True)]
)
@pytest.mark.parametrize("ring_tiles", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["odd_lengths", "cross_lq_gt_lk", "lognormal"])
def test_tlx_forward_ring_depths_and_o_store_match_reference(name, causal, ring_tiles, num_kv, q_bufs, stage_o, tma_o) -> None:
    """The K/V ring's depth, the Q tiles in flight and O stored through the Q slot
    (``STAGE_O``: the tiles with no block to visit store zeros of their own; with ``TMA_O`` the
    halves inside their sequence by TMA, the others by masked stores), each forced on a batch
    that walks the tiles through the ring or not (by default causal batches without the ring
    take three slots, one Q tile and ``STAGE_O``; the others two and two)."""
    q_lens, k_lens, hq, hkv = CASES[name]
    case = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=128, dtype=torch.bfloat16, causal=causal)
    t = case.build("cuda", requires_grad=False)
    t.pop("dout")
    run = _forward(causal, "dynamic", RING_TILES=ring_tiles, NUM_KV=num_kv, Q_BUFS=q_bufs, STAGE_O=stage_o, TMA_O=tma_o)
    check_against_reference(run, _reference(causal), t, atol=SPEC.atol[torch.bfloat16])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["odd_lengths", "cross_lq_gt_lk"])
def test_tlx_forward_zero_empty_matches_reference(name, causal) -> None:
    """With the tile ring, the producer itself writes O 0 and LSE -inf for the tiles whose rows
    see no key (``ZERO_EMPTY``: causal cross lengths leave whole tiles so, sequences without
    keys too) and hands the consumers only the others."""
    q_lens, k_lens, hq, hkv = CASES[name]
    case = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=128, dtype=torch.bfloat16, causal=causal)
    t = case.build("cuda", requires_grad=False)
    t.pop("dout")
    check_against_reference(_forward(causal, "dynamic", RING_TILES=True, ZERO_EMPTY=True), _reference(causal), t, atol=SPEC.atol[torch.bfloat16])


@pytest.mark.parametrize("q_bufs", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["odd_lengths", "lognormal"])
def test_tlx_forward_hold_record_matches_reference(name, causal, q_bufs) -> None:
    """With the tile ring, the consumers keep each tile's record (a three-deep record ring) and
    read its fields again after the main loop (``HOLD_RECORD``), with one Q tile in flight or two
    (the producer publishes the next record while the consumers may still hold the one before)."""
    q_lens, k_lens, hq, hkv = CASES[name]
    case = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=128, dtype=torch.bfloat16, causal=causal)
    t = case.build("cuda", requires_grad=False)
    t.pop("dout")
    run = _forward(causal, "dynamic", RING_TILES=True, HOLD_RECORD=True, Q_BUFS=q_bufs, NUM_KV=3 if q_bufs == 1 else 2, STAGE_O=q_bufs == 1)
    check_against_reference(run, _reference(causal), t, atol=SPEC.atol[torch.bfloat16])


@pytest.mark.parametrize(("stage_o", "tma_o"), [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["odd_lengths", "cross_lq_lt_lk", "cross_lq_gt_lk", "lognormal"])
def test_tlx_forward_solo_matches_reference(name, causal, stage_o, tma_o) -> None:
    """``SOLO``: one consumer warpgroup takes both halves of each tile in turn, each over its own
    kv range in 64-key steps, two programs an SM (launched with 128 registers a thread); with O
    through the Q slot or not, by TMA or not. Halves past a sequence's end, halves with no key
    (cross lengths) and tiles of one step are in these batches."""
    q_lens, k_lens, hq, hkv = CASES[name]
    case = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=128, dtype=torch.bfloat16, causal=causal)
    t = case.build("cuda", requires_grad=False)
    t.pop("dout")
    run = _forward(causal, "dynamic", RING_TILES=True, HOLD_RECORD=True, SOLO=True, Q_BUFS=1, NUM_KV=2, STAGE_O=stage_o, TMA_O=tma_o)
    check_against_reference(run, _reference(causal), t, atol=SPEC.atol[torch.bfloat16])


@pytest.mark.parametrize("causal", [False, True])
def test_tlx_forward_idle_halves_match_reference(causal) -> None:
    """A consumer whose 64 rows of a q-tile all lie past the sequence's end issues no matmul:
    lengths on each side of 64 and 128 give tiles with one idle half and tiles with none."""
    lens = (1, 37, 64, 65, 128, 129, 191, 192, 193, 300)
    case = JaggedCase(lens, lens, hq=4, hkv=2, head_dim=128, dtype=torch.bfloat16, causal=causal)
    t = case.build("cuda", requires_grad=False)
    t.pop("dout")
    check_against_reference(_forward(causal, "dynamic"), _reference(causal), t, atol=SPEC.atol[torch.bfloat16])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["odd_lengths", "cross_lq_gt_lk"])
def test_tlx_forward_negative_scale_matches_reference(name, causal) -> None:
    """A negative scale cannot ride in the exponent (the running max is taken on the scaled
    scores): the kernel then scales the scores first (``FOLD_SCALE`` off)."""
    q_lens, k_lens, hq, hkv = CASES[name]
    case = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=128, dtype=torch.bfloat16, causal=causal)
    t = case.build("cuda", requires_grad=False)
    t.pop("dout")
    check_against_reference(_forward(causal, "static", -1.0), _reference(causal, -1.0), t, atol=SPEC.atol[torch.bfloat16])


@pytest.mark.parametrize("causal", [False, True])
def test_tlx_backend_is_the_default_forward_and_backward(causal) -> None:
    """No backend= on an H200: the TLX forward, then the TLX backward (portable dQ pass + TLX
    dK/dV pass), on the plan the call lays out for them."""
    from jagflash.core.backend import last_choice
    from jagflash.variants.jagged import jagged_attention

    lens = (*_lognormal(16, 1), 0)
    case = JaggedCase(lens, lens, hq=8, hkv=2, head_dim=128, dtype=torch.bfloat16, causal=causal)
    t = case.build("cuda")
    dout = t.pop("dout")

    def kernel(q, k, v, q_offsets, kv_offsets):
        out = jagged_attention(q, k, v, q_offsets, kv_offsets, causal=causal, return_lse=True)
        assert last_choice("jagged").name == "tlx-sm90"
        return out

    check_against_reference(kernel, _reference(causal), t, atol=SPEC.atol[torch.bfloat16], dout=dout)
    assert last_choice("jagged").name == "tlx-sm90"


@pytest.mark.parametrize("causal", [False, True])
def test_tlx_policy_solo_on_short_batches_matches_reference(causal) -> None:
    """The policy's ``SOLO`` (``tuning.default_solo``: short K/V sequences, D 128, a tile for each
    of two programs an SM) through the public call, forward and backward: 600 sequences of 0 to
    70 keys, GQA; the forward config the call runs is checked to be ``SOLO``
    (windows: the sliding-window variant's GPU tests)."""
    from jagflash.core.tlx import fwd_sm90
    from jagflash.variants.jagged import jagged_attention

    gen = torch.Generator().manual_seed(7)
    lens = tuple(torch.randint(0, 71, (600,), generator=gen).tolist())
    t = JaggedCase(lens, lens, hq=4, hkv=2, head_dim=128, dtype=torch.bfloat16, causal=causal).build("cuda")
    dout = t.pop("dout")
    _, config = fwd_sm90.plan_and_config(t["q"], t["k"], t["q_offsets"], t["kv_offsets"], max(lens), left=-1, right=0 if causal else -1, scale=0.1)
    assert (config.SOLO, config.RING_TILES, config.Q_BUFS) == (True, True, 1)

    def kernel(q, k, v, q_offsets, kv_offsets):
        return jagged_attention(q, k, v, q_offsets, kv_offsets, causal=causal, return_lse=True)

    check_against_reference(kernel, _reference(causal), t, atol=SPEC.atol[torch.bfloat16], dout=dout)


def test_tlx_deterministic_backward_is_bitwise_repeatable() -> None:
    """deterministic=True: 100 backward runs of one causal GQA batch give the same bits (no
    atomics or reduce-adds anywhere)."""
    from jagflash.variants.jagged import jagged_attention, make_plan

    lens = _lognormal(12, 3)
    t = JaggedCase(lens, lens, hq=8, hkv=2, head_dim=128, dtype=torch.bfloat16, causal=True).build("cuda")
    q, k, v, qo, ko, dout = (t[n] for n in ("q", "k", "v", "q_offsets", "kv_offsets", "dout"))
    plan = make_plan(q, k, qo, ko, causal=True)
    out = jagged_attention(q, k, v, qo, ko, causal=True, plan=plan, deterministic=True)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    for _ in range(99):
        again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["odd_lengths", "cross_lq_lt_lk", "cross_lq_gt_lk", "lognormal"])
def test_tlx_dkdv_matches_reference(name, causal, head_dim) -> None:
    """The TLX dK/dV pass alone against autograd through the reference, given the reference's
    LSE and delta."""
    from jagflash.core.tlx import bwd_sm90
    from jagflash.core.tolerance import assert_close_all

    q_lens, k_lens, hq, hkv = CASES[name]
    case = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=head_dim, dtype=torch.bfloat16, causal=causal)
    t = case.build("cuda", requires_grad=False)
    q, k, v, qo, ko, dout = (t[n] for n in ("q", "k", "v", "q_offsets", "kv_offsets", "dout"))
    scale = head_dim**-0.5
    grads = {}
    for dtype in (torch.float64, torch.bfloat16):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        out, lse = jagged_reference(*leaves, qo, ko, causal=causal, dtype=dtype)
        grads[dtype] = torch.autograd.grad(out, leaves[1:], dout.to(dtype))
        if dtype == torch.float64:
            lse32 = lse.float()
            delta = (out.detach().double() * dout.double()).sum(-1).transpose(0, 1).float().contiguous()
    left, right = mask_bounds(causal)
    dk, dv = bwd_sm90.backward_dkdv(dout, q, k, v, lse32, delta, qo, ko, left=left, right=right, scale=scale)
    assert_close_all(["dk", "dv"], [dk, dv], grads[torch.float64], grads[torch.bfloat16], SPEC.atol[torch.bfloat16])


def _reference_grads(t, causal):
    """(LSE, dQ, dK, dV) of the fp64 reference and (dQ, dK, dV) of the bf16 one."""
    q, k, v, qo, ko, dout = (t[n] for n in ("q", "k", "v", "q_offsets", "kv_offsets", "dout"))
    grads = {}
    for dtype in (torch.float64, torch.bfloat16):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        out, lse = jagged_reference(*leaves, qo, ko, causal=causal, dtype=dtype)
        grads[dtype] = torch.autograd.grad(out, leaves, dout.to(dtype))
        if dtype == torch.float64:
            ref_out, ref_lse = out.detach(), lse.float()
    return ref_out, ref_lse, grads[torch.float64], grads[torch.bfloat16]


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["odd_lengths", "cross_lq_lt_lk", "cross_lq_gt_lk", "lognormal"])
def test_tlx_fused_backward_matches_reference(name, causal, head_dim) -> None:
    """The one-pass TLX backward (per-query preprocess, dK/dV with dQ reduce-added from every
    kv-tile) against autograd through the reference, given the reference's O and LSE; GQA,
    zero-length sequences, Lq != Lk, rows that see no key, tiles past a sequence's end. D 128
    (each warpgroup writes half of dQ's columns every step) and D 64 (whole rows, the two
    warpgroups taking alternate steps)."""
    from jagflash.core.tlx import bwd_sm90
    from jagflash.core.tolerance import assert_close_all

    q_lens, k_lens, hq, hkv = CASES[name]
    case = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=head_dim, dtype=torch.bfloat16, causal=causal)
    t = case.build("cuda", requires_grad=False)
    q, k, v, qo, ko, dout = (t[n] for n in ("q", "k", "v", "q_offsets", "kv_offsets", "dout"))
    ref_out, lse32, exact, low = _reference_grads(t, causal)
    left, right = mask_bounds(causal)
    got = bwd_sm90.backward(
        dout, q, k, v, ref_out.to(q.dtype), lse32, qo, ko, left=left, right=right, scale=head_dim**-0.5,
    )
    assert_close_all(["dq", "dk", "dv"], list(got), exact, low, SPEC.atol[torch.bfloat16])


def _one_pass_against_its_base(name, causal, base, field, value) -> None:
    """The one-pass backward with ``field`` = ``value`` over ``base(policy config)`` on a
    dynamic-grouped plan of CASES[name] (bf16, D 128): dQ, dK, dV against the reference; dK and
    dV bitwise those of ``base`` with ``field`` 0, dQ to rounding. dQ's memory is NaN-poisoned
    before each run (the caching allocator hands dQ the block a NaN tensor of its size just
    freed), so a dQ row the kernel failed to write fails."""
    import dataclasses

    from jagflash.core.plan.build import make_plan
    from jagflash.core.tlx import bwd_sm90
    from jagflash.core.tolerance import assert_close_all

    q_lens, k_lens, hq, hkv = CASES[name]
    case = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=128, dtype=torch.bfloat16, causal=causal)
    t = case.build("cuda", requires_grad=False)
    q, k, v, qo, ko, dout = (t[n] for n in ("q", "k", "v", "q_offsets", "kv_offsets", "dout"))
    ref_out, lse32, exact, low = _reference_grads(t, causal)
    left, right = mask_bounds(causal)
    plan = make_plan(
        qo, ko, total_q=q.shape[0], total_kv=k.shape[0], heads_q=hq, heads_kv=hkv, window=(left, right),
        block_m=128, block_n=128, dkdv_blocks=(64, 128), backward=True, schedule="dynamic",
        backward_schedule="dynamic-grouped",
    )
    want = base(bwd_sm90.dkdv_config(plan, q, k, left=left, right=right, q_shared=False, fused_dq=True))
    kw = {"left": left, "right": right, "scale": 128**-0.5, "plan": plan}
    grads = {}
    for x in (value, 0):
        poison = torch.full_like(q, float("nan"))
        del poison
        grads[x] = bwd_sm90.backward(
            dout, q, k, v, ref_out.to(q.dtype), lse32, qo, ko, config=dataclasses.replace(want, **{field: x}), **kw,
        )
    assert_close_all(["dq", "dk", "dv"], list(grads[value]), exact, low, SPEC.atol[torch.bfloat16])
    assert torch.equal(grads[value][1], grads[0][1])
    assert torch.equal(grads[value][2], grads[0][2])
    torch.testing.assert_close(grads[value][0], grads[0][0], rtol=0, atol=2e-2)


@pytest.mark.parametrize("span", [128, 384, 2048])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["odd_lengths", "cross_lq_lt_lk", "cross_lq_gt_lk", "lognormal"])
def test_tlx_backward_owned_sequences_match_reference(name, causal, span) -> None:
    """``OWN_SPAN`` forced (``jagflash.core.tuning.own_span``): a program takes every kv-tile of
    a sequence of at most ``span`` keys, zeroes its dQ rows, sums them and writes dQ itself,
    while the preprocess and the cast take the other sequences' rows; spans that own some
    sequences of the batch and not others (one kv-tile; three; all), on a dynamic-grouped plan.
    dQ, dK, dV against the reference; dK and dV bitwise those of the same config unowned, dQ to
    rounding. dQ's memory is NaN-poisoned first (the caching allocator hands the one-pass
    backward's dQ the block a NaN tensor of its size just freed), so an owned row the kernel
    failed to write fails."""
    import dataclasses

    _one_pass_against_its_base(name, causal, lambda want: dataclasses.replace(want, RING_TILES=True), "OWN_SPAN", span)


@pytest.mark.parametrize("ring", [False, True], ids=["per_consumer", "ring_owned"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["odd_lengths", "cross_lq_lt_lk", "cross_lq_gt_lk", "lognormal"])
def test_tlx_backward_sole_dq_matches_reference(name, causal, ring) -> None:
    """``SOLE_DQ`` forced: a step whose dQ cell no other kv-tile adds into stores its dQ instead of
    adding it (counted by ``bwd_preprocess.dq_cell_counts``); the preprocess zeroes the
    accumulator of the other cells only and writes the dQ zeros of the cells no kv-tile visits,
    the cast reads the cells of two adds or more only. With the tile ring and the sequences the
    policy owns (their cells left to the owner), and without the ring. dQ, dK, dV against the
    reference; dK and dV bitwise those of the same config without it, dQ to rounding; dQ's memory
    NaN-poisoned first, so a cell no one wrote fails."""
    import dataclasses

    from jagflash.core.tuning import forced_ring

    def base(want):
        return forced_ring(dataclasses.replace(want, OWN_SPAN=want.OWN_SPAN or 256), ring)

    _one_pass_against_its_base(name, causal, base, "SOLE_DQ", True)


@pytest.mark.parametrize("bounds", [(-1, -1), (-1, 0), (100, 0)], ids=["none", "causal", "window"])
def test_tlx_backward_walk_changes_no_dkdv_bit(bounds) -> None:
    """The walk, the deal and the tile hand-off only reorder the kv-tiles or move where their
    fields are read: each tile's dK/dV is computed alone, so the head walk's, a dynamic plan's
    (atomic tile counter, both walks) and the tile ring's (``RING_TILES``, on both deals; with a
    window, kv-tiles that no query sees load nothing) are bitwise the default's; dQ (summed in
    a varying order) agrees to rounding. The one pass, then the two passes' dK/dV; GQA (4 query
    heads a K/V head)."""
    from jagflash.core.plan.build import make_plan
    from jagflash.core.tlx import bwd_sm90

    left, right = bounds
    causal = right == 0
    q_lens, k_lens, hq, hkv = CASES["lognormal"]
    t = JaggedCase(q_lens, k_lens or q_lens, hq=hq, hkv=hkv, head_dim=128, dtype=torch.bfloat16, causal=causal).build("cuda", requires_grad=False)
    q, k, v, qo, ko, dout = (t[n] for n in ("q", "k", "v", "q_offsets", "kv_offsets", "dout"))
    ref_out, lse32, _, _ = _reference_grads(t, causal)  # (any O and LSE serve: the tiles are compared, not the reference)
    out = ref_out.to(q.dtype)
    kw = {"left": left, "right": right, "scale": 128**-0.5}
    dynamic = make_plan(
        qo, ko, total_q=q.shape[0], total_kv=k.shape[0], heads_q=hq, heads_kv=hkv, window=(left, right),
        block_m=128, block_n=128, dkdv_blocks=(64, 128), backward=True, schedule="dynamic",
    )
    static = make_plan(
        qo, ko, total_q=q.shape[0], total_kv=k.shape[0], heads_q=hq, heads_kv=hkv, window=(left, right),
        block_m=128, block_n=128, dkdv_blocks=(64, 128), backward=True, schedule="static",
    )

    def others(fused):
        return {
            f"{deal} {walk}{' ring' if ring else ''}": {
                "plan": plan, "config": _forced_backward(plan, q, k, left, right, fused=fused, head_major=walk == "head", ring=ring),
            }
            for deal, plan in (("static", static), ("dynamic", dynamic)) for walk in ("slot", "head") for ring in (False, True)
        }

    base = bwd_sm90.backward(dout, q, k, v, out, lse32, qo, ko, plan=static, **kw)
    for name, extra in others(True).items():
        got = bwd_sm90.backward(dout, q, k, v, out, lse32, qo, ko, **extra, **kw)
        assert torch.equal(base[1], got[1]), name
        assert torch.equal(base[2], got[2]), name
        torch.testing.assert_close(base[0], got[0], rtol=0, atol=2e-2, msg=name)
    delta = (ref_out.double() * dout.double()).sum(-1).transpose(0, 1).float().contiguous()
    base = bwd_sm90.backward_dkdv(dout, q, k, v, lse32, delta, qo, ko, plan=static, **kw)
    for name, extra in others(False).items():
        got = bwd_sm90.backward_dkdv(dout, q, k, v, lse32, delta, qo, ko, **extra, **kw)
        for a, b in zip(base, got):
            assert torch.equal(a, b), name
