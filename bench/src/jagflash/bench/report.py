"""Tidy output: one long-format CSV, and everything else generated from it.

``results.csv`` has one row per (workload, provider, direction) with the status, p20/p50/p80
milliseconds, TFLOP/s at the median, the FLOP count, the relative error of the check, the
problem's shape and the GPU / torch / Triton / cuDNN versions, git commit and date. From the CSV
alone (``python -m jagflash.bench --report-only DIR`` redoes it) come:

* ``results.md``: per workload kind, a table of workloads x providers (TFLOP/s, ms) per direction,
  then the reason behind every cell that has no number;
* ``tflops_<kind>.png``: grouped bars of TFLOP/s (whiskers: p20-p80), forward and backward;
* ``summary.txt``: the short table the GPU script prints last.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "COLUMNS",
    "STATUSES",
    "emit_table",
    "read_csv",
    "render",
    "summary_text",
    "write_csv",
]

COLUMNS = (
    "workload",
    "kind",
    "provider",
    "direction",
    "status",
    "ms_p20",
    "ms_p50",
    "ms_p80",
    "tflops",
    "flops",
    "peak_mib",
    "rel_err",
    "note",
    "num_seqs",
    "tokens_q",
    "tokens_kv",
    "max_q",
    "max_kv",
    "heads_q",
    "heads_kv",
    "head_dim",
    "dtype",
    "causal",
    "window",
    "smoke",
    "block_density",
    "timer",
    "runs",
    "loop_ms",
    "device",
    "gpu",
    "torch",
    "triton",
    "cudnn",
    "cuda",
    "git_commit",
    "date",
)

#: ok: timed and checked. wrong: failed the reference check (no number). unsupported: the provider
#: cannot run this problem. unavailable: it cannot run in this process (not installed, no GPU).
#: failed: it raised. skipped: not run (budget, default set).
STATUSES = ("ok", "wrong", "unsupported", "unavailable", "failed", "skipped")
_CELL = {
    "wrong": "WRONG",
    "unsupported": "unsup.",
    "unavailable": "n/a",
    "failed": "FAIL",
    "skipped": "skip",
}
_NUMERIC = ("ms_p20", "ms_p50", "ms_p80", "tflops", "peak_mib", "rel_err", "block_density", "loop_ms")
_INTS = (
    "flops",
    "num_seqs",
    "tokens_q",
    "tokens_kv",
    "max_q",
    "max_kv",
    "heads_q",
    "heads_kv",
    "head_dim",
    "runs",
)


def _fmt(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.6g}"
    return str(value)


def write_csv(rows: Iterable[dict], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(COLUMNS), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _fmt(row.get(c)) for c in COLUMNS})


def emit_table(table: Iterable[Iterable], path: str | Path | None = None) -> None:
    """A probe's table (its header row first) as CSV on stdout and, with ``path``, in that file."""
    table = [list(r) for r in table]
    csv.writer(sys.stdout).writerows(table)
    if path:
        with Path(path).open("w", newline="") as fh:
            csv.writer(fh).writerows(table)


def read_csv(path: Path) -> list[dict]:
    rows = []
    with Path(path).open(newline="") as fh:
        for raw in csv.DictReader(fh):
            row: dict = dict(raw)
            for c in _NUMERIC:
                row[c] = float(row[c]) if row.get(c) not in (None, "") else None
            for c in _INTS:
                row[c] = int(float(row[c])) if row.get(c) not in (None, "") else None
            rows.append(row)
    return rows


def _ordered(values: Iterable[str]) -> list[str]:
    return list(OrderedDict.fromkeys(values))


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    if row["status"] == "ok" and row.get("tflops") is not None:
        peak = row.get("peak_mib")
        mem = f"<br>{peak:.0f} MiB" if isinstance(peak, (int, float)) else ""
        return (
            f"**{row['tflops']:.0f}**<br>{row['ms_p50']:.3g} ms{mem}"
            if row["tflops"] >= 1
            else (f"**{row['tflops']:.3g}**<br>{row['ms_p50']:.3g} ms{mem}")
        )
    if row["status"] == "ok" and row.get("ms_p50") is not None:  # a mask build: no FLOPs
        return f"{row['ms_p50']:.3g} ms"
    return _CELL.get(row["status"], row["status"])


