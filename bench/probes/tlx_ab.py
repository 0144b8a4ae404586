"""A/B of the TLX forward's tile orders and options on one GPU (kernels alone, bf16, D128).

Times ``jagflash.core.tlx_attention.forward`` under every order of :data:`ORDERS` (the call's
default; plans of each schedule, grouped / static / dynamic (the atomic tile counter), walked slot
by slot and head by head; the default with one Q tile in flight, with the decoded tile ring forced
on or off, and with the idle half computed) on the bench workloads of :data:`BATCHES`, causal and
not (broadcast-Q unmasked only); checks each output against the default order's and prints ms
(median of do_bench) and TFLOP/s (FLOPs from the real lengths: ``jagflash.bench.flops``).

    python bench/probes/tlx_ab.py                                          # everything
    python bench/probes/tlx_ab.py --batches tiny,gqa4 --orders default-q1  # a subset
    TLX_AB_ARGS="--batches tiny,dense4x4096" bash bench/gpu.sh tlx-ab       # on the H200

Until session 10 (2026-12-01) this A/B was ``python -m jagflash.core.tlx_attention``, which drew
its own lengths with a torch generator (the same distributions, other draws): the tlx-ab figures
in bench/NOTES.md up to then come from those batches, not from the bench's.
"""

from __future__ import annotations

import argparse
import functools

from triton.testing import do_bench

from jagflash.bench.data import make_batch
from jagflash.bench.flops import fwd_flops
from jagflash.bench.workloads import get
from jagflash.core.schedule import make_plan
from jagflash.core.tlx_attention import BLOCK_M, BLOCK_N, forward

#: Every order: ``schedule`` is the plan's (absent: the plan the call builds by default), the
#: other keys are ``tlx_attention.forward``'s keyword arguments (absent: its defaults).
ORDERS: dict[str, dict] = {
    "default": {},
    "grouped-slot": {"schedule": "grouped", "walk": "slot"},
    "grouped-head": {"schedule": "grouped", "walk": "head"},
    "static-slot": {"schedule": "static", "walk": "slot"},
    "static-head": {"schedule": "static", "walk": "head"},
    "dynamic-slot": {"schedule": "dynamic", "walk": "slot"},
    "dynamic-head": {"schedule": "dynamic", "walk": "head"},
    "default-q1": {"q_bufs": 1},
    "default-ring": {"ring_tiles": True},
    "default-noring": {"ring_tiles": False},
    "default-busy": {"idle_half": False},
}

#: Printed name (what ``--batches`` matches) -> bench workload (its lengths, heads, KV heads).
BATCHES = {
    "lognormal128": "jagged-lognormal-d128",
    "lognormal128gqa4": "jagged-lognormal-gqa4-d128",
    "tiny2048": "jagged-tiny-d128",
    "dense4x4096": "dense-b4h16n4096d128",
    "dense4x8192h32": "dense-b4h32n8192d128",  # its K/V, 256 MB, are five times the L2
    "bq64x1024": "bq-lq64-b1024",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps-ms", type=int, default=300, help="do_bench rep time per case")
    parser.add_argument(
        "--batches",
        default="",
        help="only the batches whose name contains one of these (comma-separated); "
        f"batches: {', '.join(BATCHES)}",
    )
    parser.add_argument(
        "--orders",
        default="",
        help="only these orders (comma-separated; the default always runs, the others are "
        f"compared with it); orders: {', '.join(ORDERS)}",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    unknown = [o for o in args.orders.split(",") if o and o not in ORDERS]
    if unknown:
        raise SystemExit(f"unknown orders {', '.join(unknown)}; orders: {', '.join(ORDERS)}")
    orders = [o for o in ORDERS if o == "default" or not args.orders or o in args.orders.split(",")]
    print(f"{'batch':16s} {'causal':6s} {'order':14s} {'ms':>8s} {'TFLOP/s':>8s} {'max|x-dflt|':>11s}")
    for name, workload in BATCHES.items():
        if not any(part in name for part in args.batches.split(",")):
            continue
        w = get(workload)
        b = make_batch(w, "cuda")
        shared = w.kind == "broadcast_q"
        lq = w.q_len if shared else b.max_q  # broadcast-Q: one block of lq queries
        for causal in (False,) if shared else (False, True):
            right = 0 if causal else -1
            flops = fwd_flops(b.q_lens, b.kv_lens, heads=w.heads, head_dim=w.head_dim, causal=causal)
            outs = {}
            for order in orders:
                knobs = dict(ORDERS[order])
                schedule = knobs.pop("schedule", None)
                plan = None if schedule is None else make_plan(
                    b.q_offsets, b.kv_offsets, total_q=b.total_q, total_kv=b.total_kv,
                    heads_q=w.heads, heads_kv=w.hkv, window=(-1, right), block_m=BLOCK_M,
                    block_n=BLOCK_N, max_seqlen_q=lq, backward=False, schedule=schedule,
                )
                run = functools.partial(
                    forward, b.q, b.k, b.v, b.q_offsets, b.kv_offsets, lq, left=-1, right=right,
                    scale=w.head_dim**-0.5, plan=plan, q_shared=shared, **knobs,
                )
                outs[order] = run()[0]
                ms = do_bench(run, warmup=25, rep=args.reps_ms, return_mode="median")
                diff = (outs[order].float() - outs["default"].float()).abs().max().item()
                del run
                print(f"{name:16s} {causal!s:6s} {order:14s} {ms:8.3f} {flops / ms / 1e9:8.1f} {diff:11.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
