"""Probe (H200): what the host spends inside the TLX kernels' Python modules on a small jagged
call (issue 20), op by op, and what a Triton launch costs by its parts.

probe_host_jagged.py (2026-12-02, call 1) put the TLX backward module at 0.82 ms of host per call
with its kernels and 0.60 ms with them replaced by recorders, the forward module at 0.24 / 0.11,
on the 256-sequence power-law batch whose GPU work is ~0.13 ms forward and ~0.35 ms backward.
This probe says where that goes, on the same batch (``probe_host_jagged.power_law_lengths``):

1. ``torch.profiler`` (CPU activity) over 50 calls each of the TLX forward module, its one-pass
   backward module, and the public forward + backward with ``plan=``: every torch op and
   ``record_function`` range by self CPU time per call (the torch ops' host cost on this host,
   which cProfile shows only as built-in calls).
2. Each Triton launch of the call (``_fwd_kernel``, ``_vectors_kernel``, ``_dkdv_kernel``), its
   arguments recorded from one real call, then replayed: the whole ``kernel[grid](...)``; the
   binder alone (Triton's argument specialisation); the compiled kernel's own runner
   (``CompiledKernel[grid](*args)``: no binding, no cache key); host ms per launch, medians of 7
   rounds of 50 back to back.

    PROBE=bench/probes/probe_launch.py bash bench/gpu.sh probe
"""

from __future__ import annotations

import argparse
import statistics

import torch
from probe_host import host_ms_per_call, sync  # bench/probes/ is on sys.path
from probe_host_jagged import _offsets, power_law_lengths


def _rate(fn, n: int = 50) -> float:
    for _ in range(n):
        fn()
    return statistics.median(host_ms_per_call(fn, n) for _ in range(7))


def _profiled(fn, n: int, device_too: bool):
    """``torch.profiler`` over ``n`` calls of ``fn`` after 5 warm-up calls (CPU activity, and the
    CUDA one where ``device_too`` and a GPU is present)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_too and torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(n):
            fn()
        sync()
    return prof


def op_table(label: str, fn, n: int = 50, top: int = 18) -> None:
    rows = sorted(_profiled(fn, n, False).key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in rows) / n
    print(f"\n== torch.profiler, {label}: {total:.1f} us self CPU per call in torch ops and ranges", flush=True)
    for e in rows[:top]:
        print(f"   {e.self_cpu_time_total / n:8.1f} us  {e.count / n:5.1f}x  {e.key[:90]}")


def kernel_table(label: str, fn, n: int = 20, top: int = 14) -> None:
    """Each device kernel of ``fn`` (torch.profiler, CUDA activity): us of device time per call,
    launches per call, and the busy total (what a CUDA-graph replay of the call cannot go below)."""
    from collections import defaultdict

    from torch.autograd import DeviceType

    per = defaultdict(lambda: [0.0, 0])
    for e in _profiled(fn, n, True).events():
        if e.device_type == DeviceType.CUDA:
            per[e.name][0] += e.time_range.elapsed_us()
            per[e.name][1] += 1
    total = sum(us for us, _ in per.values()) / n
    print(f"\n== device kernels, {label}: {total:.1f} us of kernel time per call", flush=True)
    for name, (us, count) in sorted(per.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"   {us / n:8.1f} us  {count / n:5.1f}x  {name[:100]}")


class _Capture:
    """Wraps a JIT kernel: the first launch's grid and arguments are kept, every launch runs."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            if not self.calls:
                self.calls.append((grid, args, kw))
            return self.kernel[grid](*args, **kw)

        return launch


