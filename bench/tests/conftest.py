"""Fixtures of the bench tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_bench(tmp_path):
    """``run_bench(*args) -> (CompletedProcess, out_dir)``: ``python -m jagflash.bench`` on the
    CPU in a subprocess (this checkout's sources first on PYTHONPATH), output in ``tmp_path``."""

    def run(*args: str):
        out = tmp_path / "bench-out"
        dirs = [REPO / "core" / "src", REPO / "testing" / "src", REPO / "bench" / "src"]
        dirs += sorted((REPO / "variants").glob("*/src"))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*(str(d) for d in dirs if d.is_dir()), env.get("PYTHONPATH", "")])
        done = subprocess.run(
            [sys.executable, "-m", "jagflash.bench", "--device", "cpu", "--out", str(out), *args],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        return done, out

    return run
