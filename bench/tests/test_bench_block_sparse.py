"""The block-sparse workloads of jagflash-bench (issue 22): the ten ``bs-*`` workloads and their
baselines, their masks in every peer's form (from_mask_mod, FA4's varlen tensors), FLOPs of the
listed pairs against brute force, and a CPU smoke run through the interpreter providers."""

from __future__ import annotations

import importlib.util
from collections import namedtuple

import numpy as np
import pytest
import torch

from jagflash.bench import providers as P
from jagflash.bench import report
from jagflash.bench import workloads as W
from jagflash.bench.data import make_batch
from jagflash.bench.flops import block_mask_pairs
from jagflash.bench.sparsity import (
    BlockPattern,
    band_density,
    fa4_block_sparse,
    make_block_mask,
    mask_mod,
)
from jagflash.core.block_mask import BlockMask

BATCHES = {"lognormal": ("jagged", "jagged-lognormal-causal-d128"), "dense8k": ("dense", "dense-b4h16n8192d128-causal")}
PATTERNS = ("d10", "d25", "d50", "local-global", "topk")


def _offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)


def test_block_sparse_workloads_and_baselines() -> None:
    names = {f"bs-{b}-{p}" for b in BATCHES for p in PATTERNS}
    assert set(W.BLOCK_SPARSE_WORKLOADS) == names
    for name in names:
        w = W.get(name)
        kind, base = BATCHES[name.split("-")[1]]
        assert (w.kind, w.baseline, w.causal, w.heads, w.head_dim, w.dtype) == (kind, base, True, 16, 128, "bfloat16")
        assert w.blocks.block == 128
        b = W.get(base)
        assert b.blocks is None
        assert b.causal
        assert np.array_equal(w.sample_lengths()[0], b.sample_lengths()[0])  # the same batch
        s = w.smoke()
        assert (s.blocks.block, s.head_dim, s.blocks.kind) == (W.SMOKE_BLOCK, 32, w.blocks.kind)
    assert W.get("bs-dense8k-d25").sample_lengths()[0].tolist() == [8192] * 4
    with pytest.raises(ValueError, match="density"):
        BlockPattern("random", density=1.5)
    with pytest.raises(ValueError, match="dense and jagged"):
        W.Workload("x", "broadcast_q", W.Fixed(1, 8), q_len=8, blocks=BlockPattern("top_k", k=1))
    # only providers that take a block mask run them; the others say so in their rows
    assert {n for n, p in P.PROVIDERS.items() if p.block_sparse} == {
        "jagflash-tlx", "jagflash-portable", "jagflash-interpreter", "jagflash-reference", "fa4", "flex",
    }
    assert all(P.get("flex").default_for(n) for n in names)


@pytest.mark.parametrize("name", ["bs-lognormal-d10", "bs-lognormal-d25", "bs-lognormal-d50", "bs-dense8k-d10", "bs-dense8k-d25", "bs-dense8k-d50"])
def test_random_patterns_hit_their_density_in_the_causal_band(name) -> None:
    w = W.get(name)
    lq, lk = w.sample_lengths()
    m = make_block_mask(w.blocks, lq, lk, True, _offsets(lq), _offsets(lk))
    assert abs(band_density(m, True) - w.blocks.density) < 0.03
    grid = m.to_dense()
    i = torch.arange(grid.shape[2])[:, None]
    j = torch.arange(grid.shape[3])[None, :]
    assert not (grid & (j > i)).any()  # self-attention: nothing above the block diagonal


@pytest.mark.parametrize("name", W.BLOCK_SPARSE_WORKLOADS)
def test_mask_mod_builds_the_workload_mask(name) -> None:
    """What the build row times (from_mask_mod of the pattern's mask_mod) lists exactly the
    blocks the attention rows run."""
    w = W.get(name, smoke=True)
    lq, lk = w.sample_lengths()
    qo, ko = _offsets(lq), _offsets(lk)
    m = make_block_mask(w.blocks, lq, lk, True, qo, ko)
    bs = (w.blocks.block, w.blocks.block)
    built = BlockMask.from_mask_mod(mask_mod(w.blocks, m), qo, ko, 1, bs, max_seqlen_q=int(lq.max()), max_seqlen_kv=int(lk.max()))
    assert torch.equal(built.to_dense(), m.to_dense())
    assert int(m.kv_counts.sum()) > 0


