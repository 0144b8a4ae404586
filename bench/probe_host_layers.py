"""Probe (H200): which layer of a small forward call costs the host time. probe_host.py found
broadcast-Q Lq256 x 64 host-bound (0.93 ms of host per call, 0.30 ms of GPU, session 5), with
the time inside the custom op where cProfile cannot see (dynamo's wrapper). This issues 50
calls back to back without synchronising at each layer, from the public call down to the
kernel launch (the public call, the variant's caller, which takes the eager path, the custom op
through the dispatcher, the op's body called directly, the variant's TLX
module, ``tlx_attention.forward``), and the op body's pieces alone (the offsets check, backend
selection, the plan check), prints the host time per call of each, and cProfiles the op body.

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
    from jagflash.core.backend import select
    from jagflash.core.ops import make_problem
    from jagflash.variants.broadcast_q import (
        SPEC,
        broadcast_q_attention,
        kernels_tlx_sm90,
        make_plan,
        op,
    )

    w = get("bq-lq256-b64")
    b = make_batch(w, "cuda")
    q, k, v, offs = b.q, b.k, b.v, b.kv_offsets
    plan = make_plan(q, k, offs, max_seqlen_kv=b.max_kv)
    scale = q.shape[-1] ** -0.5
    op_args = (q, k, v, offs, b.max_kv, scale, False, False, "", *plan.op_args())
    layers = {
        "public broadcast_q_attention": lambda: broadcast_q_attention(q, k, v, offs, max_seqlen_kv=b.max_kv, plan=plan),
        "caller op.call_fwd (eager path)": lambda: op.call_fwd(*op_args),
        "custom op broadcast_q_fwd": lambda: op.broadcast_q_fwd(*op_args),
        "op body, called directly": lambda: op.broadcast_q_fwd._init_fn(*op_args),
        "kernels_tlx_sm90.forward": lambda: kernels_tlx_sm90.forward(q, k, v, offs, left=-1, right=-1, scale=scale, plan=plan),
        "tlx_attention.forward": lambda: tlx_attention.forward(
            q, k, v, plan.q_offsets, offs, q.shape[0], left=-1, right=-1, scale=scale, plan=plan, q_shared=True,
        ),
        "  piece: offsets check": lambda: op._max_seqlen_kv(offs, k.shape[0], b.max_kv),
        "  piece: problem + select": lambda: select(SPEC, make_problem("broadcast_q", q, k, causal=False), q.device),
        "  piece: plan check": lambda: op._plan(*plan.op_args(), q, k, offs, b.max_kv, "tlx-sm90", ("fwd",)),
        "  piece: plan.op_args()": plan.op_args,
    }
    with torch.no_grad():
        for name, fn in layers.items():
            print(f"{name:34s} host {_rate(fn):7.3f} ms/call", flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(50):
            layers["op body, called directly"]()
        prof.disable()
        torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print("cProfile of the op body called directly, 50 calls, by own time:")
    for ln in out.getvalue().splitlines():
        if ln.strip():
            print("  " + ln[:170])


if __name__ == "__main__":
    main()
