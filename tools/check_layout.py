"""Check the repository layout that DESIGN.md fixes; exit 1 listing every problem.

    python tools/check_layout.py [--root DIR]

Each directory under variants/ must have:
  pyproject.toml   dist ``jagflash-<name>``, an entry point ``<name>`` in the group
                   ``jagflash.variants`` pointing into ``jagflash.variants.<name>``, a dependency
                   on ``jagflash-core``, and ``packages = ["src/jagflash"]`` for the hatch wheel
  README.md        with a capability table (a markdown table)
  src/jagflash/variants/<name>/{__init__,spec,op,kernels_portable}.py
  tests/           holding at least one test_*.py

and across the repository:
  ``jagflash`` and ``jagflash.variants`` are PEP 420 namespaces: no ``src/jagflash/__init__.py``
  and no ``src/jagflash/variants/__init__.py`` in any distribution;
  nothing under core/ imports ``jagflash.variants`` or ``jagflash.bench``, and core's shipped
  code (core/src) does not import ``jagflash.testing`` either: dependencies point inward; core's
  tests may use the test infrastructure, which itself depends on core alone;
  no variant imports another variant (each one installs alone);
  bench/ holds no script at its top (probes and A/B harnesses live in bench/probes/), and
  bench/results/ holds no code, only one folder per run named ``YYYY-MM-DD-<short commit>``,
  each with a README.md.

Standard library only, so it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import tomllib  # 3.11+: the tools run on the dev and CI interpreter, not the py310 floor

REQUIRED_MODULES = ("__init__.py", "spec.py", "op.py", "kernels_portable.py")
ENTRY_POINT_GROUP = "jagflash.variants"
# Layers core/ must not reach: it sits at the centre and nothing it imports may depend on it.
FORBIDDEN_IN_CORE = ("jagflash.variants", "jagflash.bench", "jagflash.compat")
# Core's shipped code does not import the test infrastructure either; core/tests may (its
# references and strategies): a test-time dependency on a package that depends on core alone.
FORBIDDEN_IN_CORE_SRC = (*FORBIDDEN_IN_CORE, "jagflash.testing")
SKIPPED_DIRS = {"__pycache__", ".git", ".nox", ".venv", "build", "dist", ".pytest_cache"}
# A markdown table: a header row, then a delimiter row such as |---|:--:|.
_TABLE_DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)+\|?\s*$", re.MULTILINE)
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
# What counts as code under bench/results (recorded runs hold logs, data and notes).
CODE_SUFFIXES = (".py", ".sh", ".ipynb")
# A results folder: the date and the short commit the run measured.
_RESULTS_FOLDER = re.compile(r"\d{4}-\d{2}-\d{2}-[0-9a-f]{7,12}")


def _normalize(dist: str) -> str:
    """PEP 503 name normalisation: jagflash_Broadcast.Q -> jagflash-broadcast-q."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def _python_files(top: Path) -> Iterator[Path]:
    if not top.is_dir():
        return
    for path in sorted(top.rglob("*.py")):
        if not SKIPPED_DIRS.intersection(path.relative_to(top).parts):
            yield path


def _package_of(path: Path) -> str | None:
    """Dotted package a file under some ``src/`` belongs to (``jagflash.variants.x`` for
    ``.../src/jagflash/variants/x/op.py``), or None outside a src layout."""
    parts = path.parent.parts
    if "src" not in parts:
        return None
    return ".".join(parts[len(parts) - parts[::-1].index("src") :])


