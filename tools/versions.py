"""One version for every jagflash distribution: the root pyproject.toml's ``[project] version``.

    python tools/versions.py [--root DIR]            check; exit 1 listing every mismatch
    python tools/versions.py --write [--root DIR]    make every pyproject.toml agree

What agrees with the root version ``X.Y.Z``:
  each distribution's ``version`` (core/, testing/, compat/, bench/, variants/<name>/);
  each ``jagflash-*`` requirement inside them: ``>=X.Y,<X.(Y+1)`` (same minor series);
  the root's extras, between its ``# BEGIN extras`` and ``# END extras`` lines: one per variant
  (``jagflash-<name>==X.Y.Z``), ``compat`` (with the jagged variant, whose front door it uses),
  ``tlx`` (core's ``tlx`` extra) and ``all``; its one dependency ``jagflash-core==X.Y.Z``.

Standard library only, so it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import tomllib  # 3.11+: the tools run on the dev and CI interpreter, not the py310 floor

_VERSION_LINE = re.compile(r'^version = "([^"]*)"$', re.MULTILINE)
# A jagflash requirement with a range, e.g. "jagflash-core>=0.1,<0.2" or "jagflash-core[tlx]>=0.1,<0.2".
_RANGE = re.compile(r'"(jagflash-[a-z0-9-]+(?:\[[a-z0-9,-]+\])?)>=[^",]*,<[^",]*"')
_EXTRAS = re.compile(r"(# BEGIN extras[^\n]*\n)(.*?)(# END extras)", re.DOTALL)


def _dist_dirs(root: Path) -> list[Path]:
    fixed = [root / name for name in ("core", "testing", "compat", "bench")]
    variants = sorted(
        p for p in (root / "variants").glob("*") if p.is_dir() and not p.name.startswith((".", "_"))
    ) if (root / "variants").is_dir() else []
    return [d for d in [*fixed, *variants] if (d / "pyproject.toml").is_file()]


def _dist_name(path: Path) -> str:
    return tomllib.loads(path.read_text(encoding="utf-8"))["project"]["name"]


def series(version: str) -> str:
    """The requirement range of one minor series: ``0.1.3`` -> ``>=0.1,<0.2``."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return f">={major}.{minor},<{major}.{minor + 1}"


def extras_block(root: Path, version: str) -> str:
    """The root's extras table for ``version`` and the variants under ``root``."""
    variants = [_dist_name(d / "pyproject.toml") for d in _dist_dirs(root) if d.parent.name == "variants"]
    pins = {name: f'"{name}=={version}"' for name in variants}
    rows = [f"{name.removeprefix('jagflash-')} = [{pins[name]}]" for name in sorted(variants)]
    compat = f'"jagflash-compat=={version}"'
    jagged = [pins["jagflash-jagged"]] if "jagflash-jagged" in pins else []
    rows.append(f"compat = [{', '.join([compat, *jagged])}]")
    rows.append(f'tlx = ["jagflash-core[tlx]=={version}"]')
    rows.append(f"all = [{', '.join([*(pins[n] for n in sorted(variants)), compat])}]")
    return "[project.optional-dependencies]\n" + "\n".join(rows) + "\n"


def _synced(root: Path) -> dict[Path, str]:
    """Every pyproject.toml's text as it should be, by path."""
    top = root / "pyproject.toml"
    text = top.read_text(encoding="utf-8")
    version = tomllib.loads(text)["project"]["version"]
    want = {}
    new = re.sub(r'^dependencies = \["jagflash-core==[^"]*"\]$', f'dependencies = ["jagflash-core=={version}"]', text, flags=re.MULTILINE)
    want[top] = _EXTRAS.sub(lambda m: m.group(1) + extras_block(root, version) + m.group(3), new)
    for d in _dist_dirs(root):
        path = d / "pyproject.toml"
        text = path.read_text(encoding="utf-8")
        text = _VERSION_LINE.sub(f'version = "{version}"', text, count=1)
        want[path] = _RANGE.sub(lambda m: f'"{m.group(1)}{series(version)}"', text)
    return want


def check(root: Path) -> list[str]:
    """Every pyproject.toml under ``root`` that differs from what the root version asks, with
    its first differing line."""
    problems = []
    for path, text in _synced(root).items():
        have = path.read_text(encoding="utf-8")
        if have != text:
            line = next(
                (f"{a.strip()!r} should be {b.strip()!r}" for a, b in zip(have.splitlines(), text.splitlines()) if a != b),
                "its extras block",
            )
            problems.append(f"{path.relative_to(root).as_posix()}: {line}")
    top = (root / "pyproject.toml").read_text(encoding="utf-8")
    if not _EXTRAS.search(top):
        problems.append("pyproject.toml: no '# BEGIN extras' ... '# END extras' block")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--write", action="store_true", help="rewrite the pyproject.toml files")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.write:
        for path, text in _synced(root).items():
            if path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path.relative_to(root).as_posix()}")
    problems = check(root)
    if problems:
        print(f"versions: {len(problems)} pyproject.toml file(s) disagree with the root version", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        print("  (python tools/versions.py --write makes them agree)", file=sys.stderr)
        return 1
    version = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    print(f"versions: OK ({len(_dist_dirs(root)) + 1} distributions at {version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
