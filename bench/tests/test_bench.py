"""Tests of jagflash-bench: FLOP counting, workloads, references, report, and the smoke run."""

from __future__ import annotations

import csv
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from jagflash.bench import report
from jagflash.bench import workloads as W
from jagflash.bench.flops import bwd_flops, fwd_flops, mask_bounds, visible_pairs

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------- FLOPs


def _brute_pairs(q_lens, kv_lens, causal, window) -> int:
    """Visible (i, j) pairs straight from DESIGN.md's definition, one pair at a time."""
    left, right = window
    total = 0
    for lq, lk in zip(q_lens, kv_lens):
        d = lk - lq
        for i in range(lq):
            for j in range(lk):
                if causal and j > i + d:
                    continue
                if right >= 0 and j > i + d + right:
                    continue
                if left >= 0 and j < i + d - left:
                    continue
                total += 1
    return total


@pytest.mark.parametrize("seed", range(12))
def test_visible_pairs_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 6))
    q_lens = rng.integers(0, 20, size=n)
    kv_lens = q_lens.copy() if seed % 3 == 0 else rng.integers(0, 20, size=n)  # Lq != Lk
    q_lens[rng.integers(0, n)] = 0  # a zero-length sequence in every batch
    for causal, window in itertools.product(
        (False, True), ((-1, -1), (3, -1), (-1, 2), (4, 1), (0, 0))
    ):
        want = _brute_pairs(q_lens, kv_lens, causal, window)
        assert visible_pairs(q_lens, kv_lens, causal, window) == want, (causal, window)


def test_visible_pairs_bottom_right_causal_examples():
    # Lq=3, Lk=5 causal: rows see 3, 4, 5 keys; Lq=5, Lk=3: rows see 0, 0, 1, 2, 3 keys.
    assert visible_pairs([3], [5], causal=True) == 12
    assert visible_pairs([5], [3], causal=True) == 6
    assert visible_pairs([0, 4], [7, 0], causal=True) == 0
    assert visible_pairs([], [], causal=True) == 0


def test_fwd_flops_dense_closed_forms():
    b, h, n, d = 4, 16, 4096, 128
    full = fwd_flops([n] * b, [n] * b, heads=h, head_dim=d)
    assert full == 4 * b * h * n * n * d
    causal = fwd_flops([n] * b, [n] * b, heads=h, head_dim=d, causal=True)
    assert causal == 4 * b * h * d * n * (n + 1) // 2
    assert bwd_flops(full) == 5 * full // 2


def test_mask_bounds():
    assert mask_bounds(False) == (-1, -1)
    assert mask_bounds(True) == (-1, 0)
    assert mask_bounds(True, (8, 3)) == (8, 0)
    assert mask_bounds(True, (8, -1)) == (8, 0)


# ---------------------------------------------------------------------------- workloads


def test_workloads_are_deterministic():
    for w in W.WORKLOADS.values():
        q1, k1 = w.sample_lengths()
        q2, k2 = w.sample_lengths()
        assert np.array_equal(q1, q2)
        assert np.array_equal(k1, k2)
        assert (k1 >= 0).all()


def test_seed_changes_lengths():
    import dataclasses

    w = W.get("jagged-lognormal-d128")
    other = dataclasses.replace(w, seed=1)
    assert not np.array_equal(w.sample_lengths()[1], other.sample_lengths()[1])


def test_lognormal_median_and_cap():
    _, lengths = W.get("jagged-lognormal-d128").sample_lengths()
    assert lengths.size == 128
    assert lengths.min() >= 1
    assert lengths.max() <= 4096
    big = W.Lognormal(20000, 512, 1.0, 4096).sample(np.random.default_rng(0))
    assert abs(np.median(big) / 512 - 1) < 0.05
    assert big.max() == 4096  # the cap binds for sigma 1 at this many draws


def test_heavy_tail_composition():
    _, lengths = W.get("jagged-heavytail-d128").sample_lengths()
    assert lengths.size == 122
    assert (lengths == 4096).sum() == 2
    rest = lengths[lengths != 4096]
    assert rest.size == 120
    assert rest.min() >= 32
    assert rest.max() < 768


