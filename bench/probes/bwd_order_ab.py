"""Probe (H200; issue 22): the one-pass TLX backward on a bench workload's batch under each
backward schedule of its plan (the order and deal of the dK/dV pass's kv-tiles), in one
process on the same inputs; or the TLX forward under each forward schedule (``--kernel fwd``:
its q-tiles' order and deal; outputs bitwise the first schedule's).

    python bench/probes/bwd_order_ab.py [--workloads bs-lognormal-d25] [--schedules dynamic,grouped,none]
    python bench/probes/bwd_order_ab.py --kernel fwd --schedules dynamic,dynamic-grouped

The one pass adds every kv-tile's share of dQ into an fp32 accumulator that, on a batch of
many sequences, does not fit in L2 (bench/NOTES.md, session 25: the kernel is DRAM-bound). The
schedules differ in which tiles run at the same time: ``dynamic`` claims them in cost order
(a sequence's kv-tiles spread over the pass), ``grouped`` keeps a sequence's tiles together
(dealt in turn to the programs, so they run side by side and add into the same rows), ``none``
walks the batch in order, ``dynamic-grouped`` takes grouped's table from the atomic counter
(the one pass's default where ``jagflash.core.tuning.grouped_backward`` says so). For each schedule: the backward's median (``measure``, L2 flushed;
the per-token passes included), and dK, dV against the first schedule's (bitwise: the order
only moves when each tile runs) and dQ (to rounding). Rows: ``workload, schedule, dynamic,
zigzag, head_major, ms_p50, TFLOP/s`` (the FlashAttention convention, listed pairs of a block
mask).
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch

#: The batches timed by default: the block-sparse lognormal row and its dense twin.
DEFAULT_WORKLOADS = ("bs-lognormal-d25", "jagged-lognormal-causal-d128")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--schedules", default="dynamic,grouped,none")
    ap.add_argument("--kernel", choices=("bwd", "fwd"), default="bwd")
    args = ap.parse_args(argv)

    from jagflash.bench.data import make_batch
    from jagflash.bench.flops import block_mask_pairs, visible_pairs
    from jagflash.bench.sparsity import make_block_mask
    from jagflash.bench.workloads import get
    from jagflash.core.plan.build import make_plan
    from jagflash.core.tlx import bwd_sm90, fwd_sm90
    from jagflash.core.tuning import plan_blocks

    dev = torch.device("cuda")
    print("workload,schedule,dynamic,zigzag,head_major,ms_p50,tflops")
    for name in args.workloads.split(","):
        w = get(name)
        b = make_batch(w, dev)
        q, k, v, qo, ko = b.q, b.k, b.v, b.q_offsets, b.kv_offsets
        m = None if w.blocks is None else make_block_mask(w.blocks, b.q_lens, b.kv_lens, w.causal, qo, ko)
        hq, hkv, dim = q.shape[1], k.shape[1], q.shape[2]
        left, right = (-1, 0) if w.causal else (-1, -1)
        kw = {"left": left, "right": right, "scale": dim**-0.5, "blocks": m}
        pairs = visible_pairs(b.q_lens, b.kv_lens, w.causal) * hq if m is None else block_mask_pairs(m, hq, w.causal)
        blocks = plan_blocks("tlx-sm90", dim, None if m is None else m.block_size)
        if args.kernel == "fwd":
            if _forward_rows(name, b, m, blocks, args.schedules.split(","), kw, 4 * dim * pairs, dev):
                return 1
            continue
        out, lse = fwd_sm90.forward(q, k, v, qo, ko, b.max_q, **kw)
        first = None
        for schedule in args.schedules.split(","):
            plan = make_plan(
                qo, ko, total_q=q.shape[0], total_kv=k.shape[0], heads_q=hq, heads_kv=hkv, window=(left, right),
                block_m=blocks["fwd"][0], block_n=blocks["fwd"][1], dkdv_blocks=blocks["dkdv"], backward=True,
                schedule="dynamic", backward_schedule=schedule, block_mask=m,
            )
            config = bwd_sm90.dkdv_config(plan, q, k, left=left, right=right, q_shared=False, fused_dq=True, blocks=m)
            bwd = functools.partial(bwd_sm90.backward, b.dout, q, k, v, out, lse, qo, ko, plan=plan, config=config, **kw)
            grads = _timed_row(name, schedule, config, bwd, 2.5 * 4 * dim * pairs, dev)
            if first is None:
                first = grads
                continue
            same = torch.equal(first[1], grads[1]) and torch.equal(first[2], grads[2])
            dq_diff = (first[0].float() - grads[0].float()).abs().max().item()
            print(f"# {name} {schedule}: dK, dV bitwise the first schedule's: {same}; max |dQ diff| {dq_diff:.3g}",
                  file=sys.stderr, flush=True)
            if not same:
                return 1
    return 0


def _timed_row(name, schedule, config, call, flops, dev):
    """Run ``call`` once (its result returned), time it (``measure``'s median) and print its
    row, ``flops`` the FlashAttention count of one call."""
    from jagflash.bench.timing import measure

    result = call()
    ms = measure(call, dev).p50
    print(f"{name},{schedule},{int(config.DYNAMIC)},{int(config.ZIGZAG)},{int(config.HEAD_MAJOR)},{ms:.4f},"
          f"{flops / ms * 1e-9:.1f}", flush=True)
    return result


def _forward_rows(name, b, m, blocks, schedules, kw, flops, dev) -> bool:
    """The forward's rows of one workload (``--kernel fwd``); True where an output differs."""
    from jagflash.core.plan.build import make_plan
    from jagflash.core.tlx import fwd_sm90

    q, k, v, qo, ko = b.q, b.k, b.v, b.q_offsets, b.kv_offsets
    first = None
    for schedule in schedules:
        plan = make_plan(
            qo, ko, total_q=q.shape[0], total_kv=k.shape[0], heads_q=q.shape[1], heads_kv=k.shape[1],
            window=(kw["left"], kw["right"]), block_m=blocks["fwd"][0], block_n=blocks["fwd"][1], max_seqlen_q=b.max_q,
            backward=False, schedule=schedule, block_mask=m,
        )
        _, config = fwd_sm90.plan_and_config(q, k, qo, ko, b.max_q, plan=plan, **kw)
        fwd = functools.partial(fwd_sm90.forward, q, k, v, qo, ko, b.max_q, plan=plan, config=config, **kw)
        outs = _timed_row(name, schedule, config, fwd, flops, dev)
        if first is None:
            first = outs
            continue
        same = all(torch.equal(x, y) for x, y in zip(first, outs))
        print(f"# {name} fwd {schedule}: outputs bitwise the first schedule's: {same}", file=sys.stderr, flush=True)
        if not same:
            return True
    return False


if __name__ == "__main__":
    raise SystemExit(main())
