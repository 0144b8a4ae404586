"""Probe (H200; a CPU smoke): where one bench row's eager call spends its time, host and device.

The bench's own batch (``jagflash.bench.data.make_batch``) and provider (``prepare``, its plan
built outside the timing as the bench does), the call the bench times (the forward with grad
when ``--direction fwd``, as a training forward; ``out.backward`` with ``retain_graph`` for
``bwd``), then:

1. host us per call: the call issued back to back 50 times, medians of 7 rounds (the device
   synchronised between rounds), against the device's kernel time from (2);
2. ``torch.profiler`` over 20 calls each (``probe_launch``'s tables): the torch ops by self CPU
   time per call, and each device kernel by its time per call;
3. ``jagflash.bench.timing.measure`` of the call (do_bench, L2 flushed), the bench row's figure;
4. ``--floor``: the same timing of what no Triton-based call on this host can go below: one
   launch of a one-program Triton kernel (``kernel[grid](...)``), and that launch after a
   ``torch.empty`` of the row's output, eager and issued back to back.

Compare two trees by running it under each tree's PYTHONPATH (``bench/probes/ab_trees.sh``'s
layout), e.g. the 1-token forward that measured 0.46 ms eager on 6991658 and 0.28 on 3ac6ccd
while its graph replay stayed at 51 us:

    PROBE=bench/probes/probe_row_profile.py PROBE_ARGS="--workload short-1tok-b4096-d128" bash bench/gpu.sh probe
"""

from __future__ import annotations

import argparse
import statistics

import torch
from probe_host import host_ms_per_call  # bench/probes/ is on sys.path
from probe_launch import kernel_table, op_table


def _floor(device: torch.device, like: torch.Tensor) -> None:
    import triton
    import triton.language as tl

    from jagflash.bench.timing import measure

    @triton.jit
    def one(X):
        tl.store(X, 1.0)

    x = torch.empty(1, device=device)

    def launch():
        one[(1,)](x)

    def alloc_launch():
        torch.empty_like(like)
        one[(1,)](x)

    for label, fn in (("one Triton launch", launch), ("torch.empty of the output + one launch", alloc_launch)):
        for _ in range(20):
            fn()
        host = statistics.median(host_ms_per_call(fn, 50) for _ in range(7))
        t = measure(fn, device)
        print(f"floor, {label}: host {host * 1e3:.1f} us per call back to back; bench timing ({t.timer}) "
              f"p20 {t.p20 * 1e3:.1f} / p50 {t.p50 * 1e3:.1f} / p80 {t.p80 * 1e3:.1f} us", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="short-1tok-b4096-d128")
    ap.add_argument("--provider", default="jagflash-tlx")
    ap.add_argument("--direction", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--smoke", action="store_true", help="the workload's smoke batch (the CPU's interpreter)")
    ap.add_argument("--floor", action="store_true", help="also time a bare Triton launch (the host's floor)")
    args = ap.parse_args(argv)
    from jagflash.bench import workloads
    from jagflash.bench.data import make_batch
    from jagflash.bench.providers import PROVIDERS
    from jagflash.bench.timing import measure

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    w = workloads.get(args.workload, smoke=args.smoke)
    batch = make_batch(w, device, 0, w.sample_lengths())
    prep = PROVIDERS[args.provider].prepare(w, batch, True)
    if args.direction == "fwd":
        def call():
            with torch.enable_grad():
                prep.fwd()
    else:
        with torch.enable_grad():
            out = prep.fwd()

        def call():
            for x in prep.leaves:
                x.grad = None
            out.backward(prep.dout, retain_graph=True)
    print(f"{args.workload} {args.direction} {args.provider}: {batch.num_seqs} sequences, "
          f"{int(batch.q.shape[0])} q / {int(batch.k.shape[0])} kv tokens, {batch.q.dtype}; {device}", flush=True)
    for _ in range(10):
        call()
    host = statistics.median(host_ms_per_call(call, 50) for _ in range(7))
    print(f"host per call, issued back to back: {host * 1e3:.1f} us", flush=True)
    op_table(f"{args.workload} {args.direction}", call, n=20, top=16)
    kernel_table(f"{args.workload} {args.direction}", call, top=16)
    t = measure(call, device, grad_to_none=list(prep.leaves) if args.direction == "bwd" else None)
    print(f"\nbench timing ({t.timer}): p20 {t.p20 * 1e3:.1f} / p50 {t.p50 * 1e3:.1f} / p80 {t.p80 * 1e3:.1f} us", flush=True)
    if args.floor:
        _floor(device, batch.q)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
