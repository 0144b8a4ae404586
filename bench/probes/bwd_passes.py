"""Probe (H200; a CPU smoke; issue 22): where a backward's device time goes, the one-pass
backward (dQ reduce-added into an fp32 accumulator) against the two passes (``deterministic``:
a dQ pass, then the dK/dV pass), on a bench workload's batch.

    python bench/probes/bwd_passes.py                     # the three DEFAULT_WORKLOADS
    TRITON_INTERPRET=1 python bench/probes/bwd_passes.py --smoke --workloads bs-lognormal-d25

For each workload (its batch as the bench makes it; a ``bs-*`` one through the block-sparse
variant with the workload's mask, any other through the jagged variant) and each of
``deterministic`` False / True: the backward's median (``jagflash.bench.timing.measure``, L2
flushed, ``out.backward`` of one forward kept with ``retain_graph``), each device kernel's time
per call (``probe_launch.kernel_table``), and the largest difference of the two backwards' dQ,
dK, dV (they add in other orders: a few bf16 ulps, not more). The bytes the one pass moves
through its fp32 dQ accumulator are printed beside, and the one pass's I/O floor
(:func:`one_pass_bytes`: every tensor moved once), on a GPU as time at this device's copy
ceiling: no kernel of this design runs faster (bench/NOTES.md, session 25).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import torch

#: The batches timed by default: a block-sparse one, its dense jagged twin, dense 4 x 8192 sparse.
DEFAULT_WORKLOADS = ("bs-lognormal-d25", "jagged-lognormal-causal-d128", "bs-dense8k-d25")


def one_pass_bytes(tq: int, tk: int, hq: int, hkv: int, dim: int, elem: int = 2) -> dict[str, int]:
    """The least DRAM bytes of each kernel of the one-pass backward, every tensor moved once:
    the dK/dV kernel reads Q and dO (``tq`` rows of ``hq`` heads), K and V (``tk`` rows of
    ``hkv``) and the packed LSE and delta, writes dK and dV, and reads its fp32 dQ accumulator
    on first touch and writes it back; the vectors pass reads O and dO, writes LSE and delta
    and zeroes the accumulator; the cast reads the accumulator and writes dQ. ``elem``: bytes
    of the inputs' dtype."""
    q, kv, vec = tq * hq * dim * elem, tk * hkv * dim * elem, 2 * tq * hq * 4
    acc = tq * hq * dim * 4
    return {"dK/dV": 2 * q + 4 * kv + vec + 2 * acc, "vectors": 2 * q + vec + acc, "cast": acc + q}


def _sole_config(on: bool, **call):
    """``tuning.bwd_config(**call)`` with ``SOLE_DQ`` ``on`` where the one pass can take it (D 128,
    no broadcast-Q), whatever the policy says."""
    from jagflash.core.tuning import bwd_config

    cfg = bwd_config(**call)
    fits = cfg.FUSED_DQ and not cfg.Q_SHARED and cfg.HEAD_DIM == 128
    return dataclasses.replace(cfg, SOLE_DQ=on and fits)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--smoke", action="store_true", help="the workloads' smoke batches (the CPU's interpreter)")
    ap.add_argument("--sole", action="store_true",
                    help="the one pass with SOLE_DQ forced off, then on, instead of one pass / two passes")
    args = ap.parse_args(argv)

    from probe_launch import kernel_table  # bench/probes/ is on sys.path (the script's folder)

    from jagflash.bench.data import make_batch
    from jagflash.bench.env import ceilings
    from jagflash.bench.timing import measure
    from jagflash.bench.workloads import get
    from jagflash.core.tlx import bwd_sm90
    from jagflash.variants.block_sparse import block_sparse_attention
    from jagflash.variants.jagged import jagged_attention

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for name in args.workloads.split(","):
        w = get(name, smoke=args.smoke)
        b = make_batch(w, dev, 0, w.sample_lengths())
        q, k, v = (t.detach().requires_grad_() for t in (b.q, b.k, b.v))
        qo, ko = b.q_offsets, b.kv_offsets
        acc_bytes = q.shape[0] * q.shape[1] * q.shape[2] * 4
        print(f"\n#### {name}: {b.num_seqs} sequences, {q.shape[0]} q / {k.shape[0]} kv tokens, H{q.shape[1]} D{q.shape[2]}; "
              f"fp32 dQ accumulator {acc_bytes / 1e6:.0f} MB (zeroed, reduce-added, read by the cast)", flush=True)
        floor = one_pass_bytes(q.shape[0], k.shape[0], q.shape[1], k.shape[1], q.shape[2], q.element_size())
        rate = ceilings("cuda")["copy_gbps"] if dev.type == "cuda" else None
        parts = ", ".join(f"{n} {b / 1e6:.0f}" for n, b in floor.items())
        at = f", >= {sum(floor.values()) / rate / 1e6:.3f} ms at {rate:.0f} GB/s" if rate else ""
        print(f"# {name}: the one pass's I/O floor {sum(floor.values()) / 1e6:.0f} MB ({parts}){at}", flush=True)
        grads = {}
        for det in (False, True):
            if args.sole:  # (det: SOLE_DQ forced on where the kernel takes it, else off; always the one pass)
                bwd_sm90.bwd_config = functools.partial(_sole_config, det)
            if w.blocks is not None:
                out = block_sparse_attention(q, k, v, qo, ko, b.block_mask, causal=w.causal, deterministic=det and not args.sole)
            else:
                out = jagged_attention(q, k, v, qo, ko, causal=w.causal, max_seqlen_q=b.max_q, max_seqlen_kv=b.max_kv,
                                       deterministic=det and not args.sole)

            def call(out=out, leaves=(q, k, v), dout=b.dout):
                for x in leaves:
                    x.grad = None
                out.backward(dout, retain_graph=True)

            call()
            grads[det] = [x.grad.clone() for x in (q, k, v)]
            t = measure(call, dev, grad_to_none=[q, k, v])
            what = f"SOLE_DQ={int(det)}" if args.sole else f"deterministic={det}"
            print(f"\n{name} backward, {what}: p20 {t.p20:.4f} / p50 {t.p50:.4f} / p80 {t.p80:.4f} ms ({t.timer})",
                  flush=True)
            kernel_table(f"{name} bwd {what}", call, top=10)
        diffs = ", ".join(f"{n} {(a.float() - c.float()).abs().max().item():.3g}"
                          for n, a, c in zip(("dq", "dk", "dv"), grads[False], grads[True]))
        print(f"# {name}: max |one pass - two passes|: {diffs}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