def test_tiny_and_bimodal_composition():
    _, tiny = W.get("jagged-tiny-d128").sample_lengths()
    assert tiny.size == 2048
    assert tiny.min() >= 1
    assert tiny.max() < 64
    _, bi = W.get("jagged-bimodal-d128").sample_lengths()
    assert bi.size == 128
    assert ((bi >= 64) & (bi < 256)).sum() == 112
    assert ((bi >= 2048) & (bi <= 4096)).sum() == 16


def test_broadcast_q_lengths():
    w = W.get("bq-lq256-b64")
    q_lens, kv_lens = w.sample_lengths()
    assert (q_lens == 256).all()
    assert kv_lens.size == 64


def test_power_law_is_mostly_short_with_a_tail():
    _, lens = W.get("short-powerlaw-a1.1-d128").sample_lengths()
    assert lens.size == 256
    assert np.median(lens) < 30
    assert lens.min() >= 1
    assert lens.max() == 1024  # the cap is reached at alpha 1.1
    _, thin = W.get("short-powerlaw-a1.6-d128").sample_lengths()
    assert thin.sum() < lens.sum()


def test_cross_attention_lengths():
    q_lens, kv_lens = W.get("short-xattn-q1-64-k1024-d128").sample_lengths()
    assert q_lens.size == kv_lens.size == 512
    assert q_lens.min() >= 1
    assert q_lens.max() <= 64
    assert kv_lens.min() >= 960
    assert not np.array_equal(q_lens, kv_lens)
    q1, kv1 = W.get("short-decode-q1-lognormal-d128").sample_lengths()
    assert (q1 == 1).all()
    assert kv1.size == 1024
    with pytest.raises(ValueError, match="q_lengths drew 3 sequences, lengths 4"):
        W.Workload("bad-x", "jagged", W.Fixed(4, 8), q_lengths=W.Fixed(3, 1)).sample_lengths()
    with pytest.raises(ValueError, match="q_lengths"):
        W.Workload("bad-bq", "broadcast_q", W.Fixed(4, 8), q_len=4, q_lengths=W.Fixed(4, 1))


def test_smoke_variants_are_tiny_and_keep_features():
    for w in W.WORKLOADS.values():
        s = w.smoke()
        q_lens, kv_lens = s.sample_lengths()
        assert s.is_smoke
        assert s.kind == w.kind
        assert s.causal == w.causal
        assert s.gqa == w.gqa
        assert s.head_dim == 32
        assert s.dtype == "float32"
        assert len(kv_lens) <= 6
        longest = W.SMOKE_MAX_LEN if w.blocks is None else W.SMOKE_BS_MAX_LEN
        assert kv_lens.max() <= longest
        assert q_lens.max() <= longest
        assert s.smoke() is s


def test_select():
    assert [w.name for w in W.select("jagged-lognormal-*d64")] == [
        "jagged-lognormal-d64",
        "jagged-lognormal-causal-d64",
    ]
    assert all(w.is_smoke for w in W.select(None, smoke=True))
    with pytest.raises(ValueError, match="no workload matches"):
        W.select("nope-*")


def test_bad_workload_is_refused():
    with pytest.raises(ValueError, match="kv_heads"):
        W.Workload("bad", "jagged", W.Fixed(1, 4), heads=6, kv_heads=4)


# ------------------------------------------------------------------ inputs and reference


def test_inputs_are_deterministic_and_not_zero():
    from jagflash.bench.data import make_batch

    w = W.get("jagged-heavytail-d128", smoke=True)
    a, b, c = make_batch(w, "cpu"), make_batch(w, "cpu"), make_batch(w, "cpu", index=1)
    assert torch.equal(a.q, b.q)
    assert torch.equal(a.dout, b.dout)
    assert not torch.equal(a.q, c.q)
    assert a.q.std() > 0.5  # standard normal, never zeros
    assert a.q_offsets.dtype == torch.int32
    assert a.q_offsets[-1].item() == a.q.shape[0]


