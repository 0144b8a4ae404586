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


#: The fields of FA4's BlockSparseTensorsTorch (flash_attn.cute.block_sparsity) that
#: fa4_block_sparse fills, as a stand-in: these CPU tests run without FA4.
FA4_FIELDS = ("mask_block_cnt", "mask_block_idx", "full_block_cnt", "full_block_idx", "cu_total_m_blocks", "cu_block_idx_offsets", "block_size")
FA4Tensors = namedtuple("BlockSparseTensorsTorch", FA4_FIELDS)

#: (Lq, Lk) of the random masks: partial last blocks at 64 and 128, Lq < Lk, Lq > Lk (rows
#: that see nothing under causal), a one-row sequence, empty q and empty kv sequences.
FA4_SPLIT_LENGTHS = ((200, 200), (130, 300), (300, 130), (64, 64), (1, 257), (0, 70), (90, 0), (513, 400), (256, 384))


def _lengths(offsets) -> list[int]:
    return (offsets[1:] - offsets[:-1]).tolist()


def _fa4_split_brute_force(m, causal: bool) -> dict:
    """Per (sequence, head, q-block), from the elements: the listed kv-blocks every pair of which
    is visible (row below Lq, key below Lk and, causal, key <= row + Lk - Lq) and the others,
    each ascending: ``(mask, full)``."""
    bm, bn = m.block_size
    out = {}
    for s, (n, k) in enumerate(zip(_lengths(m.q_offsets), _lengths(m.kv_offsets))):
        for h in range(m.heads):
            for qb in range(-(-n // bm)):
                i = torch.arange(qb * bm, (qb + 1) * bm)[:, None]
                mask, full = [], []
                for kb in m.kv_indices[s, h, qb, : int(m.kv_counts[s, h, qb])].tolist():
                    j = torch.arange(kb * bn, (kb + 1) * bn)[None, :]
                    seen = (i < n) & (j < k) & ((j <= i + k - n) | (not causal))
                    (full if bool(seen.all()) else mask).append(kb)
                out[s, h, qb] = (mask, full)
    return out


def _fa4_read(t, kind: str, s: int, h: int, qb: int, nkb: int) -> tuple[list[int], list[int]]:
    """One list of q-block ``qb`` of sequence ``s`` read the way FA4's kernel reads it (flash_attn/cute
    block_sparse_utils._get_curr_blocksparse_tensors_varlen): the count at cu_total_m_blocks[s] + qb,
    the indices from cu_block_idx_offsets[s] + qb * nK_s; and the row's unused slots."""
    cnt, idx = getattr(t, f"{kind}_block_cnt"), getattr(t, f"{kind}_block_idx")
    c = int(cnt[h, int(t.cu_total_m_blocks[s]) + qb])
    at = int(t.cu_block_idx_offsets[s]) + qb * nkb
    return idx[h, at : at + c].tolist(), idx[h, at + c : at + nkb].tolist()


def _check_fa4_split(m, causal: bool) -> tuple[int, int]:
    """fa4_block_sparse(m) against the brute force: the layout, and per q-block mask ∪ full = the
    listed blocks (disjoint), full = the fully visible ones, both ascending. Returns the numbers
    of mask and full blocks."""
    t = fa4_block_sparse(m, FA4Tensors, causal=causal)
    bm, bn = m.block_size
    nq = [-(-n // bm) for n in _lengths(m.q_offsets)]
    nk = [-(-n // bn) for n in _lengths(m.kv_offsets)]
    cu_m, cu_idx = np.cumsum([0, *nq]).tolist(), np.cumsum([0, *np.multiply(nq, nk)]).tolist()
    assert t.block_size == (bm, bn)
    assert (t.cu_total_m_blocks.tolist(), t.cu_block_idx_offsets.tolist()) == (cu_m, cu_idx)
    for kind in ("mask", "full"):
        cnt, idx = getattr(t, f"{kind}_block_cnt"), getattr(t, f"{kind}_block_idx")
        assert (tuple(cnt.shape), tuple(idx.shape)) == ((m.heads, cu_m[-1]), (m.heads, cu_idx[-1]))
    assert all(x.dtype == torch.int32 and x.device == m.kv_counts.device for x in t if isinstance(x, torch.Tensor))
    seen = {"mask": 0, "full": 0}
    for (s, h, qb), want in _fa4_split_brute_force(m, causal).items():
        got = {}
        for kind in ("mask", "full"):
            got[kind], unused = _fa4_read(t, kind, s, h, qb, nk[s])
            assert got[kind] == sorted(set(got[kind]))  # strictly ascending: FA4 walks from the end
            assert not any(unused), (kind, s, h, qb, unused)
            seen[kind] += len(got[kind])
        listed = m.kv_indices[s, h, qb, : int(m.kv_counts[s, h, qb])].tolist()
        assert not set(got["mask"]) & set(got["full"]), (s, h, qb)
        assert sorted(got["mask"] + got["full"]) == listed, (s, h, qb)
        assert (got["mask"], got["full"]) == want, (s, h, qb, causal)
    return seen["mask"], seen["full"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [64, 128])
def test_fa4_split_matches_brute_force_on_random_masks(block, causal) -> None:
    """FA4's two lists of random jagged masks (two heads' lists) against the elements."""
    lq, lk = zip(*FA4_SPLIT_LENGTHS)
    nq, nk = -(-max(lq) // block), -(-max(lk) // block)
    grid = torch.rand(len(lq), 2, nq, nk, generator=torch.Generator().manual_seed(block + causal)) < 0.7
    m = BlockMask.from_dense(grid, _offsets(lq), _offsets(lk), (block, block))
    n_mask, n_full = _check_fa4_split(m, causal)
    assert n_mask > 0
    assert n_full > 0


@pytest.mark.parametrize("name", ["bs-lognormal-local-global", "bs-dense8k-topk"])
def test_fa4_split_of_workload_masks(name) -> None:
    """A bs-* workload's mask (causal, smoke size): both lists in use, the split as the brute
    force's."""
    w = W.get(name, smoke=True)
    b = make_batch(w, "cpu")
    n_mask, n_full = _check_fa4_split(b.block_mask, w.causal)
    assert n_mask > 0
    assert n_full > 0


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
