"""Print the SASS around the kernel offsets a compute-sanitizer log reports (``Kernel+0x2050``),
from the cubins of Triton's cache: the instruction a report points at, and the ones around it,
for every cached cubin of that kernel name (the log does not say which configuration ran).

    python bench/probes/sass_at.py OUT/sanitize-racecheck.log --cache $TRITON_CACHE_DIR

The racecheck report at a kernel's first line, in the minimal ring kernel (fresh cache, so one cubin):

    TRITON_CACHE_DIR=/tmp/tc-probe compute-sanitizer --tool racecheck python bench/probes/race_record_ring.py --kernel ring > race.log
    python bench/probes/sass_at.py race.log --cache /tmp/tc-probe --all
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

AT = re.compile(r"(\w+)\+0x([0-9a-f]+) in (\S+)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".triton" / "cache")
    parser.add_argument("--around", type=int, default=6, help="instructions either side")
    parser.add_argument("--max-cubins", type=int, default=4)
    parser.add_argument("--all", action="store_true", help="print each cubin's whole SASS, marking the reported offsets")
    args = parser.parse_args()
    wanted: dict[str, set[int]] = {}
    for m in AT.finditer(args.log.read_text(errors="replace")):
        wanted.setdefault(m.group(1), set()).add(int(m.group(2), 16))
    for kernel, offsets in sorted(wanted.items()):
        cubins = sorted(args.cache.rglob(f"{kernel}.cubin"))[: args.max_cubins]
        print(f"== {kernel}: offsets {', '.join(hex(o) for o in sorted(offsets))}; {len(cubins)} cubin(s)")
        for cubin in cubins:
            sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True).stdout.splitlines()
            rows = [(int(m.group(1), 16), line.strip()) for line in sass if (m := re.search(r"/\*([0-9a-f]{4,})\*/", line))]
            print(f"-- {cubin.parent.name[:12]}/{cubin.name}: {len(rows)} instructions")
            if args.all:
                for a, text in rows:
                    print(f"   {'>>' if a in offsets else '  '} {text}")
                continue
            for off in sorted(offsets):
                idx = next((i for i, (a, _) in enumerate(rows) if a == off), None)
                if idx is None:
                    print(f"   {hex(off)}: not in this cubin")
                    continue
                for a, text in rows[max(0, idx - args.around): idx + args.around + 1]:
                    print(f"   {'>>' if a == off else '  '} {text}")
                print()


if __name__ == "__main__":
    main()