@pytest.mark.parametrize("name", ["jagged-lognormal-causal-gqa4-d128", "bq-lq256-b64"])
def test_reference_chunking_and_head_subset_agree(name):
    from jagflash.bench.data import make_batch
    from jagflash.bench.reference import compute_reference

    batch = make_batch(W.get(name, smoke=True), "cpu")
    whole = compute_reference(batch, grads=True)
    chunked = compute_reference(batch, grads=True, max_elems=1)  # one sequence per chunk
    for x, y in zip(
        (whole.out, whole.dq, whole.dk, whole.dv), (chunked.out, chunked.dq, chunked.dk, chunked.dv)
    ):
        torch.testing.assert_close(x, y)
    sub = compute_reference(batch, grads=True, flop_budget=1.0)  # forces one KV head
    assert sub.heads_kv == 1
    torch.testing.assert_close(sub.out, whole.slice_q(whole.out)[..., : sub.heads_q, :])
    torch.testing.assert_close(sub.dk, whole.dk[:, :1])


def test_broadcast_q_reference_dq_is_the_sum_over_sequences():
    from jagflash.bench.data import make_batch
    from jagflash.bench.reference import compute_reference

    batch = make_batch(W.get("bq-lq256-b64", smoke=True), "cpu")
    ref = compute_reference(batch, grads=True)
    q = batch.q.clone().requires_grad_(True)
    total = torch.zeros_like(q)
    for b in range(batch.num_seqs):
        k = batch.k[batch.kv_offsets[b] : batch.kv_offsets[b + 1]]
        v = batch.v[batch.kv_offsets[b] : batch.kv_offsets[b + 1]]
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        ).transpose(0, 1)
        (g,) = torch.autograd.grad(o, q, batch.dout[b])
        total += g
    torch.testing.assert_close(ref.dq, total, rtol=1e-4, atol=1e-5)


def test_rel_err_rejects_nan_and_shape_mismatch():
    from jagflash.bench.reference import rel_err

    ref = torch.ones(4)
    assert rel_err(torch.ones(4), ref) == 0
    assert rel_err(torch.tensor([1.0, float("nan"), 1, 1]), ref) == float("inf")
    assert rel_err(torch.ones(5), ref) == float("inf")
    # a vanishing reference (dQ of one-key sequences) is measured at RMS_FLOOR, not divided by ~0
    zero = torch.zeros(100)
    assert rel_err(torch.full((100,), 1e-7), zero) < 1e-3
    assert rel_err(torch.full((100,), 1e-4), zero) > 0.05


def test_wallclock_timing_and_rotation():
    from jagflash.bench.timing import Rotator, measure

    calls = []
    fn = Rotator([lambda: calls.append(0), lambda: calls.append(1)])
    t = measure(fn, torch.device("cpu"), min_reps=5)
    assert t.runs == 5
    assert t.p20 <= t.p50 <= t.p80
    assert calls == [0, 1, 0, 1, 0]


def test_loop_ms_is_the_time_per_call_of_a_loop():
    from jagflash.bench.timing import loop_ms

    calls = []

    def fn():
        calls.append(0)
        time.sleep(0.002)

    ms = loop_ms(fn, torch.device("cpu"), budget_ms=20.0, rounds=3)
    assert 2.0 <= ms < 10.0  # a sleep overshoots on a busy machine, never undershoots
    per_round, rest = divmod(len(calls) - 1, 3)  # one call sizes the rounds: 20 ms / >= 2 ms
    assert rest == 0
    assert 5 <= per_round <= 10


def test_host_triton_env_strips_only_the_tlx_bundle(monkeypatch):
    from jagflash.bench.env import host_triton_env

    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(["/tmp/tlx", "/tmp/tlx/site", "/tmp/fa4", "/repo/core/src"])
    )
    monkeypatch.delenv("JAGFLASH_TLX_PATHS", raising=False)
    env = host_triton_env(extra_paths=["/repo/bench/src"])
    assert env["PYTHONPATH"].split(os.pathsep) == ["/tmp/fa4", "/repo/core/src", "/repo/bench/src"]


# ------------------------------------------------------------------------------- report