def _ms(index: dict, workload: str, provider: str, direction: str) -> float | None:
    r = index.get((workload, provider, direction))
    return r["ms_p50"] if r is not None and r["status"] == "ok" and r.get("ms_p50") else None


def _ratio(num: float | None, den: float | None, fmt: str = "{:.2f}x") -> str:
    return "-" if num is None or den is None or den <= 0 else fmt.format(num / den)


#: The issue's goals for the block-sparse rows (H200, bf16, D128), printed under their table.
BLOCK_SPARSE_GOALS = (
    "goals at 25 %: fwd and bwd >= 3.2x dense; >= 2x flex fwd+bwd; >= 1.2x FA4 fwd; build <= 10 % of fwd"
)


def block_sparse_lines(rows: list[dict]) -> list[str]:
    """Speed-ups of the block-sparse rows (``bs-*`` workloads), one line per workload and
    jagflash provider: the median time of the same provider's rows on the workload's baseline
    (the same batch without the mask) over its own, forward and backward; FlexAttention's
    fwd + bwd time over its own; FA4's forward over its forward; its mask build (``build``
    row) and FlexAttention's as % of that provider's forward. Empty when no such rows."""
    from jagflash.bench.workloads import WORKLOADS

    index = {(r["workload"], r["provider"], r["direction"]): r for r in rows}
    density = {r["workload"]: r.get("block_density") for r in rows}
    lines = []
    for wl in _ordered(r["workload"] for r in rows):
        w = WORKLOADS.get(wl)
        if w is None or w.blocks is None:
            continue
        base = w.baseline
        flex_fb = [_ms(index, wl, "flex", d) for d in ("fwd", "bwd")]
        flex_sum = None if None in flex_fb else sum(flex_fb)
        for p in _ordered(r["provider"] for r in rows if r["workload"] == wl and r["provider"].startswith("jagflash-")):
            f, b = _ms(index, wl, p, "fwd"), _ms(index, wl, p, "bwd")
            if f is None and b is None:
                continue
            d = density.get(wl)
            lines.append(
                f"{wl[:26]:<26} {_short(p):>10} {'-' if d is None else f'{d:.0%}':>4} "
                f"{_ratio(_ms(index, base, p, 'fwd'), f):>7} {_ratio(_ms(index, base, p, 'bwd'), b):>7} "
                f"{_ratio(flex_sum, None if f is None or b is None else f + b):>7} "
                f"{_ratio(_ms(index, wl, 'fa4', 'fwd'), f):>7} "
                f"{_ratio(_ms(index, wl, p, 'build'), f, '{:.1%}'):>7} "
                f"{_ratio(_ms(index, wl, 'flex', 'build'), _ms(index, wl, 'flex', 'fwd'), '{:.0%}'):>8}"
            )
    if not lines:
        return []
    head = (
        f"{'block-sparse':<26} {'provider':>10} {'dens':>4} {'fwd/dns':>7} {'bwd/dns':>7} "
        f"{'/flexFB':>7} {'/FA4 f':>7} {'build%':>7} {'flexbld%':>8}"
    )
    return [
        head,
        *lines,
        "(x: the other's median time over this provider's; dens: listed share of the causal band's blocks; build%: its",
        " from_mask_mod as % of its forward, flexbld%: create_block_mask as % of Flex's forward;",
        " FA4 forward is an inference forward, jagflash's a training one)",
        BLOCK_SPARSE_GOALS,
    ]


