"""The sliding-window workloads of jagflash-bench: the issue's five, their no-window baselines,
FLOPs of the band only, the peers that take a window, and a CPU smoke run of them all."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jagflash.bench import providers as P
from jagflash.bench import report
from jagflash.bench import workloads as W
from jagflash.bench.flops import fwd_flops

REPO = Path(__file__).resolve().parents[2]

#: workload -> (its no-window baseline, left bound)
WINDOWED = {
    "jagged-lognormal-causal-left256-d128": ("jagged-lognormal-causal-d128", 256),
    "jagged-lognormal-causal-left1024-d128": ("jagged-lognormal-causal-d128", 1024),
    "dense-b4h16n8192d128-causal-left1024": ("dense-b4h16n8192d128-causal", 1024),
    "dense-b4h16n8192d128-causal-left4096": ("dense-b4h16n8192d128-causal", 4096),
    "jagged-heavytail-causal-left128-d128": ("jagged-heavytail-causal-d128", 128),
}


def test_window_workloads_and_their_baselines() -> None:
    assert set(W.WINDOW_WORKLOADS) == set(WINDOWED)
    for name, (base, left) in WINDOWED.items():
        w, b = W.get(name), W.get(base)
        assert (w.window, w.causal, b.causal, b.has_window) == ((left, -1), True, True, False)
        assert (w.kind, w.heads, w.hkv, w.head_dim, w.dtype) == (b.kind, b.heads, b.hkv, b.head_dim, b.dtype)
        q, k = w.sample_lengths()
        bq, bk = b.sample_lengths()
        assert (q == bq).all()
        assert (k == bk).all()


def test_window_flops_count_the_band_only() -> None:
    """Dense 8192 causal: the band of left 1024 holds sum over rows of min(i, 1024) + 1 pairs,
    1 / 4.26 of causal's; the FLOPs follow exactly."""
    w = W.get("dense-b4h16n8192d128-causal-left1024")
    q, k = w.sample_lengths()
    got = fwd_flops(q, k, heads=w.heads, head_dim=w.head_dim, causal=w.causal, window=w.window)
    pairs = 4 * sum(min(i, 1024) + 1 for i in range(8192))
    assert got == 4 * 128 * 16 * pairs
    full = fwd_flops(q, k, heads=w.heads, head_dim=w.head_dim, causal=True)
    assert 4.2 < full / got < 4.3


def test_smoke_windows_stay_bands() -> None:
    for name in WINDOWED:
        s = W.get(name, smoke=True)
        assert s.has_window
        assert s.window == (W.SMOKE_WINDOW, -1)
        assert s.window[0] < W.SMOKE_MAX_LEN


def test_window_peers() -> None:
    """Every windowed workload is taken by jagflash (the sliding-window variant), FA4
    (window_size), varlen_attn (window_size) and FlexAttention (window + document mask);
    SDPA's dense providers, which have no window, refuse them instead of computing another mask."""
    for name in WINDOWED:
        w = W.get(name)
        for p in ("jagflash-tlx", "jagflash-interpreter", "fa4", "varlen-fa2", "flex"):
            prov = P.get(p)
            assert w.kind in prov.kinds, (name, p)
            assert prov.supports(w) is None, (name, p)
            assert prov.default_for(name), (name, p)
        for p in ("sdpa-flash", "sdpa-cudnn"):
            assert w.kind not in P.get(p).kinds or P.get(p).supports(w), (name, p)
    assert P._fa4_window_kw(W.get("jagged-lognormal-causal-left256-d128")) == {"window_size": (256, 0)}


def _src_path() -> str:
    dirs = [REPO / "core" / "src", REPO / "testing" / "src", REPO / "bench" / "src"]
    dirs += sorted((REPO / "variants").glob("*/src"))
    return os.pathsep.join(str(d) for d in dirs if d.is_dir())


@pytest.mark.skipif(
    importlib.util.find_spec("jagflash.variants.sliding_window") is None,
    reason="jagflash-sliding-window is not importable",
)
def test_window_smoke_run(tmp_path) -> None:
    """The window workloads end to end on the CPU: the sliding-window variant under the
    interpreter, checked against the reference and timed, forward and backward."""
    out = tmp_path / "smoke"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_src_path(), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "jagflash.bench", "--smoke", "--workloads", "*-left*", "--providers",
         "jagflash-interpreter,sdpa-loop", "--device", "cpu", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = report.read_csv(out / "results.csv")
    by = {(r["workload"], r["provider"], r["direction"]): r for r in rows}
    for name in WINDOWED:
        for d in ("fwd", "bwd"):
            r = by[(name, "jagflash-interpreter", d)]
            assert r["status"] == "ok", r
            assert r["rel_err"] < 1e-3
            assert "sliding_window/interpreter" in r["note"]
            assert r["window"] == f"{W.SMOKE_WINDOW}:-1"
            assert by[(name, "sdpa-loop", d)]["status"] == "ok"
