"""The scripts of bench/probes/: each imports on a CPU without asking for a GPU and answers
``--help``; the batches they name are bench workloads; the A/B tables match the APIs they call."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jagflash.bench import workloads as W
from jagflash.bench.flops import fwd_flops

PROBES = Path(__file__).resolve().parents[1] / "probes"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"jagflash_probe_{name}", PROBES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", sorted(PROBES.glob("*.py")), ids=lambda p: p.name)
def test_probe_answers_help_without_a_gpu(script: Path) -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ")


@pytest.mark.parametrize(
    ("probe", "table"),
    [
        ("probe_ncu", "BATCHES"),
        ("probe_bq_backward", "WORKLOADS"),
        ("probe_host", "DEFAULT_WORKLOADS"),
        ("mask_mod_build", "DEFAULT_WORKLOADS"),
        ("mask_mod_eval", "DEFAULT_WORKLOADS"),
        ("tile_ring_ab", "DEFAULT_WORKLOADS"),
        ("tile_ring_ab", "BWD_WORKLOADS"),
        ("bwd_passes", "DEFAULT_WORKLOADS"),
        ("bwd_order_ab", "DEFAULT_WORKLOADS"),
        ("fwd_timeline", "DEFAULT_WORKLOADS"),
        ("empty_order_ab", "DEFAULT_WORKLOADS"),
    ],
)
def test_probe_batches_are_bench_workloads(probe: str, table: str) -> None:
    names = getattr(_load(probe), table)
    names = names.values() if isinstance(names, dict) else names
    assert set(names) <= set(W.WORKLOADS)


def test_bwd_passes_io_floor_counts_each_tensor_once() -> None:
    """The one pass's I/O floor on a batch of 1,000 query and 2,000 key rows, 8 query heads over
    2 K/V heads, D 64, bf16: Q and dO read, K and V read and dK, dV written, LSE and delta, the
    fp32 accumulator read and written back; O and dO read and the accumulator zeroed; the
    accumulator read and dQ written."""
    floor = _load("bwd_passes").one_pass_bytes(1000, 2000, 8, 2, 64, 2)
    # Q / dO / O / dQ 1,024,000 B each, K / V / dK / dV 512,000, LSE + delta 64,000, the accumulator 2,048,000
    assert floor == {"dK/dV": 8_256_000, "vectors": 4_160_000, "cast": 3_072_000}


def test_schedule_ab_simulates_every_jagged_workload(capsys) -> None:
    schedule_ab = _load("schedule_ab")
    assert schedule_ab.main(["simulate", "--workers", "8"]) == 0
    out = capsys.readouterr().out
    for name, w in W.WORKLOADS.items():
        assert (name in out) == (w.kind == "jagged"), name


def test_schedule_ab_dense_equivalent_matches_the_flops() -> None:
    schedule_ab = _load("schedule_ab")
    w = W.get("jagged-lognormal-causal-d128")
    dense = schedule_ab.dense_equivalent(w, length=512)
    assert (dense.kind, dense.causal, dense.heads) == ("dense", True, w.heads)
    kw = {"heads": w.heads, "head_dim": w.head_dim, "causal": True}
    jagged = fwd_flops(*w.sample_lengths(), **kw)
    one = fwd_flops([512], [512], **kw)
    assert abs(fwd_flops(*dense.sample_lengths(), **kw) - jagged) <= one / 2