def _meta_lines(meta: dict, rows: list[dict]) -> list[str]:
    first = rows[0] if rows else {}
    gpu = meta.get("gpu") or first.get("gpu", "?")
    lines = [f"- device: {gpu}"]
    vers = [
        f"torch {meta.get('torch') or first.get('torch', '?')}",
        f"triton {meta.get('triton') or first.get('triton', '?')}",
    ]
    if meta.get("host_triton") and meta.get("host_triton") != meta.get("triton"):
        vers.append(f"host triton {meta['host_triton']} (FlexAttention, FA4 workers)")
    if meta.get("cudnn") or first.get("cudnn"):
        vers.append(f"cuDNN {meta.get('cudnn') or first.get('cudnn')}")
    if meta.get("cuda") or first.get("cuda"):
        vers.append(f"CUDA {meta.get('cuda') or first.get('cuda')}")
    if meta.get("flash_attn"):
        vers.append(f"flash_attn {meta['flash_attn']}")
    lines.append("- versions: " + ", ".join(vers))
    lines.append(
        f"- commit {meta.get('git_commit') or first.get('git_commit', '?')}, "
        f"date {meta.get('date') or first.get('date', '?')}"
    )
    ceil = meta.get("ceilings") or {}
    if ceil:
        lines.append(
            f"- ceilings: bf16 matmul 8192^3 {ceil.get('matmul_bf16_tflops', float('nan')):.0f} TFLOP/s, "
            f"device copy {ceil.get('copy_gbps', float('nan')):.0f} GB/s"
        )
    if meta.get("reference"):
        lines.append(f"- reference: {meta['reference']}")
    if meta.get("command"):
        lines.append(f"- command: `{meta['command']}`")
    return lines


def markdown(rows: list[dict], meta: dict | None = None) -> str:
    meta = meta or {}
    smoke = any(str(r.get("smoke")) in ("True", "true", "1") for r in rows)
    out = ["# jagflash benchmark" + (" (smoke: tiny shapes, not performance)" if smoke else ""), ""]
    out += _meta_lines(meta, rows)
    out += [
        "",
        "Cells: **TFLOP/s** at the median time, then the median in ms. FLOPs are counted from the",
        "real lengths and masks (4·D·Hq per visible query-key pair forward, 2.5x that backward).",
        "Times are p50 of many runs (p20/p80 in the CSV), L2 flushed between runs, inputs rotated.",
        "Forward runs with inputs that require grad (training forward) unless the provider has no",
        "backward. Every number passed a check against a float32 reference first (rel. error <= 2e-2",
        "on out, dQ, dK, dV for 16-bit inputs); WRONG cells failed it, n/a = not available here,",
        "unsup. = cannot run this problem, FAIL = raised, skip = not run (see Notes).",
        "",
    ]
    kinds = _ordered(r["kind"] for r in rows)
    notes: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for kind in kinds:
        krows = [r for r in rows if r["kind"] == kind]
        providers = _ordered(r["provider"] for r in krows)
        # Drop providers that have no number anywhere in this kind *and* are only n/a: they
        # would be a column of "n/a"; their reason still goes to the notes.
        shown = [
            p
            for p in providers
            if any(r["provider"] == p and r["status"] != "unavailable" for r in krows)
        ]
        out += [f"## {kind}", ""]
        if not shown:
            out += ["No provider could run these workloads here.", ""]
        else:
            out.append("| workload | dir | " + " | ".join(shown) + " |")
            out.append("|---|---|" + "---|" * len(shown))
            index = {(r["workload"], r["provider"], r["direction"]): r for r in krows}
            for wl in _ordered(r["workload"] for r in krows):
                for d in _ordered(r["direction"] for r in krows if r["workload"] == wl):
                    cells = [_cell(index.get((wl, p, d))) for p in shown]
                    out.append(f"| {wl} | {d} | " + " | ".join(cells) + " |")
            out.append("")
        for r in krows:
            if r["status"] != "ok" or r.get("note"):
                reason = r.get("note") or ""
                key = (r["provider"], r["status"], reason)
                tag = f"{r['workload']} {r['direction']}"
                if tag not in notes[key]:
                    notes[key].append(tag)
    bs = block_sparse_lines(rows)
    if bs:
        out += ["## Block-sparse speed-ups", "", "```", *bs, "```", ""]
    if notes:
        out += ["## Notes", ""]
        for (prov, status, reason), where in notes.items():
            where_s = ", ".join(where) if len(where) <= 6 else f"{len(where)} rows"
            label = status if status != "ok" else "note"
            out.append(f"- **{prov}** {label}: {reason or '(no reason given)'} — {where_s}")
        out.append("")
    return "\n".join(out)