def _synthetic_rows() -> list[dict]:
    rows = []
    for wl, kind in (("dense-x", "dense"), ("jagged-x", "jagged")):
        for prov, status in (
            ("jagflash-portable", "ok"),
            ("varlen-fa2", "ok"),
            ("fa4", "wrong"),
            ("flex", "unavailable"),
        ):
            for d, ms in (("fwd", 1.0), ("bwd", 2.5)):
                ok = status == "ok"
                rows.append(
                    {
                        "workload": wl, "kind": kind, "provider": prov, "direction": d,
                        "status": status, "ms_p20": ms * 0.9 if ok else None,
                        "ms_p50": ms if ok else None, "ms_p80": ms * 1.1 if ok else None,
                        "flops": int(4e11 * (2.5 if d == "bwd" else 1)),
                        "tflops": 400.0 if ok else None, "note": "" if ok else "because",
                        "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.8.0",
                    }
                )  # fmt: skip
    return rows


def test_report_from_synthetic_csv(tmp_path):
    csv_path = tmp_path / "results.csv"
    report.write_csv(_synthetic_rows(), csv_path)
    with csv_path.open() as fh:
        header = next(csv.reader(fh))
    assert header == list(report.COLUMNS)
    meta = {"gpu": "NVIDIA H200", "ceilings": {"matmul_bf16_tflops": 806.0, "copy_gbps": 4000.0}}
    written = report.render(csv_path, tmp_path, meta)
    md = written["markdown"].read_text()
    assert "## dense" in md
    assert "## jagged" in md
    assert "| dense-x | fwd | **400**<br>1 ms | **400**<br>1 ms | WRONG |" in md
    assert "flex" not in md.split("## Notes")[0]  # a column of n/a only is dropped...
    assert "**flex** unavailable: because" in md  # ...and its reason is a note
    for kind in ("dense", "jagged"):
        png = tmp_path / f"tflops_{kind}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = written["summary"].read_text()
    assert "806 TFLOP/s" in summary
    assert "WRONG" in summary


def test_report_only_cli_rebuilds_from_rows(tmp_path, capsys):
    from jagflash.bench.cli import main

    with (tmp_path / "rows.jsonl").open("w") as fh:
        fh.write(
            json.dumps({"type": "meta", "group": "main", "gpu": "NVIDIA H200", "triton": "3.8.0"})
            + "\n"
        )
        for r in _synthetic_rows():
            fh.write(json.dumps({"type": "row", **r}) + "\n")
        fh.write('{"type": "row", "workload": "cut sh')  # a line a killed worker left unfinished
    assert main(["--report-only", str(tmp_path)]) == 0
    assert (tmp_path / "results.csv").is_file()
    assert (tmp_path / "results.md").is_file()
    assert "jagflash bench on NVIDIA H200" in capsys.readouterr().out


# ---------------------------------------------------------------------------- smoke run


def _variants_importable() -> bool:
    try:
        return importlib.util.find_spec("jagflash.variants.jagged") is not None
    except (ImportError, ValueError):
        return False


def _src_path() -> str:
    dirs = [REPO / "core" / "src", REPO / "testing" / "src", REPO / "bench" / "src"]
    dirs += sorted((REPO / "variants").glob("*/src"))
    return os.pathsep.join(str(d) for d in dirs if d.is_dir())


@pytest.mark.skipif(not _variants_importable(), reason="jagflash-jagged is not importable yet")
def test_smoke_run_end_to_end(tmp_path):
    out = tmp_path / "smoke"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_src_path(), env.get("PYTHONPATH", "")) if p)
    device = ["--device", "cpu"]  # the smoke test is the CPU path even on a GPU machine
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "jagflash.bench", "--smoke", "--out", str(out), *device],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = report.read_csv(out / "results.csv")
    by = {(r["workload"], r["provider"], r["direction"]): r for r in rows}
    for wl in W.SMOKE_DEFAULT:
        kind = W.get(wl).kind
        for d in ("fwd", "bwd"):
            if kind != "broadcast_q":
                r = by[(wl, "jagflash-interpreter", d)]
                assert r["status"] == "ok", r
                assert r["rel_err"] < 1e-3
                assert r["flops"] > 0
                assert r["tflops"] > 0
            assert by[(wl, "jagflash-reference", d)]["status"] in ("ok", "unavailable")
    assert {r["status"] for r in rows} <= set(report.STATUSES)
    assert not [
        r
        for r in rows
        if r["status"] in ("wrong", "failed") and r["provider"].startswith("jagflash")
    ]
    assert (out / "results.md").read_text().startswith("# jagflash benchmark (smoke")
    plan = json.loads((out / "plan-main.json").read_text())
    assert (plan["cuda_graphs"], plan["graph_below_ms"]) == (False, 0.1)  # the timing options reach the run
    assert list(out.glob("tflops_*.png"))
    assert "TFLOP/s at the median" in done.stdout
    print(f"smoke run took {elapsed:.1f} s")


