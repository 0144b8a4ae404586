"""Probe (H200) for Nsight Compute: runs one TLX kernel a few times on a bench batch, so that
``ncu`` can profile one launch of it (gpu.sh step ``ncu``), and summarises the per-instruction
warp-stall samples ncu exports.

Target (run under ncu): ``python bench/probes/probe_ncu.py [--kernel bwd|fwd|mask_mod]
[--batch lognormal|dense|tiny|bs-lognormal|bs-dense8k] [--causal] [--reps N] [--rule document|workload]
[--document-median N]``: ``bwd`` is the one-pass backward
(``bwd_sm90.backward``, kernel ``_dkdv_kernel``), ``fwd`` the forward (``_fwd_kernel``), each
on the plan a call gets by default, ``mask_mod`` the generated kernel of ``BlockMask.from_mask_mod``
(``mask_mod_build``) on a causal document mask_mod (``--rule document``:
``jagflash.bench.sparsity.document_mask_mod``, ``--document-median`` rows) or on a block-sparse
batch's own mask_mod (``--rule workload``: the bench's build row), on a bench workload's batch (:data:`BATCHES`: bf16, H16, D128;
lognormal: 128 sequences, dense: 4 x 4096, tiny: 2,048 sequences of 1-63 tokens, bs-lognormal and
bs-dense8k: the block-sparse rows at 25 %; until session 10
the probe drew its own lengths, other draws of the same distributions). The kernel runs
``--reps`` times (default 3): profile the last with ``--launch-skip reps-1 --launch-count 1``, so
that compilation and first-touch effects stay out.

Summary: ``python bench/probes/probe_ncu.py --summarize sass.csv`` reads ``ncu --import R --page source
--csv --print-source sass`` and prints the instructions with the most stall samples, the samples
per opcode, and each stall-reason column's total (whatever columns of that kind the export has:
ncu versions name them differently, so they are found by their headers)."""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter

#: ``--batch`` -> the bench workload whose batch (lengths, heads, head dim, inputs) the kernel runs.
BATCHES = {
    "lognormal": "jagged-lognormal-d128",
    "dense": "dense-b4h16n4096d128",
    "tiny": "jagged-tiny-d128",
    # block-sparse (causal, 25 % of the band's 128 x 128 blocks)
    "bs-lognormal": "bs-lognormal-d25",
    "bs-dense8k": "bs-dense8k-d25",
}


def _run(args: argparse.Namespace) -> None:
    import torch

    from jagflash.bench.data import make_batch
    from jagflash.bench.workloads import get
    from jagflash.core.tlx import bwd_sm90, fwd_sm90

    w = get(BATCHES[args.batch])
    b = make_batch(w, "cuda")
    if args.kernel == "mask_mod":  # BlockMask.from_mask_mod's generated kernel (mask_mod_build)
        from jagflash.bench.sparsity import document_mask_mod, mask_mod
        from jagflash.core.block_mask import BlockMask

        if args.rule == "document":
            rule, what = document_mask_mod(b, args.document_median), f"document, median {args.document_median}"
        elif w.blocks is not None:
            rule, what = mask_mod(w.blocks, b.block_mask), f"the workload's {w.blocks.kind} mask_mod"
        else:
            raise SystemExit(f"probe_ncu: --rule workload needs a block-sparse batch, not {args.batch}")
        size = (128, 128) if w.blocks is None else b.block_mask.block_size  # the bench's build row: the workload's blocks
        for _ in range(args.reps):
            BlockMask.from_mask_mod(
                rule, b.q_offsets, b.kv_offsets, 1, size, max_seqlen_q=b.max_q, max_seqlen_kv=b.max_kv,
                total_q=b.total_q, total_kv=b.total_kv, evaluator="kernel",
            )
        torch.cuda.synchronize()
        print(f"probe_ncu: mask_mod ({what}) on {args.batch}, {args.reps} runs")
        return
    q, k, v, dout, offs = b.q, b.k, b.v, b.dout, b.q_offsets
    dim = q.shape[-1]
    right = 0 if args.causal or w.causal else -1
    kw = {"left": -1, "right": right, "scale": dim**-0.5}
    if w.blocks is not None:
        from jagflash.bench.sparsity import make_block_mask

        kw["blocks"] = make_block_mask(w.blocks, b.q_lens, b.kv_lens, w.causal, offs, offs)
    longest = b.max_q
    out, lse = fwd_sm90.forward(q, k, v, offs, offs, longest, **kw)
    for _ in range(args.reps):
        if args.kernel == "fwd":
            fwd_sm90.forward(q, k, v, offs, offs, longest, **kw)
        else:
            bwd_sm90.backward(dout, q, k, v, out, lse, offs, offs, **kw)
    torch.cuda.synchronize()
    print(f"probe_ncu: {args.kernel} on {args.batch}{' causal' if args.causal else ''}, {args.reps} runs")


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


