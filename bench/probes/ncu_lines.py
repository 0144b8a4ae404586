"""Where a kernel's warp-stall samples sit in its source: an ncu source-page export (SASS rows with
their sample counts, ``bench/gpu.sh ncu`` writes ``ncu-sass.csv``) joined by instruction offset to
the line table of the same cubin (``nvdisasm -c -gi``, which names every instruction's source line
and the calls it was inlined through), then summed by the kernel's own line (the outermost frame)
and by the line one call below it.

    python bench/probes/ncu_lines.py ncu-sass.csv _fwd_kernel.cubin [--kernel-file fwd_sm90.py] [--top 40]

The cubin must be the one ncu profiled (the Triton cache of the profiled run: ``bench/gpu.sh ncu``
with ``NCU_CACHE=1`` keeps it under ``$OUT/triton-cache``); the join checks every row's opcode
against the disassembly and refuses on a mismatch.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from probe_ncu import number, read_export  # (this directory: run as a script)

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")


def _nvdisasm() -> str:
    try:
        from jagflash.core.compile_check import _ptxas

        return os.path.join(os.path.dirname(_ptxas()), "nvdisasm")
    except Exception:  # any install without jagflash's compile check
        return "nvdisasm"


def line_table(cubin: Path) -> dict[int, tuple[str, list[tuple[str, int]]]]:
    """offset -> (instruction text, frames outermost first) of ``cubin``'s disassembly."""
    text = subprocess.run([_nvdisasm(), "-c", "-gi", str(cubin)], capture_output=True, text=True, check=True).stdout
    table: dict[int, tuple[str, list[tuple[str, int]]]] = {}
    frames: list[tuple[str, int]] = []
    pending: list[tuple[str, int]] | None = None
    for raw in text.splitlines():
        if raw.lstrip().startswith("//##"):
            # a group of '//## File' lines, innermost first, each 'inlined at' the next; the
            # group's last line is the kernel's own frame
            m = _FRAME.search(raw)
            if m:
                if pending is None:
                    pending = []
                pending.append((m.group(1), int(m.group(2))))
            continue
        if pending is not None:
            frames = list(reversed(pending))
            pending = None
        m = _INSN.search(raw)
        if m:
            table[int(m.group(1), 16)] = (m.group(2), frames)
    return table


def _opcode(text: str) -> str:
    words = [w for w in text.replace("{", " ").split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("cubin", type=Path)
    parser.add_argument("--kernel-file", default="fwd_sm90.py", help="the kernel's own source file (its frames are the outermost)")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    table = line_table(args.cubin)
    header, body, src, allcol, stall_cols = read_export(str(args.csv))
    addr = next((i for i, c in enumerate(header) if c.strip() == "Address"), -1)
    reasons = [i for i in stall_cols if i != allcol and "Not Issued" not in header[i] and "Sampling" not in header[i]]
    execs = next((i for i, c in enumerate(header) if c.strip() == "Instructions Executed"), None)
    base = min(int(r[addr], 16) for r in body) if addr >= 0 else 0
    offsets = [int(r[addr], 16) - base if addr >= 0 else 16 * k for k, r in enumerate(body)]
    bad = [(o, r[src]) for o, r in zip(offsets, body) if o not in table or _opcode(table[o][0]) != _opcode(r[src])]
    if bad:
        for o, s in bad[:8]:
            print(f"  {o:#x}: ncu '{s.strip()[:60]}' / cubin '{table.get(o, ('(none)',))[0][:60]}'")
        raise SystemExit(f"ncu_lines: {len(bad)} of {len(body)} rows do not match the cubin's instructions: another build")
    sources: dict[str, list[str]] = {}

    def text_of(path: str, line: int) -> str:
        if path not in sources:
            local = Path(path)
            if not local.exists():  # the device's checkout: find the file under this tree
                tail = path.split("/src/", 1)[-1]
                hits = list(Path(".").glob(f"*/src/{tail}"))
                local = hits[0] if hits else local
            sources[path] = local.read_text().splitlines() if local.exists() else []
        lines = sources[path]
        return lines[line - 1].strip()[:70] if 0 < line <= len(lines) else ""

    total = sum(number(r[allcol]) for r in body) or 1.0
    by_top: dict[tuple, list[float]] = defaultdict(lambda: [0.0] * (len(reasons) + 2))
    by_two: dict[tuple, float] = defaultdict(float)
    for o, r in zip(offsets, body):
        frames = table[o][1]
        own = [f for f in frames if f[0].endswith(args.kernel_file)]
        top = own[-1] if own else (frames[0] if frames else ("?", 0))  # the kernel's innermost own line
        acc = by_top[top]
        acc[0] += number(r[allcol])
        acc[1] += number(r[execs]) if execs is not None else 0.0
        for k, i in enumerate(reasons):
            acc[k + 2] += number(r[i])
        below = frames[frames.index(top) + 1] if top in frames and frames.index(top) + 1 < len(frames) else top
        by_two[(top, below)] += number(r[allcol])
    print(f"ncu_lines: {len(body)} instructions, {total:.0f} samples; by {args.kernel_file} line (innermost frame of it)")
    names = [re.sub(r"^.*?stall_?|\s*\(.*$", "", header[i], flags=re.I) or header[i] for i in reasons]
    tot_r = [sum(v[k + 2] for v in by_top.values()) for k in range(len(reasons))]
    big = sorted(range(len(reasons)), key=lambda k: -tot_r[k])[:6]
    print(f"{'samples':>8} {'%':>5}  {'line':>5}  " + " ".join(f"{names[k][:9]:>9}" for k in big) + "  source")
    for (path, line), v in sorted(by_top.items(), key=lambda kv: -kv[1][0])[: args.top]:
        cols = " ".join(f"{v[k + 2]:9.0f}" for k in big)
        print(f"{v[0]:8.0f} {100 * v[0] / total:5.1f}  {line:5d}  {cols}  {text_of(path, line)}")
    print("\n-- by kernel line and the line one call below it")
    for ((_, l1), (p2, l2)), n in sorted(by_two.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{n:8.0f} {100 * n / total:5.1f}  {l1:4d} > {Path(p2).name}:{l2:<4d} {text_of(p2, l2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
