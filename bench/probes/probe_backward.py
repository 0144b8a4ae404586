"""Probe (H200): the TLX one-pass backward (dQ added from every kv-tile, by fp32 atomics or by
staged TMA reduce-adds) against the deterministic two-pass one (portable dQ pass + TLX dK/dV
pass), kernels alone, on the bench's workloads ``jagged-lognormal-d128`` and
``dense-b4h16n4096d128`` (bf16, H16, D128, causal and not) and ``jagged-lognormal-d64`` (where the
one pass computes whole dQ rows on alternate steps, ``tlx_attention.dq_cols``; timed beside the
portable backward, which the variants ran at D 64 until session 8). Inputs are the bench's
(``jagflash.bench.data.make_batch``); until session 10 (2026-12-01) the probe drew its own lengths
with a torch generator (same distributions, other draws): older figures are on other batches.

Run on the GPU: ``python bench/probes/probe_backward.py [--quick]`` (gpu.sh:
``PROBE=bench/probes/probe_backward.py``); ``--quick``: the lognormal batch only.
Prints ms (median of do_bench) and TFLOP/s with the FlashAttention convention (backward = 2.5 x
the forward's 4 * sum(Lq * Lk) * D * H over visible pairs), and the largest difference between
the two modes' gradients. A/B: the one pass walking its table in the order a call does not get
by default (``tlx_attention.default_walk``: the head walk unmasked, the slot walk causal), and
on a dynamic plan (cost-sorted table, atomic tile counter) in both walks."""

from __future__ import annotations

import argparse
import functools

from triton.testing import do_bench

from jagflash.bench.data import make_batch
from jagflash.bench.flops import bwd_flops, fwd_flops
from jagflash.bench.workloads import get
from jagflash.core import tlx_attention
from jagflash.core.schedule import make_plan as make_core_plan
from jagflash.variants.jagged import jagged_attention, kernels_portable, make_plan

#: Printed name -> bench workload (its lengths, heads and head dim; both masks run on each).
BATCHES = {
    "lognormal128": "jagged-lognormal-d128",
    "dense4x4096": "dense-b4h16n4096d128",
    "lognormal d64": "jagged-lognormal-d64",
}


def _case(name: str, causal: bool) -> None:
    w = get(BATCHES[name])
    b = make_batch(w, "cuda")
    q, k, v = (t.requires_grad_() for t in (b.q, b.k, b.v))
    dout, offs, total = b.dout, b.q_offsets, b.total_q
    heads, dim = w.heads, w.head_dim
    right = 0 if causal else -1
    scale = dim**-0.5
    flops = bwd_flops(fwd_flops(b.q_lens, b.kv_lens, heads=heads, head_dim=dim, causal=causal))
    plan = make_plan(q, k, offs, offs, causal=causal)
    out, lse = jagged_attention(q, k, v, offs, offs, causal=causal, plan=plan, return_lse=True)
    qd, kd, vd, od = (t.detach() for t in (q, k, v, out))

    # The one pass steps 64 queries whatever the variant's plan for this call steps.
    one_pass_plan = make_core_plan(
        offs, offs, total_q=total, total_kv=total, heads_q=heads, heads_kv=heads, window=(-1, right),
        block_m=tlx_attention.BLOCK_M, block_n=tlx_attention.BLOCK_N,
        dkdv_blocks=(tlx_attention.ONE_PASS_BLOCK_M, 128), backward=True,
    )

    dynamic_plan = make_core_plan(
        offs, offs, total_q=total, total_kv=total, heads_q=heads, heads_kv=heads, window=(-1, right),
        block_m=tlx_attention.BLOCK_M, block_n=tlx_attention.BLOCK_N,
        dkdv_blocks=(tlx_attention.ONE_PASS_BLOCK_M, 128), backward=True, schedule="dynamic",
    )

    def fused(dq_write, walk=None, dynamic=False):
        return tlx_attention.backward(
            dout, qd, kd, vd, od, lse, offs, offs, left=-1, right=right, scale=scale,
            plan=dynamic_plan if dynamic else one_pass_plan, dq_write=dq_write, walk=walk,
        )

    def split():
        dq, delta = kernels_portable.backward_dq(
            dout,
            qd,
            kd,
            vd,
            od,
            lse,
            offs,
            offs,
            plan,
            left=-1,
            right=right,
            scale=scale,
            backend="portable",
        )
        dk, dv = tlx_attention.backward_dkdv(
            dout, qd, kd, vd, lse, delta, offs, offs, left=-1, right=right, scale=scale,
            plan=plan,
        )
        return dq, dk, dv

    ref = split()
    delta = kernels_portable.backward_dq(
        dout, qd, kd, vd, od, lse, offs, offs, plan, left=-1, right=right, scale=scale, backend="portable"
    )[1]

    def dkdv_alone():
        # The one pass's kernel without dQ (its 64-query steps, its plan): what the dQ costs.
        # The diff column compares its dK, dV (dQ is the reference's, not computed here).
        dk, dv = tlx_attention.backward_dkdv(
            dout, qd, kd, vd, lse, delta, offs, offs, left=-1, right=right, scale=scale, plan=one_pass_plan
        )
        return ref[0], dk, dv

    other_walk = "slot" if tlx_attention.default_walk(-1, right) == "head" else "head"
    runs = {
        "kernels: one pass, atomic dQ": functools.partial(fused, "atomic"),
        "kernels: two pass (determ.)": split,
        "kernels: one pass, TMA dQ": functools.partial(fused, "tma"),
        f"kernels: one pass, {other_walk} walk": functools.partial(fused, "tma", other_walk),
        "kernels: one pass, dynamic slot": functools.partial(fused, "tma", "slot", True),
        "kernels: one pass, dynamic head": functools.partial(fused, "tma", "head", True),
    }
    if tlx_attention.tlx_sm90_blocks(dim)["dkdv"][0] == tlx_attention.ONE_PASS_BLOCK_M:
        runs["kernels: dK/dV alone, no dQ"] = dkdv_alone
    if dim == 64:  # what the variants ran there until session 8
        runs["kernels: portable backward"] = functools.partial(
            kernels_portable.backward, dout, qd, kd, vd, od, lse, offs, offs, plan, left=-1,
            right=right, scale=scale, backend="portable",
        )
    for mode, run in runs.items():
        got = run()
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, ref))
        ms = do_bench(run, warmup=10, rep=200, return_mode="median")
        f = flops * (1.4 if mode.startswith("public") else 1.0)  # fwd + bwd = 3.5 x fwd
        print(
            f"{name:14s} {causal!s:6s} {mode:30s} {ms:8.3f} {f / ms / 1e9:8.1f} {diff:10.2e}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the lognormal batch only")
    args = parser.parse_args(argv)
    print(
        f"{'batch':14s} {'causal':6s} {'mode':30s} {'ms':>8s} {'TFLOP/s':>8s} {'max|diff|':>10s}",
        flush=True,
    )
    for name in ("lognormal128",) if args.quick else BATCHES:
        for causal in (False, True):
            _case(name, causal)


if __name__ == "__main__":
    main()
