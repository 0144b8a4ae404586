"""Build every jagflash distribution, then install the wheels into a fresh venv and call them.

    python tools/wheels.py build [--out DIR]          wheel + sdist of each, twine check --strict
    python tools/wheels.py smoke [--out DIR] [--fresh-deps]

``build`` runs ``python -m build --no-isolation`` (the running Python must have ``build``,
``hatchling`` and ``twine``: the shared nox venv has them) on core/, testing/, compat/, bench/,
each variants/<name>/ and the root meta-distribution ``jagflash``, into DIR (default
``.nox/dist``, emptied first).

``smoke`` installs from DIR only (``pip --no-index --find-links DIR``) into a fresh venv
(``.nox/wheels-smoke``, recreated), in two rounds, each followed by a call under the Triton
interpreter from outside the repository that checks the code ran from the venv's wheels:

1. ``jagflash-core`` + ``jagflash-jagged``: a jagged causal forward and backward against the
   reference backend;
2. the meta-distribution ``jagflash[all,tlx]``: the same through the front door
   ``jagflash.core.attention`` and ``jagflash.compat.flash_attn_varlen_func``.

Torch, Triton and numpy are not installed again: the fresh venv sees the running Python's
third-party packages through a site directory of links that leaves every jagflash
distribution, editable hook and ``.pth`` file out, so that only the wheels provide jagflash.
``--fresh-deps`` installs them into the venv instead (from the pip cache or the index, with the
pins of constraints.txt; about a minute for torch's CPU wheel).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / ".nox" / "dist"
SMOKE = ROOT / ".nox" / "wheels-smoke"
# Names in site-packages that belong to jagflash's own installs (editable or not) or run code
# at start-up; the smoke venv must see none of them.
_LEFT_OUT = ("jagflash", "_editable_impl_", "__editable__", "__pycache__")


def _sources() -> list[Path]:
    variants = sorted(p for p in (ROOT / "variants").iterdir() if (p / "pyproject.toml").is_file())
    return [ROOT / "core", ROOT / "testing", *variants, ROOT / "compat", ROOT / "bench", ROOT]


def _run(*cmd: object, **kw) -> None:
    print("+ " + " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def build(out: Path) -> list[Path]:
    """Every wheel and sdist into ``out``; twine check --strict on all of them."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for src in _sources():
        print(f"+ python -m build --no-isolation --outdir {out} {src}", flush=True)
        done = subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
            capture_output=True, text=True, check=False,
        )
        if done.returncode:
            raise SystemExit(f"building {src} failed:\n{done.stdout}{done.stderr}")
    files = sorted(out.iterdir())
    _run(sys.executable, "-m", "twine", "check", "--strict", *files)
    wheels = [f for f in files if f.suffix == ".whl"]
    if len(wheels) != len(_sources()) or len(files) != 2 * len(_sources()):
        raise SystemExit(f"expected a wheel and an sdist for each of {len(_sources())} distributions, got {[f.name for f in files]}")
    return files


def _deps_site(venv: Path) -> Path:
    """A directory of links to this Python's site-packages entries, jagflash's left out."""
    site = Path(sysconfig.get_paths()["purelib"])
    deps = venv / "shared-deps"
    deps.mkdir()
    for entry in site.iterdir():
        if entry.name.startswith(_LEFT_OUT) or entry.suffix == ".pth":
            continue
        (deps / entry.name).symlink_to(entry)
    return deps


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def smoke(out: Path, fresh_deps: bool) -> None:
    started = time.perf_counter()
    shutil.rmtree(SMOKE, ignore_errors=True)
    _run(sys.executable, "-m", "venv", SMOKE)
    py = _venv_python(SMOKE)
    if fresh_deps:
        _run(py, "-m", "pip", "install", "-q", "-c", ROOT / "constraints.txt", "torch", "triton", "numpy")
    else:
        purelib = subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
        Path(purelib, "jagflash-smoke-shared-deps.pth").write_text(f"{_deps_site(SMOKE)}\n")
        # venv's own setuptools (older than torch asks for) would shadow the shared one.
        _run(py, "-m", "pip", "uninstall", "-q", "-y", "setuptools")
    pip = [py, "-m", "pip", "install", "-q", "--no-index", "--find-links", out]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TRITON_PLUGIN_PATHS")}
    env["TRITON_INTERPRET"] = "1"
    with tempfile.TemporaryDirectory() as cwd:  # outside the repository: no source tree on sys.path
        _run(*pip, "jagflash-core", "jagflash-jagged", env=env)
        _run(py, Path(__file__).resolve(), "call", "components", env=env, cwd=cwd)
        _run(py, "-m", "pip", "uninstall", "-q", "-y", "jagflash-core", "jagflash-jagged", env=env)
        _run(*pip, "jagflash[all,tlx]", env=env)
        _run(py, Path(__file__).resolve(), "call", "meta", env=env, cwd=cwd)
    print(f"wheels smoke: OK in {time.perf_counter() - started:.1f} s", flush=True)


def call(kind: str) -> None:
    """Run in the smoke venv: a small jagged problem forward and backward, checked against the
    reference backend, from the installed wheels only."""
    import importlib.metadata as md

    import torch

    import jagflash.core

    where = Path(jagflash.core.__file__).resolve()
    if Path(sys.prefix).resolve() not in where.parents:
        raise SystemExit(f"jagflash.core imported from {where}, not from the venv {sys.prefix}")
    lengths = [5, 0, 17]
    offsets = torch.tensor([0, 5, 5, 22], dtype=torch.int32)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(22, 2, 16, generator=gen, requires_grad=True) for _ in range(3))
    if kind == "components":
        from jagflash.variants.jagged import jagged_attention

        def run(**kw):
            return jagged_attention(q, k, v, offsets, offsets, causal=True, **kw)
    else:
        from jagflash.compat import flash_attn_varlen_func

        def run(backend=None):
            if backend is None:
                return flash_attn_varlen_func(q, k, v, offsets, offsets, max(lengths), max(lengths), causal=True)
            return jagflash.core.attention(q, k, v, q_offsets=offsets, kv_offsets=offsets, causal=True, backend=backend)

    out = run()
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref = run(backend="reference")
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    err = max(float((a - b).detach().abs().max()) for a, b in zip([out, *grads], [ref, *ref_grads]))
    if not err < 1e-4:
        raise SystemExit(f"{kind}: max |kernel - reference| = {err:.3g}")
    dists = sorted(d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].startswith("jagflash"))
    print(f"wheels smoke ({kind}): {', '.join(dists)} from {where.parent.parent.parent}: forward + backward "
          f"within {err:.1e} of the reference")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("build", "smoke"):
        p = sub.add_parser(name)
        p.add_argument("--out", type=Path, default=DIST, help=f"wheel directory (default {DIST.relative_to(ROOT)})")
        if name == "smoke":
            p.add_argument("--fresh-deps", action="store_true", help="install torch, triton, numpy into the venv too")
    sub.add_parser("call").add_argument("kind", choices=("components", "meta"))
    args = parser.parse_args(argv)
    if args.cmd == "build":
        build(args.out)
    elif args.cmd == "smoke":
        smoke(args.out, args.fresh_deps)
    else:
        call(args.kind)
    return 0


if __name__ == "__main__":
    sys.exit(main())