def _launch_parts(name: str, kernel, grid, args, kw) -> None:
    from triton.runtime import driver

    device = driver.active.get_current_device()
    _, _, _, _, binder = kernel.device_caches[device]
    compiled = kernel[grid](*args, **kw)  # returns the CompiledKernel it launched
    bound, _, _ = binder(*args, **kw)
    values = tuple(bound.values())
    runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]  # the compiled runner takes all three
    full = _rate(lambda: kernel[grid](*args, **kw))
    bind = _rate(lambda: binder(*args, **kw))
    direct = _rate(lambda: runner(*values))
    print(f"   {name:18s} kernel[grid](...) {full * 1e3:7.1f} us | binder alone {bind * 1e3:6.1f} us | "
          f"CompiledKernel runner {direct * 1e3:6.1f} us", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=256)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--alpha", type=float, default=1.1, help="Pareto exponent (1.1)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--device-only", action="store_true",
                        help="only the device kernels of each call (torch.profiler CUDA activity)")
    args = parser.parse_args(argv)
    from jagflash.core.tlx import bwd_preprocess, bwd_sm90, fwd_sm90
    from jagflash.variants.jagged import jagged_attention, make_plan

    device = torch.device("cuda")
    lengths = power_law_lengths(args.count, args.alpha, 6, 1024, seed=20)
    t, h, d = int(lengths.sum()), args.heads, args.head_dim
    gen = torch.Generator(device=device).manual_seed(20)
    q, k, v, dout = (torch.randn((t, h, d), generator=gen, device=device).to(torch.bfloat16) for _ in range(4))
    qo = _offsets(lengths, device)
    mq = int(lengths.max())
    causal = {"causal": True} if args.causal else {}
    plan = make_plan(q, k, qo, qo, max_seqlen_q=mq, max_seqlen_kv=mq, **causal)
    scale = d**-0.5
    kw = {"left": -1, "right": 0 if args.causal else -1, "scale": scale, "plan": plan}
    print(f"batch: {args.count} sequences, alpha {args.alpha}, T {t}, H {h}, D {d}, bf16, causal {args.causal}; "
          f"{torch.cuda.get_device_name()}", flush=True)

    def fwd():
        return fwd_sm90.forward(q, k, v, qo, qo, mq, **kw)

    out, lse = fwd()

    def bwd():
        return bwd_sm90.backward(dout, q, k, v, out, lse, qo, qo, **kw)

    leaves = tuple(x.detach().clone().requires_grad_() for x in (q, k, v))

    def public():
        o = jagged_attention(*leaves, qo, qo, plan=plan, max_seqlen_q=mq, max_seqlen_kv=mq, **causal)
        return torch.autograd.grad(o, leaves, dout)

    def public_fwd():
        with torch.no_grad():
            return jagged_attention(q, k, v, qo, qo, max_seqlen_q=mq, max_seqlen_kv=mq, **causal)

    kernel_table("public forward, own plan (kept), no grad", public_fwd)
    kernel_table("public forward + backward, plan=", public)
    kernel_table("TLX forward module", fwd)
    kernel_table("TLX one-pass backward module", bwd)
    if args.device_only:
        return 0

    with torch.no_grad():
        print(f"host ms per call: TLX forward module {_rate(fwd):.3f}, one-pass backward module {_rate(bwd):.3f}")
    print(f"host ms per call: public forward + backward, plan= {_rate(public):.3f}", flush=True)
    with torch.no_grad():
        op_table("TLX forward module", fwd)
        op_table("TLX one-pass backward module", bwd)
    op_table("public forward + backward, plan=", public)

    print("\n== Triton launches of the call, replayed (host per launch, medians of 7 x 50)", flush=True)
    table = [(fwd_sm90, "_fwd_kernel", fwd), (bwd_preprocess, "_vectors_kernel", bwd), (bwd_sm90, "_dkdv_kernel", bwd)]
    for module, name, call in table:
        kernel = getattr(module, name)
        cap = _Capture(kernel)
        setattr(module, name, cap)
        try:
            call()
        finally:
            setattr(module, name, kernel)
        grid, a, k_ = cap.calls[0]
        _launch_parts(name, kernel, grid, a, k_)
    sync()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