def test_probe_ncu_summarizes_a_source_page_export(tmp_path, capsys) -> None:
    """bench/probes/probe_ncu.py --summarize: finds the instruction and stall-sampling columns by
    their headers (after ncu's preamble lines), ranks instructions, totals opcodes and reasons,
    and names the instructions each large reason sits on, with their execution counts."""
    spec = importlib.util.spec_from_file_location("probe_ncu", REPO / "bench" / "probes" / "probe_ncu.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    path = tmp_path / "sass.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["==PROF== preamble"])
        w.writerow(["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_barrier", "stall_long_sb"])
        w.writerow(["0x10", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24", "1,200", "64", "0", "0"])
        w.writerow(["0x20", "@P0 SYNCS.PHASECHK.TRANS64 P0, [R2+URZ], R3", "300", "8", "300", "0"])
        w.writerow(["0x30", "LDG.E R5, desc[UR6][R6.64]", "500", "64", "0", "500"])
    assert probe.main(["--summarize", str(path), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "3 SASS lines, 2000 samples" in out
    top = out.split("-- top 2 instructions by samples")[1].split("--")[0]
    assert "HGMMA" in top.splitlines()[1]
    assert "LDG" in top.splitlines()[2]
    assert "SYNCS" not in top
    assert "60.0%  HGMMA" in out
    assert "300  stall_barrier" in out
    assert "500  stall_long_sb" in out
    long_sb = out.split("-- top 5 instructions for stall_long_sb (500)")[1].splitlines()
    assert "500" in long_sb[1]
    assert "x64" in long_sb[1]
    assert "LDG" in long_sb[1]
    assert "-- top 5 instructions for stall_barrier (300)" in out


def _matmul_backwards(n_sets: int, sync_in_backward: bool = False):
    """``make_backwards`` for :func:`jagflash.bench.timing.graph_backward`: fresh leaves of a
    small matmul per set, their forwards recorded on the caller's (side) stream."""

    class Synced(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            torch.cuda.synchronize()  # illegal while a graph captures
            return g

    def make():
        fns = []
        for _ in range(n_sets):
            a = torch.randn(256, 256, device="cuda", requires_grad=True)
            b = torch.randn(256, 256, device="cuda", requires_grad=True)
            out = a @ b
            if sync_in_backward:
                out = Synced.apply(out)
            fns.append(lambda out=out, a=a, b=b: torch.autograd.grad(out, (a, b), torch.ones_like(out), retain_graph=True))
        return fns

    return make


@pytest.mark.gpu
def test_graph_backward_replays_fresh_backwards():
    from jagflash.bench.timing import graph_backward

    t, why = graph_backward(_matmul_backwards(2), torch.device("cuda"), rep_ms=5.0, replays=4)
    assert why == ""
    assert t is not None
    assert t.timer.startswith("graph_backward")
    assert 0 < t.p20 <= t.p50 <= t.p80 < 5.0
    assert t.runs % 2 == 0  # whole rotations of the two sets


@pytest.mark.gpu
def test_graph_backward_reports_a_failed_capture_and_frees_it():
    from jagflash.bench.timing import graph_backward

    before = torch.cuda.memory_reserved()
    t, why = graph_backward(_matmul_backwards(1, sync_in_backward=True), torch.device("cuda"), rep_ms=5.0)
    assert t is None
    assert why  # the error's type and first line
    torch.cuda.synchronize()
    assert torch.cuda.memory_reserved() <= before + (64 << 20)
