"""Probe (H200): is the TLX forward's time bimodal? The session-5 bench measured dense causal
(p20 0.66 / p50 0.87 / p80 1.12 ms) and broadcast-Q Lq256 x 256 (1.53 / 2.20 / 2.34) with wide
spreads, where tlx-ab timed 0.59 ms for dense causal. This times the public calls many times,
each consumer version (v1, v2: ``tlx_attention.forward``'s ``pipeline``, patched in), and prints
percentiles of single-call times (do_bench ``return_mode="all"``), on the bench's workloads and
inputs (``jagflash.bench.data.make_batch``; until session 10 every case ran with q = k = v).

Run on the GPU: ``python bench/probes/probe_forward.py`` (gpu.sh: ``PROBE=bench/probes/probe_forward.py``)."""

from __future__ import annotations

import argparse
import functools

import torch
from triton.testing import do_bench

from jagflash.bench.data import make_batch
from jagflash.bench.workloads import get
from jagflash.core import tlx_attention
from jagflash.variants.broadcast_q import broadcast_q_attention
from jagflash.variants.dense import dense_attention
from jagflash.variants.jagged import jagged_attention

FORWARD = tlx_attention.forward


def _pct(times: list[float], p: float) -> float:
    s = sorted(times)
    return s[min(len(s) - 1, int(p * len(s)))]


def _calls() -> dict:
    """Printed name -> the public forward call on that bench workload's batch."""
    cases = {}
    for name in ("dense-b4h16n4096d128-causal", "dense-b4h16n4096d128"):
        w = get(name)
        b = make_batch(w, "cuda")
        q, k, v = (t.view(*b.dense_shape(), *t.shape[1:]) for t in (b.q, b.k, b.v))
        label = "dense 4x4096" + (" causal" if w.causal else "")
        cases[label] = functools.partial(dense_attention, q, k, v, causal=w.causal)
    for name in ("bq-lq256-b256", "bq-lq256-b64"):
        b = make_batch(get(name), "cuda")
        cases[name] = functools.partial(broadcast_q_attention, b.q, b.k, b.v, b.kv_offsets)
    b = make_batch(get("jagged-lognormal-causal-d128"), "cuda")
    cases["jagged lognormal causal"] = functools.partial(
        jagged_attention, b.q, b.k, b.v, b.q_offsets, b.kv_offsets, causal=True
    )
    return cases


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    cases = _calls()
    print(f"{'case':26s} {'version':8s} {'n':>4s} {'p10':>8s} {'p50':>8s} {'p90':>8s} {'max':>8s}  (ms)", flush=True)
    for name, run in cases.items():
        for version, pipeline in (("v1", False), ("v2", True), ("v1", False), ("v2", True)):
            tlx_attention.forward = functools.partial(FORWARD, pipeline=pipeline)
            with torch.no_grad():
                times = do_bench(run, warmup=25, rep=400, return_mode="all")
            print(
                f"{name:26s} {version:8s} {len(times):4d} {_pct(times, 0.1):8.3f} {_pct(times, 0.5):8.3f} "
                f"{_pct(times, 0.9):8.3f} {max(times):8.3f}",
                flush=True,
            )
    tlx_attention.forward = FORWARD


if __name__ == "__main__":
    main()
