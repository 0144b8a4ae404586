"""Probe (H200): the one-pass TLX backward with dq_write="tma" (the staged TMA reduce-add) against
dq_write="atomic" on small batches, each in its own process. It found the trap of 2026-12-01:
only batches whose sequences start at a query index that is not a multiple of 4 stopped with an
illegal instruction (a TMA box's contiguous start must be 16-byte aligned); all passed once the
accumulator's sequences were padded to 4 columns. Since session 4 the accumulator has dQ's own
layout (queries as rows, boxes start at head-dim offsets), so no sequence start meets the rule.
Prints per batch: ok (dQ within 2e-2 of the atomic version), WRONG, or the error.

Run on the GPU: ``PROBE=bench/probes/probe_one_pass_tma.py bash bench/gpu.sh probe``."""

from __future__ import annotations

import subprocess
import sys

import torch

BATCHES = {
    "1x128 h1 d128": ((128,), 1, 128),
    "1x256 h1 d128": ((256,), 1, 128),
    "1x37 h1 d128": ((37,), 1, 128),
    "2x128 h1 d128": ((128, 128), 1, 128),
    "1x128 h2 d128": ((128,), 2, 128),
    "3 odd h2 d128": ((37, 300, 129), 2, 128),
}


def run(name: str) -> str:
    from jagflash.core import tlx_attention
    from jagflash.core.jagged import offsets_from_lengths

    lens, heads, dim = BATCHES[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, o, do = (torch.randn(sum(lens), heads, dim, device="cuda", generator=gen).bfloat16() for _ in range(5))
    lse = torch.full((heads, sum(lens)), 8.0, device="cuda")
    offs = offsets_from_lengths(list(lens), "cuda")
    args = (do, q, k, v, o, lse, offs, offs)
    ref = tlx_attention.backward(*args, left=-1, right=-1, scale=dim**-0.5, dq_write="atomic")[0]
    torch.cuda.synchronize()
    got = tlx_attention.backward(*args, left=-1, right=-1, scale=dim**-0.5, dq_write="tma")[0]
    torch.cuda.synchronize()
    diff = (got.float() - ref.float()).abs().max().item()
    return "ok" if diff < 2e-2 else f"WRONG (max diff {diff:.3g})"


def main() -> None:
    if len(sys.argv) > 1:
        print(run(sys.argv[1]))
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