def _imported_modules(path: Path) -> Iterator[str]:
    """Absolute module names a file imports, relative imports resolved: ``from jagflash import
    bench`` yields both ``jagflash`` and ``jagflash.bench`` so that either spelling is caught."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = _package_of(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:
                try:
                    base = importlib.util.resolve_name("." * node.level + (base or ""), package)
                except (ImportError, ValueError):  # outside a src layout, or above its top
                    continue
            yield base
            for alias in node.names:
                yield f"{base}.{alias.name}"


def _imports_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _check_imports(root: Path, top: Path, forbidden, problems: list[str]) -> None:
    """Append a problem for each import under ``top`` for which ``forbidden(path, module)``
    returns a reason."""
    for path in _python_files(top):
        rel = path.relative_to(root).as_posix()
        try:
            modules = sorted(set(_imported_modules(path)))
        except SyntaxError as exc:
            problems.append(f"{rel}: cannot be parsed ({exc.msg}, line {exc.lineno})")
            continue
        for module in modules:
            reason = forbidden(path, module)
            if reason:
                problems.append(f"{rel}: imports {module} ({reason})")


def _check_pyproject(root: Path, vdir: Path, name: str, problems: list[str]) -> None:
    path = vdir / "pyproject.toml"
    rel = path.relative_to(root).as_posix()
    if not path.is_file():
        problems.append(f"{rel}: missing")
        return
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        problems.append(f"{rel}: not valid TOML ({exc})")
        return
    project = data.get("project", {})
    dist = project.get("name", "")
    if _normalize(dist) != _normalize(f"jagflash-{name}"):
        problems.append(f"{rel}: [project] name is {dist!r}, expected 'jagflash-{name}'")
    entry_points = project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    target = entry_points.get(name)
    if target is None:
        problems.append(
            f'{rel}: no entry point {name!r} in [project.entry-points."{ENTRY_POINT_GROUP}"]'
        )
    elif not re.fullmatch(rf"jagflash\.variants\.{re.escape(name)}(\.\w+)*(:[\w.]+)?", target):
        problems.append(
            f"{rel}: entry point {name} = {target!r} does not point into jagflash.variants.{name}"
        )
    deps = [_REQUIREMENT_NAME.match(d) for d in project.get("dependencies", [])]
    if not any(m and _normalize(m.group(1)) == "jagflash-core" for m in deps):
        problems.append(f"{rel}: [project] dependencies lack jagflash-core")
    packages = (
        data.get("tool", {})
        .get("hatch", {})
        .get("build", {})
        .get("targets", {})
        .get("wheel", {})
        .get("packages")
    )
    if packages != ["src/jagflash"]:
        problems.append(
            f'{rel}: [tool.hatch.build.targets.wheel] packages is {packages!r}, expected ["src/jagflash"]'
        )


def _check_variant(root: Path, vdir: Path, problems: list[str]) -> None:
    name = vdir.name
    rel = vdir.relative_to(root).as_posix()
    if not name.isidentifier():
        problems.append(f"{rel}: variant name {name!r} is not a Python identifier")
        return
    _check_pyproject(root, vdir, name, problems)

    readme = vdir / "README.md"
    if not readme.is_file():
        problems.append(f"{rel}/README.md: missing")
    elif not _TABLE_DELIMITER.search(readme.read_text(encoding="utf-8")):
        problems.append(f"{rel}/README.md: no capability table (a markdown table)")

    pkg = vdir / "src" / "jagflash" / "variants" / name
    for module in REQUIRED_MODULES:
        if not (pkg / module).is_file():
            problems.append(f"{(pkg / module).relative_to(root).as_posix()}: missing")

    tests = vdir / "tests"
    if not tests.is_dir():
        problems.append(f"{rel}/tests/: missing")
    elif not any(tests.rglob("test_*.py")):
        problems.append(f"{rel}/tests/: no test_*.py")

    def other_variant(_path: Path, module: str) -> str | None:
        if not _imports_under(module, "jagflash.variants"):
            return None
        other = module.split(".")[2] if module.count(".") >= 2 else None
        if other is not None and other != name:
            return f"a variant never imports another variant; move what {name} and {other} share into core"
        return None

    _check_imports(root, vdir, other_variant, problems)


def _check_bench(root: Path, problems: list[str]) -> None:
    """Probes are scripts of bench/probes/; bench/results/ holds recorded runs, no code."""
    bench = root / "bench"
    for path in sorted(bench.glob("*.py")):
        problems.append(
            f"{path.relative_to(root).as_posix()}: a script at the top of bench/ "
            "(probes and A/B harnesses live in bench/probes/)"
        )
    results = bench / "results"
    if not results.is_dir():
        return
    for path in sorted(results.rglob("*")):
        parts = path.relative_to(results).parts
        if path.is_file() and path.suffix in CODE_SUFFIXES and not SKIPPED_DIRS.intersection(parts):
            problems.append(
                f"{path.relative_to(root).as_posix()}: code under bench/results "
                "(results hold logs and data; probes live in bench/probes/)"
            )
    for folder in sorted(p for p in results.iterdir() if p.is_dir() and not p.name.startswith(".")):
        rel = folder.relative_to(root).as_posix()
        if not _RESULTS_FOLDER.fullmatch(folder.name):
            problems.append(f"{rel}/: a results folder is named YYYY-MM-DD-<short commit>")
        if not (folder / "README.md").is_file():
            problems.append(f"{rel}/README.md: missing (what ran, on which trees)")


def _variant_dirs(root: Path) -> list[Path]:
    """Every directory under variants/ (the same list noxfile.py makes sessions from)."""
    variants = root / "variants"
    if not variants.is_dir():
        return []
    return sorted(p for p in variants.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def check(root: Path) -> list[str]:
    """Every layout problem under ``root``, as lines ``path: what is wrong``."""
    problems: list[str] = []

    for dist in [root / "core", root / "testing", root / "compat", root / "bench", *_variant_dirs(root)]:
        for init in ("src/jagflash/__init__.py", "src/jagflash/variants/__init__.py"):
            if (dist / init).exists():
                problems.append(
                    f"{(dist / init).relative_to(root).as_posix()}: must not exist "
                    "(jagflash and jagflash.variants are PEP 420 namespace packages)"
                )

    core_src = root / "core" / "src"

    def outer_layer(path: Path, module: str) -> str | None:
        shipped = core_src in path.parents
        for prefix in FORBIDDEN_IN_CORE_SRC if shipped else FORBIDDEN_IN_CORE:
            if _imports_under(module, prefix):
                return f"core must not depend on {prefix}; dependencies point inward"
        return None

    _check_imports(root, root / "core", outer_layer, problems)

    for vdir in _variant_dirs(root):
        _check_variant(root, vdir, problems)
    _check_bench(root, problems)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="repository root (default: the one holding this script)",
    )
    root = parser.parse_args(argv).root.resolve()
    problems = check(root)
    if problems:
        print(f"layout check: {len(problems)} problem(s) under {root}", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"layout check: OK ({len(_variant_dirs(root))} variant(s) under {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
