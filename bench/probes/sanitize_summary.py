"""Read the logs of ``bench/gpu.sh sanitize`` (compute-sanitizer's memcheck, racecheck,
synccheck and initcheck over ``bench/probes/sanitize_case.py``) and say, per tool, how many
errors it reported, where (the Python function each report points into), and which of them are
documented false positives (``KNOWN``, each with its reason). Exit status 1 when any report is
not documented, or a tool's run did not finish.

    python bench/probes/sanitize_summary.py OUT/sanitize-*.log
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import functools
import re
import sys
from collections import Counter
from pathlib import Path

#: Documented false positives: (tool, where the first access is, where the second is) -> why.
#: A place is ``module.function`` of the Python source a report's file:line falls in.
#: API errors are keyed ``(tool or "*", "api <error>", <API function>)``.
KNOWN: dict[tuple[str, str, str], str] = {
    # place() marks only a def line (@def) and an async_tasks line (@async_tasks) this way.
    ("racecheck", "*@*", "*@*"): (
        "Triton's warp-specialisation dispatch, which it attributes to the kernel's def line and "
        "its async_tasks line: the default partition writes each worker warp's state byte "
        "(which partition to run, then 2 = exit) to a shared word past every jagflash buffer, "
        "then all 384 threads meet at barrier 1; the workers read their byte after the same "
        "barrier generation (PTX of the minimal ring kernel: bench/results/2026-12-01-2416401/"
        "ring_kernel-sm90a.ptx, barriers A-D in bench/NOTES.md, session 12). Every write and read "
        "of the word is ordered by a CTA-wide barrier.sync; racecheck reports it all the same"
    ),
    # record_read: record_take's read (the consumers), and since session 17 also the TLX
    # forward producer's read-back of a record it published (the tile ring one tile ahead)
    ("racecheck", "pipeline.record_publish", "pipeline.record_read"): (
        "the walk's record ring: every producer thread stores the record, the warpgroup's "
        "bar.sync orders those stores before the one elected mbarrier arrive (release), the "
        "consumers' wait (acquire) orders their loads after it; racecheck does not follow an order "
        "through bar.sync into an mbarrier. bench/probes/race_record_ring.py reproduces it in a "
        "minimal kernel (ring) and checks every value read; warp barriers (every thread arrives) "
        "silence it in the probe, but in the real kernels they failed (bench/NOTES.md, session 12). "
        "The forward producer's own read-back of a slot and its next store there are ordered by "
        "the producer warpgroup's bar.sync 0, 128 that Triton's shared-memory pass puts before a "
        "publish's first store (PTX of tlx_fwd_dynamic_sparse bf16 d128 causal, bench/NOTES.md, "
        "session 17)"
    ),
    ("*", "api CUDA_ERROR_INVALID_VALUE", "cuFuncSetAttribute"): (
        "Triton's loader (backends/nvidia/driver.c, loadBinary) first asks for "
        "CU_FUNC_ATTRIBUTE_SHARED_MEMORY_MODE (oversized shared memory) and falls back to the "
        "legacy MAX_DYNAMIC_SHARED_SIZE_BYTES when the driver refuses it: a probe, once per "
        "kernel loaded with more than 48 KB of shared memory, not an error of a kernel"
    ),
}

SUMMARY = re.compile(r"(?:ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error)")
# racecheck: "Error: Race reported between Write access at K+0x.. in FILE:LINE"
#            "    and Read access at K+0x.. in FILE:LINE [N hazards]"
RACE_1 = re.compile(r"Race reported between (\w+) access at (\S+) in (\S+):(\d+)")
RACE_2 = re.compile(r"and (\w+) access at (\S+) in (\S+):(\d+)(?: \[(\d+) hazards?\])?")
# memcheck / initcheck / synccheck: a report header, then "at FUNC+0x.. in FILE:LINE"
API = re.compile(r"Program hit (\S+) .*on CUDA API call to (\w+)")
HEADER = re.compile(r"========= (Invalid __\w+__ .*|Uninitialized __\w+__ .*|Barrier error .*)$")
AT = re.compile(r"=========\s+at (\S+) in (\S+):(\d+)")


@functools.cache
def _functions(path: str) -> list[tuple[int, int, str]]:
    """``(first line, last line, name)`` of every function in the Python file ``path``."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError):
        return []
    return [
        (n.lineno, n.end_lineno or n.lineno, n.name)
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def place(path: str, line: int, roots: list[Path]) -> str:
    """``module.function`` of ``path:line`` (the innermost function; the path is looked up
    under ``roots`` by its tail when the log was written on another machine). A report on a
    function's ``def`` line or on a ``with tlx.async_tasks()`` line, where the source itself
    touches no memory (Triton attributes its own generated code there), is
    ``module.function@def`` / ``module.function@async_tasks``."""
    candidates = [Path(path)] + [r / Path(path).relative_to(Path(path).anchor) for r in roots]
    parts = Path(path).parts
    for r in roots:
        for i in range(len(parts)):
            candidates.append(r.joinpath(*parts[i:]))
    for r in roots:  # a bare file name (the kernels' source as Triton records it)
        candidates += sorted(q for q in r.rglob(Path(path).name) if not {".git", ".nox", ".gpu"} & set(q.parts))
    for c in candidates:
        if c.is_file():
            inner = [f for f in _functions(str(c)) if f[0] <= line <= f[1]]
            fn = min(inner, key=lambda f: f[1] - f[0]) if inner else None
            name = f"{c.stem}.{fn[2] if fn else '<module>'}"
            text = c.read_text().splitlines()[line - 1].strip() if 0 < line <= len(c.read_text().splitlines()) else ""
            if fn and line == fn[0]:
                return name + "@def"
            if text.startswith("with tlx.async_tasks("):
                return name + "@async_tasks"
            return name
    return f"{Path(path).name}:{line}"


def known(tool: str, first: str, second: str) -> str | None:
    """The reason ``KNOWN`` documents for a report (its keys may use ``fnmatch`` patterns)."""
    for (t, a, b), why in KNOWN.items():
        if fnmatch.fnmatchcase(tool, t) and fnmatch.fnmatchcase(first, a) and fnmatch.fnmatchcase(second, b):
            return why
    return None


def summarize(log: Path, roots: list[Path]) -> tuple[str, list[str], bool]:
    """``(tool, report lines, clean)`` of one log."""
    tool = log.stem.removeprefix("sanitize-")
    text = log.read_text(errors="replace").splitlines()
    found = [int(m.group(1) or m.group(2)) for line in text if (m := SUMMARY.search(line))]
    lines: list[str] = []
    clean = True
    if not found:
        return tool, [f"  no ERROR SUMMARY: the run did not finish (see {log.name})"], False
    races: Counter[tuple[str, str, str, str]] = Counter()
    others: Counter[tuple[str, str]] = Counter()
    pending = None
    header = None
    for line in text:
        if m := RACE_1.search(line):
            pending = (m.group(1), place(m.group(3), int(m.group(4)), roots))
        elif pending and (m := RACE_2.search(line)):  # one line per partner access
            races[(pending[0], pending[1], m.group(1), place(m.group(3), int(m.group(4)), roots))] += int(m.group(5) or 1)
        elif pending and not line.strip("= "):
            pending = None
        elif m := API.search(line):
            others[(f"api {m.group(1)}", m.group(2))] += 1
        elif m := HEADER.search(line):
            header = m.group(1).split(" at ")[0].strip()
        elif header and (m := AT.search(line)):
            others[(header, place(m.group(2), int(m.group(3)), roots))] += 1
            header = None
    lines.append(f"  {sum(found)} errors reported (ERROR SUMMARY of {len(found)} process(es))")
    for (k1, p1, k2, p2), n in races.most_common():
        why = known(tool, p1, p2) or known(tool, p2, p1)
        clean &= why is not None
        lines.append(f"  race: {k1} in {p1} vs {k2} in {p2}: {n} hazards" + (f"  [known: {why}]" if why else "  [NOT DOCUMENTED]"))
    for (what, p), n in others.most_common():
        why = known(tool, what, p)
        clean &= why is not None
        lines.append(f"  {what} in {p}: {n}" + (f"  [known: {why}]" if why else "  [NOT DOCUMENTED]"))
    if sum(found) and not races and not others:
        lines.append("  (errors without a kernel location: API errors; see the log)")
        clean = False
    return tool, lines, clean


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--root", action="append", type=Path, default=[Path.cwd()],
                        help="where to look the reports' source files up (default: the working directory)")
    args = parser.parse_args(argv)
    ok = True
    for log in args.logs:
        tool, lines, clean = summarize(log, args.root)
        ok &= clean
        print(f"{tool}: {'clean' if clean else 'NOT CLEAN'}")
        print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
