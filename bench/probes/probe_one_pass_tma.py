"""Probe (H200): the one-pass TLX backward with dq_write="tma" (the staged TMA reduce-add) against
dq_write="atomic" on small batches, each in its own process. It found the trap of 2026-12-01:
only batches whose sequences start at a query index that is not a multiple of 4 stopped with an
illegal instruction (a TMA box's contiguous start must be 16-byte aligned); all passed once the
accumulator's sequences were padded to 4 columns. Since session 4 the accumulator has dQ's own
layout (queries as rows, boxes start at head-dim offsets), so no sequence start meets the rule.
Prints per batch: ok (dQ within 2e-2 of the atomic version), WRONG, or the error. Batches are
bench workloads of fixed lengths (:data:`BATCHES`), inputs from ``jagflash.bench.data.make_batch``.

Run on the GPU: ``PROBE=bench/probes/probe_one_pass_tma.py bash bench/gpu.sh probe``."""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch

from jagflash.bench.workloads import Fixed, Mix, Workload

#: Small batches whose sequences start at query indices on and off a multiple of 4 (bf16, D128).
BATCHES = {
    w.name: w
    for w in (
        Workload("1x128 h1 d128", "jagged", Fixed(1, 128), heads=1),
        Workload("1x256 h1 d128", "jagged", Fixed(1, 256), heads=1),
        Workload("1x37 h1 d128", "jagged", Fixed(1, 37), heads=1),
        Workload("2x128 h1 d128", "jagged", Fixed(2, 128), heads=1),
        Workload("1x128 h2 d128", "jagged", Fixed(1, 128), heads=2),
        Workload(
            "3 odd h2 d128",
            "jagged",
            Mix((Fixed(1, 37), Fixed(1, 300), Fixed(1, 129)), shuffle=False),
            heads=2,
        ),
    )
}


def run(name: str) -> str:
    from jagflash.bench.data import make_batch
    from jagflash.core import tlx_attention

    b = make_batch(BATCHES[name], "cuda")
    heads, dim = b.q.shape[1:]
    o = torch.randn_like(b.q)
    lse = torch.full((heads, b.total_q), 8.0, device="cuda")
    args = (b.dout, b.q, b.k, b.v, o, lse, b.q_offsets, b.kv_offsets)
    ref = tlx_attention.backward(*args, left=-1, right=-1, scale=dim**-0.5, dq_write="atomic")[0]
    torch.cuda.synchronize()
    got = tlx_attention.backward(*args, left=-1, right=-1, scale=dim**-0.5, dq_write="tma")[0]
    torch.cuda.synchronize()
    diff = (got.float() - ref.float()).abs().max().item()
    return "ok" if diff < 2e-2 else f"WRONG (max diff {diff:.3g})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("batch", nargs="?", choices=tuple(BATCHES), help="run this one, here")
    args = parser.parse_args(argv)
    if args.batch:
        print(run(args.batch))
        return
    for name in BATCHES:
        try:
            p = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True, timeout=100)
            lines = (p.stdout + p.stderr).strip().splitlines()
            err = [ln for ln in lines if "Error" in ln]
            msg = lines[-1] if p.returncode == 0 and lines else (err[-1] if err else f"exit {p.returncode}")
        except subprocess.TimeoutExpired:
            msg = "timeout"
        print(f"{name:16s} {msg[:160]}", flush=True)


if __name__ == "__main__":
    main()
