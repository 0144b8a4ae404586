"""tools/new_variant.py and tools/check_layout.py, exercised on scratch repository trees."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent
REPO = TOOLS.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"jagflash_tools_{name}", TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


new_variant = _load("new_variant")
check_layout = _load("check_layout")

NAME = "toy"
VDIR = Path("variants", NAME)
PKG = VDIR / "src/jagflash/variants" / NAME
REQUIRED = [
    VDIR / "pyproject.toml",
    VDIR / "README.md",
    PKG / "__init__.py",
    PKG / "spec.py",
    PKG / "op.py",
    PKG / "kernels_portable.py",
]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A scratch repository holding one freshly scaffolded variant."""
    assert new_variant.main([NAME, "--root", str(tmp_path)]) == 0
    return tmp_path


def _problems(root: Path) -> str:
    return "\n".join(check_layout.check(root))


def test_scaffold_passes_the_layout_check(root: Path):
    assert check_layout.check(root) == []
    assert check_layout.main(["--root", str(root)]) == 0


@pytest.mark.parametrize("missing", REQUIRED, ids=lambda p: p.name)
def test_layout_check_names_a_missing_file(root: Path, missing: Path):
    (root / missing).unlink()
    assert f"{missing.as_posix()}: missing" in _problems(root)
    assert check_layout.main(["--root", str(root)]) == 1


def test_layout_check_wants_a_test_file(root: Path):
    (root / VDIR / "tests" / f"test_{NAME}.py").unlink()
    assert f"{VDIR.as_posix()}/tests/: no test_*.py" in _problems(root)
    shutil.rmtree(root / VDIR / "tests")
    assert f"{VDIR.as_posix()}/tests/: missing" in _problems(root)


def test_layout_check_lists_every_problem(root: Path):
    for rel in REQUIRED[2:]:
        (root / rel).unlink()
    problems = check_layout.check(root)
    assert [p for p in problems if p.endswith(": missing")] == [
        f"{rel.as_posix()}: missing" for rel in REQUIRED[2:]
    ]


def test_layout_check_wants_a_capability_table(root: Path):
    (root / VDIR / "README.md").write_text("# jagflash-toy\n\nNo table here.\n---\n")
    assert "README.md: no capability table" in _problems(root)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (f'{NAME} = "jagflash.variants.{NAME}:VARIANT"', "", "no entry point 'toy'"),
        (
            f'{NAME} = "jagflash.variants.{NAME}:VARIANT"',
            f'{NAME} = "jagflash.variants.other:VARIANT"',
            "does not point into jagflash.variants.toy",
        ),
        ('"jagflash-core>=0.1,<0.2"', '"torch"', "dependencies lack jagflash-core"),
        ('name = "jagflash-toy"', 'name = "toy"', "expected 'jagflash-toy'"),
        ('packages = ["src/jagflash"]', 'packages = ["src/jagflash/variants"]', "packages is"),
        ("[project]", "[project", "not valid TOML"),
    ],
)
def test_layout_check_reads_the_pyproject(root: Path, old: str, new: str, expected: str):
    path = root / VDIR / "pyproject.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    assert expected in _problems(root)


def test_layout_check_accepts_normalised_names(root: Path):
    path = root / VDIR / "pyproject.toml"
    path.write_text(path.read_text().replace('"jagflash-core>=', '"jagflash_Core >='))
    assert check_layout.check(root) == []