class ExportError(ValueError):
    """An ncu source export without the rows or columns a summary needs."""


def read_export(path: str) -> tuple[list[str], list[list[str]], int, int, list[int]]:
    """An ncu source-page export (``--page source --csv --print-source sass``): ``(header, rows,
    source column, all-samples column, every stall-reason column)``; ncu versions name the
    sampling columns differently, so they are found by their headers."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if any("Source" in c for c in r)), None)
    if head is None:
        raise ExportError(f"no header with 'Source' in {path}; its first lines: {rows[:10]}")
    header, body = rows[head], [r for r in rows[head + 1 :] if len(r) == len(rows[head])]
    src = next(i for i, c in enumerate(header) if "Source" in c)
    stall_cols = [i for i, c in enumerate(header) if re.search(r"stall|Sampling", c, re.I)]
    allcol = next((i for i in stall_cols if re.search(r"All Samples|Sampling \(All", header[i])), None)
    if allcol is None and stall_cols:
        allcol = stall_cols[0]
    if allcol is None:
        raise ExportError(f"no stall-sampling column; columns: {header}")
    return header, body, src, allcol, stall_cols


def _summarize(path: str, top: int) -> int:
    try:
        header, body, src, allcol, stall_cols = read_export(path)
    except ExportError as e:
        print(f"probe_ncu: {e}")
        return 1
    total = sum(number(r[allcol]) for r in body) or 1.0
    print(f"probe_ncu: {len(body)} SASS lines, {total:.0f} samples in '{header[allcol]}'")
    print(f"\n-- top {top} instructions by samples")
    for r in sorted(body, key=lambda r: -number(r[allcol]))[:top]:
        print(f"{number(r[allcol]):8.0f} {100 * number(r[allcol]) / total:5.1f}%  {r[src].strip()[:110]}")
    by_op: Counter[str] = Counter()
    for r in body:
        op = r[src].strip().lstrip("@!PU0123456789T ").split(" ")[0]
        by_op[op.split(".")[0]] += number(r[allcol])
    print("\n-- samples by opcode")
    for op, n in by_op.most_common(20):
        print(f"{n:8.0f} {100 * n / total:5.1f}%  {op}")
    print("\n-- stall-reason columns (totals)")
    totals = {i: sum(number(r[i]) for r in body) for i in stall_cols}
    for i in stall_cols:
        if totals[i]:
            print(f"{totals[i]:10.0f}  {header[i]}")
    # Where each of the largest stall reasons sits (the instruction that waits, with its
    # execution count: a wait run once per tile and one run once per step read differently).
    execs = next((i for i, c in enumerate(header) if c.strip() == "Instructions Executed"), None)
    reasons = [i for i in stall_cols if i != allcol and "Not Issued" not in header[i] and "Sampling" not in header[i]]
    for i in sorted(reasons, key=lambda i: -totals[i])[:5]:
        print(f"\n-- top 5 instructions for {header[i]} ({totals[i]:.0f})")
        for r in sorted(body, key=lambda r: -number(r[i]))[:5]:
            ran = f" x{number(r[execs]):.0f}" if execs is not None else ""
            print(f"{number(r[i]):8.0f}{ran:>12s}  {r[src].strip()[:100]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kernel", choices=("bwd", "fwd", "mask_mod"), default="bwd")
    parser.add_argument("--rule", choices=("document", "workload"), default="document", help="--kernel mask_mod: which mask_mod")
    parser.add_argument("--document-median", type=int, default=200, help="--rule document: the documents' median length")
    parser.add_argument("--batch", choices=tuple(BATCHES), default="lognormal")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--summarize", metavar="SASS_CSV", help="summarise an ncu source-page export")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    if args.summarize:
        return _summarize(args.summarize, args.top)
    _run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
