"""Probe (H200): which layer of a small forward call costs the host time. probe_host.py found
broadcast-Q Lq256 x 64 host-bound (0.93 ms of host per call, 0.30 ms of GPU, session 5), with
the time inside the custom op where cProfile cannot see (dynamo's wrapper). This issues 50
calls back to back without synchronising at three layers, the public call, the variant's TLX
module (``kernels_tlx_sm90.forward``, no custom op) and ``tlx_attention.forward`` (the kernel
launch alone), prints the host time per call of each, and cProfiles the middle layer.

Run on the GPU: ``PROBE=bench/probe_host_layers.py bash bench/gpu.sh probe``."""

from __future__ import annotations

import cProfile
import io
import pstats

import torch
from probe_host import host_ms_per_call  # bench/ is the script's directory, first on sys.path


def _rate(fn, n: int = 50) -> float:
    for _ in range(5):  # warm-up: compiles, caches
        fn()
    return host_ms_per_call(fn, n)


def main() -> None:
    from jagflash.bench.data import make_batch
    from jagflash.bench.workloads import get
    from jagflash.core import tlx_attention
    from jagflash.variants.broadcast_q import broadcast_q_attention, kernels_tlx_sm90, make_plan

    w = get("bq-lq256-b64")
    b = make_batch(w, "cuda")
    q, k, v = b.q, b.k, b.v
    plan = make_plan(q, k, b.kv_offsets, max_seqlen_kv=b.max_kv)
    scale = q.shape[-1] ** -0.5
    layers = {
        "public broadcast_q_attention": lambda: broadcast_q_attention(q, k, v, b.kv_offsets, max_seqlen_kv=b.max_kv, plan=plan),
        "kernels_tlx_sm90.forward": lambda: kernels_tlx_sm90.forward(q, k, v, b.kv_offsets, left=-1, right=-1, scale=scale, plan=plan),
        "tlx_attention.forward": lambda: tlx_attention.forward(
            q, k, v, plan.q_offsets, b.kv_offsets, q.shape[0], left=-1, right=-1, scale=scale, plan=plan, q_shared=True,
        ),
    }
    with torch.no_grad():
        for name, fn in layers.items():
            print(f"{name:32s} host {_rate(fn):7.3f} ms/call", flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(50):
            layers["kernels_tlx_sm90.forward"]()
        prof.disable()
        torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print("cProfile of kernels_tlx_sm90.forward, 50 calls, by own time:")
    for ln in out.getvalue().splitlines():
        if ln.strip():
            print("  " + ln[:170])


if __name__ == "__main__":
    main()
