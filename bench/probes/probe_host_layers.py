"""Probe (H200): which layer of a small forward call costs the host time. probe_host.py found
broadcast-Q Lq256 x 64 host-bound (0.93 ms of host per call, 0.30 ms of GPU, session 5), with
the time inside the custom op where cProfile cannot see (dynamo's wrapper). This issues 50
calls back to back without synchronising at each layer, from the public call down to the
kernel launch (the public call, the variant's caller, which takes the eager path, the custom op
through the dispatcher, the op's body called directly, the variant's TLX
module, ``fwd_sm90.forward``), and the op body's pieces alone (the offsets check, backend
selection, the plan check), prints the host time per call of each, and cProfiles the op body.
Then it splits ``fwd_sm90.forward`` and the one-pass ``bwd_sm90.backward`` into
the Triton launches alone (their recorded arguments replayed) and everything else (the same
call with the kernels replaced by recorders), and times the public forward + backward with
grad.

Run on the GPU: ``PROBE=bench/probes/probe_host_layers.py bash bench/gpu.sh probe``."""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics

import torch
from probe_host import host_ms_per_call  # bench/probes/ (this script's folder) is on sys.path


def _rate(fn, n: int = 50) -> float:
    # Warm-up: compiles and caches, and as many calls as are timed, so that the allocator's
    # pool already holds the n outputs that n calls issued ahead of the GPU keep alive (with a
    # short warm-up the first layer timed paid for growing it: session 9, calls 4 and 6, where
    # the public call read ~0.08 ms over the caller it calls, which on the CPU costs the same).
    # The median of 7 rounds: single rounds of one layer moved +-50 % between calls and even
    # between neighbouring layers on the H200's host (session 9, calls 4, 6 and 9).
    for _ in range(n):
        fn()
    return statistics.median(host_ms_per_call(fn, n) for _ in range(7))


class _Recorder:
    """Stands in for a Triton kernel: ``kernel[grid](*args, **kw)`` records the launch. Only
    the first call is kept: keeping every call's arguments (the outputs among them) would make
    every later call's allocations new ``cudaMalloc`` calls, and the host time of the call
    without its launches would then exceed the call's (session 9, call 2)."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def record(*args, **kw):
            if not self.calls:
                self.calls.append((grid, args, kw))

        return record


def _launch_split(label: str, fn, module, names: tuple[str, ...]) -> None:
    """Host ms per call of ``fn`` with ``module``'s kernels ``names`` replaced by recorders (its
    host work without the launches), and of those launches alone, replayed."""
    real = {name: getattr(module, name) for name in names}
    recs = {name: _Recorder() for name in names}
    try:
        for name, rec in recs.items():
            setattr(module, name, rec)
        fn()
        launches = [(real[name], call) for name, rec in recs.items() for call in rec.calls]
        without = _rate(fn)
    finally:
        for name, kernel in real.items():
            setattr(module, name, kernel)

    def replay():
        for kernel, (grid, args, kw) in launches:
            kernel[grid](*args, **kw)

    alone = _rate(replay)
    print(f"{label:34s} host {without:7.3f} ms/call without its {len(launches)} launch(es), "
          f"launches alone {alone:7.3f}", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        replay()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    print(f"cProfile of {label}'s launches alone, 50 replays, by own time:")
    for ln in out.getvalue().splitlines():
        if ln.strip() and not ln.lstrip().startswith(("Ordered", "List reduced")):
            print("  " + ln[:170])


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    from jagflash.bench.data import make_batch
    from jagflash.bench.workloads import get
    from jagflash.core.backend import select
    from jagflash.core.ops import make_problem
    from jagflash.core.tlx import bwd_sm90, fwd_sm90
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
        "fwd_sm90.forward": lambda: fwd_sm90.forward(
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
    lse = fwd_sm90.forward(
        q, k, v, plan.q_offsets, offs, q.shape[0], left=-1, right=-1, scale=scale, plan=plan, q_shared=True,
    )[1]
    rows = offs.numel() - 1
    o = torch.randn(rows * q.shape[0], *q.shape[1:], device=q.device, dtype=q.dtype)
    do = torch.randn_like(o)
    split = {
        "split: fwd_sm90.forward": (layers["fwd_sm90.forward"], ("_fwd_kernel",)),
        "split: bwd_sm90.backward": (
            lambda: bwd_sm90.backward(
                do, q, k, v, o, lse, plan.q_offsets, offs, left=-1, right=-1, scale=scale, plan=plan, q_shared=True,
            ),
            ("_vectors_kernel", "_dkdv_kernel"),
        ),
    }
    with torch.no_grad():
        for name, (fn, kernels) in split.items():
            _launch_split(name, fn, fwd_sm90 if "forward" in name else bwd_sm90, kernels)
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    grad_out = torch.randn(rows, *q.shape, device=q.device, dtype=q.dtype)

    def step():
        broadcast_q_attention(qg, kg, vg, offs, max_seqlen_kv=b.max_kv, plan=plan).backward(grad_out)

    print(f"{'public forward + backward (grad)':34s} host {_rate(step):7.3f} ms/call", flush=True)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print("cProfile of the op body called directly, 50 calls, by own time:")
    for ln in out.getvalue().splitlines():
        if ln.strip():
            print("  " + ln[:170])


if __name__ == "__main__":
    main()
