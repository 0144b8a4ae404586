"""Where a run happens: versions, GPU, git commit, the machine's two ceilings, and the environment
of the host-Triton worker.

Ceilings (METHOD.md): a large bf16 matmul (8192^3) gives the matrix-unit rate, a large
device-to-device copy (bytes read + written) the memory bandwidth. Every TFLOP/s in the tables is
read against the first.

Host Triton: on the GPU machine a Triton 3.8 + uTLX bundle is put in front of the host's Triton
through PYTHONPATH (default ``/tmp/tlx``). torch.compile (FlexAttention) and FlashAttention-4
must run with the host's own Triton, so their worker gets the same PYTHONPATH minus every entry
under ``$JAGFLASH_TLX_PATHS`` (colon-separated; default ``/tmp/tlx``). Other entries (the repo's
src dirs, ``/tmp/fa4``) stay.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

__all__ = [
    "ceilings",
    "git_commit",
    "host_triton_env",
    "now_utc",
    "versions",
]

TLX_PATHS_VAR = "JAGFLASH_TLX_PATHS"
DEFAULT_TLX_PATHS = "/tmp/tlx"


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def git_commit(start: Path | None = None) -> str:
    """``$JAGFLASH_GIT_COMMIT``, else ``git rev-parse`` (+ ``-dirty``), else ``unknown``."""
    env = os.environ.get("JAGFLASH_GIT_COMMIT")
    if env:
        return env
    cwd = str(start or Path(__file__).resolve().parent)
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _under(path: str, roots: list[str]) -> bool:
    p = os.path.normpath(os.path.abspath(path))
    for root in roots:
        r = os.path.normpath(os.path.abspath(root))
        if p == r or p.startswith(r + os.sep):
            return True
    return False


def host_triton_env(extra_paths: list[str] | None = None) -> dict[str, str]:
    """This process's environment with the TLX bundle dropped from PYTHONPATH."""
    env = dict(os.environ)
    roots = [p for p in env.get(TLX_PATHS_VAR, DEFAULT_TLX_PATHS).split(os.pathsep) if p]
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    kept = [p for p in parts if not _under(p, roots)]
    for p in extra_paths or []:
        if p not in kept and not _under(p, roots):
            kept.append(p)
    env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


def versions(device_type: str, *, probe_fa4: bool = False) -> dict[str, str]:
    """Versions and device of this process (torch must already be importable)."""
    import torch

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda or ""),
        "cudnn": "",
        "triton": "",
        "gpu": "",
        "tlx": "no",
    }
    try:
        import triton

        out["triton"] = triton.__version__
        out["triton_path"] = str(Path(triton.__file__).parent)
    except Exception as e:
        out["triton"] = f"unavailable ({type(e).__name__})"
    try:
        import importlib.util

        out["tlx"] = "yes" if importlib.util.find_spec("triton.language.extra.tlx") else "no"
    except Exception:
        out["tlx"] = "no"
    if device_type == "cuda" and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        cc = torch.cuda.get_device_capability()
        out["capability"] = f"{cc[0]}.{cc[1]}"
        try:
            out["cudnn"] = str(torch.backends.cudnn.version() or "")
        except Exception:
            out["cudnn"] = ""
    else:
        out["gpu"] = f"cpu ({platform.machine()}, {os.cpu_count()} cores)"
    if probe_fa4:
        try:
            import flash_attn

            out["flash_attn"] = str(getattr(flash_attn, "__version__", "?"))
        except Exception as e:
            out["flash_attn"] = f"unavailable ({type(e).__name__})"
    return out


def ceilings(device_type: str) -> dict[str, float]:
    """bf16 8192^3 matmul TFLOP/s and device copy GB/s (empty off the GPU)."""
    if device_type != "cuda":
        return {}
    import torch

    from jagflash.bench.timing import measure

    dev = torch.device("cuda")

    def matmul_tflops(n: int = 8192) -> float:
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        t = measure(lambda: torch.matmul(a, b), dev, rep_ms=200, min_reps=20)
        return 2 * n**3 / (t.p50 * 1e-3) / 1e12

    def copy_gbps(numel: int = 1 << 28) -> float:  # 1 GiB of float32 each way
        x = torch.randn(numel, device=dev, dtype=torch.float32)
        y = torch.empty_like(x)
        t = measure(lambda: y.copy_(x), dev, rep_ms=200, min_reps=20)
        return 2 * x.numel() * x.element_size() / (t.p50 * 1e-3) / 1e9

    out = {"matmul_bf16_tflops": matmul_tflops(), "copy_gbps": copy_gbps()}
    torch.cuda.empty_cache()
    return out