def plots(rows: list[dict], out_dir: Path, ceiling_tflops: float | None = None) -> list[Path]:
    """One PNG per workload kind: horizontal grouped bars, forward and backward side by side;
    a dashed line at the bf16 matmul ceiling when it is known."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for kind in _ordered(r["kind"] for r in rows):
        ok = [r for r in rows if r["kind"] == kind and r["status"] == "ok" and r.get("tflops")]
        if not ok:
            continue
        workloads = _ordered(r["workload"] for r in rows if r["kind"] == kind)
        providers = _ordered(r["provider"] for r in ok)
        directions = _ordered(r["direction"] for r in rows if r["kind"] == kind and r["direction"] != "build")
        index = {(r["workload"], r["provider"], r["direction"]): r for r in ok}
        height = max(2.5, 0.28 * len(workloads) * max(len(providers), 1) + 1.2)
        fig, axes = plt.subplots(
            1, len(directions), figsize=(6.5 * len(directions), height), squeeze=False, sharey=True
        )
        cmap = plt.get_cmap("tab20")
        bar_h = 0.8 / max(len(providers), 1)
        for ax, d in zip(axes[0], directions):
            for j, p in enumerate(providers):
                ys, xs, lo, hi = [], [], [], []
                for i, wl in enumerate(workloads):
                    r = index.get((wl, p, d))
                    if r is None:
                        continue
                    ys.append(i + (j - (len(providers) - 1) / 2) * bar_h)
                    xs.append(r["tflops"])
                    flops = r.get("flops") or 0
                    p80 = r.get("ms_p80") or r["ms_p50"]
                    p20 = r.get("ms_p20") or r["ms_p50"]
                    lo.append(max(r["tflops"] - flops / (p80 * 1e-3) / 1e12, 0.0))
                    hi.append(max(flops / (p20 * 1e-3) / 1e12 - r["tflops"], 0.0))
                if xs:
                    ax.barh(
                        ys,
                        xs,
                        height=bar_h,
                        color=cmap((2 * j) % 20 + (j // 10) % 2),  # dark shades first
                        label=p,
                        xerr=[lo, hi],
                        error_kw={"elinewidth": 0.8, "capsize": 1.5},
                    )
            if ceiling_tflops:
                ax.axvline(
                    ceiling_tflops,
                    color="0.4",
                    linestyle="--",
                    linewidth=1,
                    label="bf16 matmul ceiling",
                )
            ax.set_yticks(range(len(workloads)))
            ax.set_yticklabels(workloads, fontsize=8)
            ax.set_xlabel("TFLOP/s (median; whiskers p20-p80)")
            ax.set_title(f"{kind} — {d}")
            ax.grid(axis="x", alpha=0.3)
        axes[0][0].invert_yaxis()  # once: the y axis is shared, a second call would undo it
        handles, labels = {}, []
        for ax in axes[0]:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if lab not in handles:
                    handles[lab] = h
                    labels.append(lab)
        if labels:
            fig.legend(
                [handles[lab] for lab in labels],
                labels,
                fontsize=8,
                loc="center left",
                bbox_to_anchor=(1.0, 0.5),
            )
        fig.tight_layout()
        path = Path(out_dir) / f"tflops_{kind}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths


_SHORT = {
    "jagflash-tlx": "jf-tlx",
    "jagflash-portable": "jf-port",
    "jagflash-interpreter": "jf-interp",
    "jagflash-reference": "jf-ref",
    "fa4-expand-q": "fa4-xq",
    "varlen-fa2": "fa2-varlen",
    "expand-q-varlen": "fa2-xq",
    "sdpa-nested": "sdpa-njt",
    "utlx-ws": "tlx-ws",
    "utlx-ws-pipelined": "tlx-wsp",
    "utlx-ws-pipelined-pingpong": "tlx-pp",
    "utlx-ws-pipelined-pingpong-persistent": "tlx-ppp",
}
_SUMMARY_CELL = {
    "wrong": "WRONG",
    "unsupported": "unsup",
    "unavailable": "-",
    "failed": "FAIL",
    "skipped": "skip",
}


def _short(provider: str) -> str:
    return _SHORT.get(provider, provider)[:10]


def _tf(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.3g}"


def summary_text(rows: list[dict], meta: dict | None = None) -> str:
    """The short table printed last: TFLOP/s at the median per workload, direction, provider."""
    meta = meta or {}
    gpu = meta.get("gpu") or (rows[0].get("gpu") if rows else "?")
    head = f"jagflash bench on {gpu}"
    ceil = meta.get("ceilings") or {}
    if ceil:
        head += (
            f" | ceilings: bf16 matmul {ceil.get('matmul_bf16_tflops', float('nan')):.0f} TFLOP/s,"
            f" copy {ceil.get('copy_gbps', float('nan')):.0f} GB/s"
        )
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r["status"]] += 1
    lines = [head, "rows: " + ", ".join(f"{s} {counts[s]}" for s in STATUSES if counts[s])]
    lines.append("TFLOP/s at the median (- n/a, unsup, WRONG, FAIL, skip: see results.md)")
    for kind in _ordered(r["kind"] for r in rows):
        krows = [r for r in rows if r["kind"] == kind]
        provs = [
            p
            for p in _ordered(r["provider"] for r in krows)
            if any(
                r["provider"] == p and r["status"] not in ("unavailable", "skipped") for r in krows
            )
        ]
        if not provs:
            continue
        index = {(r["workload"], r["provider"], r["direction"]): r for r in krows}
        width = max(10, *(len(_short(p)) for p in provs))
        name_w = min(34, max(len(r["workload"]) for r in krows))
        lines.append("")
        lines.append(f"{kind:<{name_w}} dir   " + " ".join(f"{_short(p):>{width}}" for p in provs))
        for wl in _ordered(r["workload"] for r in krows):
            for d in _ordered(r["direction"] for r in krows if r["workload"] == wl):
                cells = []
                for p in provs:
                    r = index.get((wl, p, d))
                    if r is None:
                        cells.append("")
                    elif r["status"] == "ok" and r.get("tflops") is not None:
                        cells.append(_tf(r["tflops"]))
                    elif r["status"] == "ok" and r.get("ms_p50") is not None:
                        cells.append(f"{r['ms_p50']:.3g}ms")
                    else:
                        cells.append(_SUMMARY_CELL.get(r["status"], r["status"]))
                lines.append(
                    f"{wl[:name_w]:<{name_w}} {d:<5} " + " ".join(f"{c:>{width}}" for c in cells)
                )
    bs = block_sparse_lines(rows)
    if bs:
        lines += ["", *bs]
    return "\n".join(lines)


def render(
    csv_path: Path, out_dir: Path | None = None, meta: dict | None = None
) -> dict[str, Path]:
    """Markdown, PNGs and summary from ``csv_path`` (meta from ``meta.json`` beside it if None)."""
    csv_path = Path(csv_path)
    out_dir = Path(out_dir or csv_path.parent)
    out_dir.mkdir(parents=True, exist_ok=True)
    if meta is None:
        meta_path = csv_path.parent / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    rows = read_csv(csv_path)
    written = {}
    md = out_dir / "results.md"
    md.write_text(markdown(rows, meta))
    written["markdown"] = md
    summary = out_dir / "summary.txt"
    summary.write_text(summary_text(rows, meta) + "\n")
    written["summary"] = summary
    ceiling = (meta.get("ceilings") or {}).get("matmul_bf16_tflops")
    smoke = any(str(r.get("smoke")) in ("True", "true", "1") for r in rows)
    for p in plots(rows, out_dir, None if smoke else ceiling):
        written[p.stem] = p
    return written
