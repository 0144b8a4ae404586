"""Sessions for the jagflash monorepo.

Every session runs in ONE shared virtualenv, ``.nox/jagflash``: a venv with torch costs about
60 s and 2 GB here, so one per session would spend CI's time installing. The venv holds every
distribution of the repo as an editable install plus the test tools, all pinned through
``constraints.txt``. It is reinstalled only when its stamp (a hash of constraints.txt, each
distribution's pyproject.toml and the install command) changes; ``rm -rf .nox/jagflash`` forces
a fresh one.

    nox                          lint, core, tests-<every variant>, compat, wheels, example-recsys,
                                 bench-smoke, compile-sm90
    nox -s build                 every wheel and sdist into .nox/dist, twine-checked
    nox -s format                ruff format --check (not in the default run yet)
    nox -s tests-jagged -- -k causal -x
    nox -s demo -- --help
    nox -s bench -- --help
    nox -s nightly               the CPU suite with hypothesis's nightly profile (~10,000 examples)

The distributed tests (``core/tests/test_context_parallel.py`` in ``core``,
``variants/jagged/tests/test_distributed.py`` in ``tests-jagged``) spawn 2 and 4 gloo ranks
inside the test, each with a timeout; they are marked ``interpret`` and run on the CPU only.

Without a GPU (no working ``nvidia-smi -L`` and no /dev/nvidia0) sessions that run kernels set
``TRITON_INTERPRET=1``; test sessions use the hypothesis profile ``ci`` unless
``HYPOTHESIS_PROFILE`` is already set.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2024.10.9"

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".nox" / "jagflash"
STAMP = VENV / "jagflash-stamp.txt"
LOCK = ROOT / ".nox" / "jagflash.lock"
BIN = VENV / ("Scripts" if sys.platform == "win32" else "bin")
PYTHON = BIN / ("python.exe" if sys.platform == "win32" else "python")

# Installed beside the repo's distributions; versions come from constraints.txt.
TEST_TOOLS = (
    "pytest", "pytest-xdist", "hypothesis", "ruff", "import-linter", "matplotlib", "numpy", "triton-utlx",
    "build", "twine",  # nox -s build / wheels
)
# The build backend every pyproject names, installed first so that the editable installs run
# without build isolation: an isolated build env per distribution costs ~4 s each, ~0.5 s here.
BUILD_TOOLS = ("hatchling", "editables")
# pytest-xdist gains 1.3x on the 2-core CPU machine (TOOLCHAIN.md); posargs may override.
XDIST = ("-n", "2")


def _variants() -> list[str]:
    """Every directory under variants/: each gets a tests-<name> session, finished or not."""
    root = ROOT / "variants"
    if not root.is_dir():
        return []
    return sorted(
        p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
    )


def _distributions() -> list[Path]:
    """Directories pip installs: core and testing first, then the variants, compat, bench."""
    return [
        ROOT / "core",
        ROOT / "testing",
        *(ROOT / "variants" / name for name in _variants()),
        ROOT / "compat",
        ROOT / "bench",
    ]


def _install_args(dists: list[Path]) -> list[str]:
    args = ["install", "-c", "constraints.txt", "--no-build-isolation"]
    for d in dists:
        args += ["-e", f"./{d.relative_to(ROOT).as_posix()}"]
    return [*args, *TEST_TOOLS]


def _stamp(dists: list[Path], install_args: list[str]) -> str:
    """What the venv was installed from. The root pyproject.toml (the meta-distribution, which
    the venv does not install, and ruff and pytest settings) is left out; editable installs
    pick up source edits by themselves."""
    digest = hashlib.sha256()
    digest.update(sys.version.encode())
    digest.update(json.dumps([BUILD_TOOLS, install_args]).encode())
    for path in [ROOT / "constraints.txt", *(d / "pyproject.toml" for d in dists)]:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@contextlib.contextmanager
def _locked():
    """Serialise venv updates between `nox --parallel` worker processes."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "w") as fh:
        try:
            import fcntl
        except ImportError:  # Windows: no parallel-safety, still correct when run serially
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _install(session: nox.Session, dists: list[Path], args: list[str]) -> None:
    if not PYTHON.exists():
        session.log(f"creating the shared venv {VENV.relative_to(ROOT)}")
        session.run(sys.executable, "-m", "venv", str(VENV), external=True)
    else:
        # Editable installs of distributions that were renamed or removed would leave ghost
        # entry points behind: drop every jagflash-* before installing again.
        listed = subprocess.run(
            [PYTHON, "-m", "pip", "list", "--format=json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        stale = [d["name"] for d in json.loads(listed) if d["name"].startswith("jagflash-")]
        if stale:
            session.run(str(PYTHON), "-m", "pip", "uninstall", "-y", *stale, external=True)
    session.run(
        str(PYTHON), "-m", "pip", "install", "-c", "constraints.txt", *BUILD_TOOLS, external=True
    )
    session.log("installing " + ", ".join(d.relative_to(ROOT).as_posix() for d in dists))
    session.run(str(PYTHON), "-m", "pip", *args, external=True)


def _ensure_venv(session: nox.Session) -> None:
    """Create or refresh the shared venv when its stamp is stale, then point the session at it."""
    dists = _distributions()
    # Without core/ pip would look for jagflash-core on the package index: refuse instead.
    missing = [
        d.relative_to(ROOT).as_posix() for d in dists if not (d / "pyproject.toml").is_file()
    ]
    if missing:
        session.error(f"no pyproject.toml in {', '.join(missing)} (python tools/check_layout.py)")
    args = _install_args(dists)
    want = _stamp(dists, args)
    with _locked():
        if not STAMP.is_file() or STAMP.read_text().strip() != want:
            STAMP.unlink(missing_ok=True)
            _install(session, dists, args)
            STAMP.write_text(want + "\n")
    session.env["VIRTUAL_ENV"] = str(VENV)
    session.env["PATH"] = os.pathsep.join([str(BIN), os.environ.get("PATH", "")])


@functools.cache
def _has_gpu() -> bool:
    if Path("/dev/nvidia0").exists():
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and b"GPU" in done.stdout


def _kernel_env(session: nox.Session, *, tests: bool) -> None:
    """Variables that must be set before any kernel module is imported."""
    if "TRITON_INTERPRET" not in os.environ and not _has_gpu():
        session.log("no GPU found: TRITON_INTERPRET=1 (Triton interpreter on the CPU)")
        session.env["TRITON_INTERPRET"] = "1"
    if tests and "HYPOTHESIS_PROFILE" not in os.environ and "HYPOTHESIS_PROFILE" not in session.env:
        session.env["HYPOTHESIS_PROFILE"] = "ci"


def _py(session: nox.Session, *args: str) -> None:
    # triton-utlx's .pth appends its plugin library to TRITON_PLUGIN_PATHS in every Python it
    # starts; a nox run from another venv with uTLX (an activated dev venv) would hand its own
    # library down, and Triton then registers the TLX dialect twice and aborts ("Trying to
    # register different dialects for the same namespace: tlx"). Each session's Python adds
    # its own.
    session.env["TRITON_PLUGIN_PATHS"] = ""
    session.run(str(PYTHON), *args, external=True)


def _pytest(session: nox.Session, *paths: str) -> None:
    _ensure_venv(session)
    _kernel_env(session, tests=True)
    _py(session, "-m", "pytest", *XDIST, *paths, *session.posargs)


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """The layout check (tools/check_layout.py), one version everywhere (tools/versions.py),
    the import contracts (import-linter, from
    pyproject.toml: core imports no variant, testing or bench; no variant imports another; no
    import cycles; deferred imports count) and ruff check."""
    _ensure_venv(session)
    _py(session, "tools/check_layout.py")
    _py(session, "tools/versions.py")
    session.run(str(BIN / "lint-imports"), "--no-cache", external=True)
    _py(session, "-m", "ruff", "check", ".", *session.posargs)


# Not in the default run yet: kernels lay their arguments out by hand, which the formatter would
# undo; once they carry `# fmt: off/on` (or the team settles on the formatter), make it default.
@nox.session(name="format", venv_backend="none", default=False)
def format_check(session: nox.Session) -> None:
    """ruff format --check (`nox -s format -- --diff` shows the changes)."""
    _ensure_venv(session)
    _py(session, "-m", "ruff", "format", "--check", ".", *session.posargs)


@nox.session(venv_backend="none")
def core(session: nox.Session) -> None:
    """Tests of jagflash-core, jagflash-testing and tools/."""
    _pytest(session, "core/tests", "testing/tests", "tools/tests")


def _variant_session(name: str) -> None:
    def tests(session: nox.Session) -> None:
        _pytest(session, f"variants/{name}/tests")

    tests.__doc__ = f"Tests of jagflash-{name} (variants/{name}/tests)."
    nox.session(tests, name=f"tests-{name}", venv_backend="none")


for _name in _variants():
    _variant_session(_name)


@nox.session(venv_backend="none", default=False)
def build(session: nox.Session) -> None:
    """A wheel and an sdist of every distribution (core, testing, each variant, compat, bench and
    the meta-distribution ``jagflash``) into .nox/dist, checked by ``twine check --strict``
    (tools/wheels.py build; ``-- --out DIR`` elsewhere)."""
    _ensure_venv(session)
    _py(session, "tools/wheels.py", "build", *session.posargs)


@nox.session(venv_backend="none")
def wheels(session: nox.Session) -> None:
    """``build``, then the wheels installed into a fresh venv and called under the interpreter:
    jagflash-core + jagflash-jagged, then ``jagflash[all,tlx]`` (tools/wheels.py smoke: torch
    and Triton are the shared venv's, seen through a filtered site directory; ``-- --fresh-deps``
    installs them too)."""
    _ensure_venv(session)
    _py(session, "tools/wheels.py", "build")
    _py(session, "tools/wheels.py", "smoke", *session.posargs)


@nox.session(venv_backend="none")
def compat(session: nox.Session) -> None:
    """Tests of jagflash-compat (compat/tests: the FlashAttention and torch varlen drop-ins)."""
    _pytest(session, "compat/tests")


@nox.session(name="example-recsys", venv_backend="none")
def example_recsys(session: nox.Session) -> None:
    """The sequential recommender of docs/examples/recsys: its CPU tests (a tiny model trains a
    few steps and its loss falls). On a GPU, ``python docs/examples/recsys/train_gpu.py`` is the
    jagflash / padded SDPA / FA2 varlen comparison."""
    _pytest(session, "docs/examples")


@nox.session(venv_backend="none", default=False)
def nightly(session: nox.Session) -> None:
    """The CPU suite with the hypothesis profile ``nightly`` (about 10,000 examples over the
    property tests instead of ``ci``'s 300); arguments after ``--`` go to pytest."""
    session.env["HYPOTHESIS_PROFILE"] = "nightly"
    _pytest(session, "core/tests", "testing/tests", "variants", "compat/tests")


@nox.session(name="bench-smoke", venv_backend="none")
def bench_smoke(session: nox.Session) -> None:
    """The bench's tests, among them the CLI end to end in --smoke mode (tiny workloads under
    the interpreter: workloads, reference checks, CSV, markdown, PNG)."""
    _pytest(session, "bench/tests")


@nox.session(name="compile-sm90", venv_backend="none")
def compile_sm90(session: nox.Session) -> None:
    """Every TLX kernel configuration of the declared space (``jagflash.core.tlx.configs``)
    compiled for sm_90a on the CPU, one process per core, with its resource table.

    Fails on a compile error, on shared memory over an sm_90 block's budget, on missing
    wgmma / setmaxnreg / TMA, and on more spilled bytes than a configuration is known to need
    (``configs.KNOWN_SPILLS``; 8 for any other)."""
    _ensure_venv(session)
    # Off even when the caller's environment has it on (the interpreter cannot compile):
    # popping it from session.env would leave an inherited TRITON_INTERPRET=1 in place.
    session.env["TRITON_INTERPRET"] = "0"
    _py(session, "-m", "jagflash.core.compile_check", "--max-spill-bytes", "8", *session.posargs)


@nox.session(venv_backend="none", default=False)
def bench(session: nox.Session) -> None:
    """python -m jagflash.bench, arguments after `--` passed through."""
    _ensure_venv(session)
    _kernel_env(session, tests=False)
    _py(session, "-m", "jagflash.bench", *session.posargs)


@nox.session(venv_backend="none", default=False)
def demo(session: nox.Session) -> None:
    """python -m jagflash.variants.jagged.demo, arguments after `--` passed through."""
    _ensure_venv(session)
    _kernel_env(session, tests=False)
    _py(session, "-m", "jagflash.variants.jagged.demo", *session.posargs)