@pytest.mark.parametrize(
    "init", ["core/src/jagflash/__init__.py", f"{VDIR}/src/jagflash/variants/__init__.py"]
)
def test_layout_check_keeps_namespaces_pep420(root: Path, init: str):
    (root / init).parent.mkdir(parents=True, exist_ok=True)
    (root / init).write_text("")
    assert f"{init}: must not exist" in _problems(root)


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("import jagflash.variants.jagged\n", "jagflash.variants.jagged"),
        ("from jagflash import bench\n", "jagflash.bench"),
        ("from jagflash.testing.reference import attention\n", "jagflash.testing.reference"),
        ("def f():\n    from ..bench import report\n", "jagflash.bench.report"),
    ],
)
def test_layout_check_keeps_core_inward(root: Path, source: str, module: str):
    path = root / "core/src/jagflash/core/registry.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    assert f"core/src/jagflash/core/registry.py: imports {module} (core must not" in _problems(root)


def test_layout_check_lets_core_tests_use_the_test_infrastructure(root: Path):
    path = root / "core/tests/test_offsets.py"
    path.parent.mkdir(parents=True)
    path.write_text("from jagflash.testing import strategies\n")
    assert check_layout.check(root) == []
    path.write_text("from jagflash.variants.jagged import jagged_attention\n")
    assert "core/tests/test_offsets.py: imports jagflash.variants.jagged" in _problems(root)


def test_layout_check_allows_core_to_import_itself(root: Path):
    path = root / "core/src/jagflash/core/registry.py"
    path.parent.mkdir(parents=True)
    path.write_text(
        "import jagflash.core.math\nfrom . import capability\nfrom jagflash import core\n"
    )
    assert check_layout.check(root) == []


@pytest.mark.parametrize(
    "source",
    [
        "from jagflash.variants.jagged.op import jagged_attention\n",
        "from jagflash.variants import jagged\n",
        "from ..jagged import op\n",
    ],
)
def test_layout_check_keeps_variants_apart(root: Path, source: str):
    (root / PKG / "op.py").write_text(source)
    problems = _problems(root)
    assert f"{PKG.as_posix()}/op.py: imports jagflash.variants.jagged" in problems
    assert "never imports another variant" in problems


def test_layout_check_allows_a_variant_its_own_modules(root: Path):
    (root / PKG / "op.py").write_text(
        f"from jagflash.variants.{NAME} import kernels_portable\nfrom . import spec\n"
        "from jagflash.core import capability\n"
    )
    assert check_layout.check(root) == []


def test_layout_check_reports_unparsable_files(root: Path):
    (root / PKG / "op.py").write_text("def broken(:\n")
    assert f"{PKG.as_posix()}/op.py: cannot be parsed" in _problems(root)


def _results_run(root: Path, name: str = "2026-12-01-00b54e4") -> Path:
    folder = root / "bench/results" / name
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("# a run\n")
    (folder / "results.csv").write_text("workload\n")
    return folder


def test_layout_check_accepts_probes_and_recorded_runs(root: Path):
    (root / "bench/probes").mkdir(parents=True)
    (root / "bench/probes/tlx_ab.py").write_text("")
    (root / "bench/gpu.sh").write_text("")
    run = _results_run(root)
    (run / "graph-call4").mkdir()
    (run / "graph-call4/bench.log").write_text("")
    (root / "bench/results/README.md").write_text("# results\n")
    assert check_layout.check(root) == []


@pytest.mark.parametrize("script", ["probe.py", "graph-call4/replay.py", "run.sh"])
def test_layout_check_finds_code_under_bench_results(root: Path, script: str):
    path = _results_run(root) / script
    path.parent.mkdir(exist_ok=True)
    path.write_text("")
    rel = f"bench/results/2026-12-01-00b54e4/{script}"
    assert f"{rel}: code under bench/results" in _problems(root)


def test_layout_check_keeps_probes_in_bench_probes(root: Path):
    (root / "bench").mkdir()
    (root / "bench/probe_backward.py").write_text("")
    assert "bench/probe_backward.py: a script at the top of bench/" in _problems(root)


@pytest.mark.parametrize("name", ["2026-12-01-h200-s9", "2026-12-01", "26-12-01-00b54e4"])
def test_layout_check_names_results_folders_by_date_and_commit(root: Path, name: str):
    _results_run(root, name)
    assert f"bench/results/{name}/: a results folder is named" in _problems(root)


def test_layout_check_wants_a_readme_per_run(root: Path):
    (_results_run(root) / "README.md").unlink()
    assert "bench/results/2026-12-01-00b54e4/README.md: missing" in _problems(root)


def test_scaffolder_refuses_to_overwrite(root: Path, capsys):
    readme = root / VDIR / "README.md"
    readme.write_text("mine\n")
    assert new_variant.main([NAME, "--root", str(root)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert readme.read_text() == "mine\n"


@pytest.mark.parametrize("name", ["Toy", "1toy", "to-y", "class", ""])
def test_scaffolder_refuses_bad_names(tmp_path: Path, name: str):
    assert new_variant.main([name, "--root", str(tmp_path)]) == 2
    assert not (tmp_path / "variants").exists()


def test_scaffold_raises_until_written(root: Path):
    def load(rel: str):
        spec = importlib.util.spec_from_file_location(f"toy_{Path(rel).stem}", root / rel)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    with pytest.raises(NotImplementedError, match=r"write op\.py"):
        load(f"{PKG}/op.py").toy_attention()
    with pytest.raises(NotImplementedError, match=r"write kernels_portable\.py"):
        load(f"{PKG}/kernels_portable.py").toy_forward()
    with pytest.raises(NotImplementedError, match=r"write spec\.py"):
        _ = load(f"{PKG}/spec.py").SPEC
    with pytest.raises(pytest.fail.Exception, match="is a scaffold"):
        load(f"{VDIR}/tests/test_{NAME}.py").test_toy_has_tests()


def test_scaffold_is_lint_clean(root: Path):
    """`nox -s lint` runs over the whole tree, scaffolds included; a long name must not push
    the generated imports past the line length."""
    assert new_variant.main(["a_rather_long_variant_name_to_test_lines", "--root", str(root)]) == 0
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    for args in (["check"], ["format", "--check"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--no-cache", "."],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_command_lines(tmp_path: Path):
    """The scripts as a person runs them: exit codes, and the missing file named on stderr."""

    def run(script: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(TOOLS / script), *args, "--root", str(tmp_path)],
            capture_output=True,
            text=True,
            check=False,
        )

    made = run("new_variant.py", NAME)
    assert made.returncode == 0, made.stderr
    ok = run("check_layout.py")
    assert ok.returncode == 0, ok.stderr
    assert "layout check: OK (1 variant(s)" in ok.stdout
    (tmp_path / PKG / "spec.py").unlink()
    bad = run("check_layout.py")
    assert bad.returncode == 1
    assert f"{PKG.as_posix()}/spec.py: missing" in bad.stderr