def test_block_flops_match_brute_force() -> None:
    w = W.get("bs-lognormal-topk", smoke=True)
    b = make_batch(w, "cpu")
    m = b.block_mask
    bs = w.blocks.block
    grid = m.to_dense()
    brute = 0
    for s, (n, lk) in enumerate(zip(b.q_lens, b.kv_lens)):
        for i in range(n):
            for j in range(lk):
                brute += bool(grid[s, 0, i // bs, j // bs]) and j <= i + lk - n
    assert brute > 0
    assert block_mask_pairs(m, w.heads, causal=True) == brute * w.heads
    assert block_mask_pairs(m, w.heads, causal=False) > brute * w.heads


def test_fa4_varlen_tensors_hold_the_same_lists() -> None:
    """FA4's varlen layout read the way its kernel reads it (flash_attn/cute
    block_sparse_utils._get_curr_blocksparse_tensors_varlen): the count of q-block i of
    sequence b at cu_total_m_blocks[b] + i, its indices from cu_block_idx_offsets[b] + i * nK_b."""
    w = W.get("bs-lognormal-d50", smoke=True)
    b = make_batch(w, "cpu")
    m = b.block_mask
    fields = ("mask_block_cnt", "mask_block_idx", "cu_total_m_blocks", "cu_block_idx_offsets", "block_size")
    t = fa4_block_sparse(m, namedtuple("BlockSparseTensorsTorch", fields))
    bs = w.blocks.block
    assert (t.block_size, t.mask_block_cnt.dtype) == ((bs, bs), torch.int32)
    for s, (n, lk) in enumerate(zip(b.q_lens, b.kv_lens)):
        nkb = -(-lk // bs)
        for i in range(-(-n // bs)):
            c = int(t.mask_block_cnt[0, int(t.cu_total_m_blocks[s]) + i])
            at = int(t.cu_block_idx_offsets[s]) + i * nkb
            assert c == int(m.kv_counts[s, 0, i])
            assert t.mask_block_idx[0, at : at + c].tolist() == m.kv_indices[s, 0, i, :c].tolist()
    assert int(t.cu_total_m_blocks[-1]) == t.mask_block_cnt.shape[1]


def test_fa4_refuses_the_block_sparse_backward() -> None:
    w = W.get("bs-lognormal-d25", smoke=True)
    with pytest.raises(NotImplementedError, match="Varlen backward with block sparsity"):
        P._fa4_block_sparse_prepare(w, None, True)


@pytest.mark.skipif(importlib.util.find_spec("jagflash.variants.block_sparse") is None, reason="jagflash-block-sparse is not importable")
def test_block_sparse_smoke_run(run_bench) -> None:
    """A block-sparse workload end to end on the CPU: the variant under the interpreter and the
    reference backend, FlexAttention (eager) on the same mask, checked and timed; the baseline
    added for the jagflash providers only; build rows; the speed-up summary."""
    done, out = run_bench(
        "--smoke", "--workloads", "bs-lognormal-topk", "--providers", "jagflash-interpreter,jagflash-reference,flex,sdpa-loop",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = report.read_csv(out / "results.csv")
    by = {(r["workload"], r["provider"], r["direction"]): r for r in rows}
    for p in ("jagflash-interpreter", "jagflash-reference"):
        for d in ("fwd", "bwd"):
            r = by[("bs-lognormal-topk", p, d)]
            assert r["status"] == "ok", r
            assert r["rel_err"] < 1e-3
            assert by[("jagged-lognormal-causal-d128", p, d)]["status"] == "ok"
        assert by[("bs-lognormal-topk", p, "build")]["status"] == "ok"
    assert "block_sparse/interpreter" in by[("bs-lognormal-topk", "jagflash-interpreter", "fwd")]["note"]
    assert by[("bs-lognormal-topk", "flex", "fwd")]["status"] == "ok"
    assert by[("bs-lognormal-topk", "flex", "build")]["status"] == "ok"
    assert by[("bs-lognormal-topk", "sdpa-loop", "fwd")]["status"] == "unsupported"
    assert not any(r["workload"] == "jagged-lognormal-causal-d128" and r["provider"] in ("flex", "sdpa-loop") for r in rows)
    fwd = by[("bs-lognormal-topk", "jagflash-reference", "fwd")]
    assert fwd["flops"] > 0
    assert 0 < fwd["block_density"] <= 1
    summary = (out / "summary.txt").read_text()
    assert "fwd/dns" in summary
    assert report.BLOCK_SPARSE_GOALS in summary
    line = next(s for s in summary.splitlines() if s.startswith("bs-lognormal-topk") and "jf-interp" in s)
    assert line.count("x") >= 2  # the speed-ups against the baseline were computed
