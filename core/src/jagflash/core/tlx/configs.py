"""The declared space of TLX kernel configurations: what the compile check (``jagflash.core.
compile_check``) builds for sm_90a on the CPU and what the GPU tests force.

The space is the product of the call classes that change a kernel's code (dtype, head dim, mask
kind, deal, the free choices of ``jagflash.core.tuning.FREE_FIELDS``), each mapped to its config
by the policy (``tuning.fwd_config`` / ``tuning.bwd_config``), with duplicates dropped; broadcast-Q,
a non-positive scale and GQA are added on the deals their calls get (the forward and the one-pass
backward on dynamic plans, GQA with a window too, the two passes' dK/dV on batch order; the one pass of a dense batch
without a mask also runs on batch order), on a batch of long K/V sequences; the dK/dV kernel's
tile ring on short ones adds a few samples (:data:`RING_SAMPLES`), and so does the one pass that
owns short sequences' dQ rows on a dynamic-grouped plan (:data:`OWN_SAMPLES`; its block-sparse sample also with
``SOLE_DQ``, the policy's on short sequences). A forward on a batch-order plan
differs from the static deal's by one flag (``ZIGZAG``) and is not compiled separately.
Block-sparse (``SPARSE``) kernels add a few samples of the product, not all of it
(:data:`SPARSE_SAMPLES`: each dtype, head dim and mask kind appears, on the deals their calls
get), since CI compiles every configuration.
"""

from __future__ import annotations

import dataclasses
from itertools import product

from jagflash.core.tlx.bwd_preprocess import CELL_INTS
from jagflash.core.tuning import (
    TLX_HEAD_DIMS,
    TLX_ONE_PASS_HEAD_DIMS,
    bwd_config,
    fwd_config,
    own_span,
)

#: ``(left, right)`` of each mask kind: none, causal, a two-sided window.
MASKS = {"": (-1, -1), "causal": (-1, 0), "window": (64, 0)}
#: The deals a plan can give a pass: dynamic (atomic counter), static zigzag, batch order.
DEALS = {"dynamic": (True, False), "static": (False, True), "none": (False, False)}
DTYPES = ("fp16", "bf16")
#: ``(kernel, deal, dtype, head dim, mask)`` of the block-sparse configurations compiled: the
#: forward and the one pass on dynamic plans, the two passes' dK/dV on batch order.
SPARSE_SAMPLES = (
    ("fwd", "dynamic", "fp16", 128, ""), ("fwd", "dynamic", "bf16", 128, "causal"),
    ("fwd", "dynamic", "fp16", 64, "window"), ("fwd", "dynamic", "bf16", 64, ""),
    ("bwd", "dynamic", "fp16", 128, "causal"), ("bwd", "dynamic", "bf16", 64, ""),
    ("dkdv", "none", "fp16", 128, "window"), ("dkdv", "none", "bf16", 128, "causal"),
)
#: ``(dtype, head dim, mask)`` of the sparse forward sample also compiled with ``SOLO`` (one Q tile).
SOLO_SAMPLE = ("bf16", 128, "causal")
#: As :data:`SPARSE_SAMPLES`, with a tiled 64 x 64 mask (``FINE``: ``jagflash.core.block_tiles``);
#: the forward's first also with ``SOLO``.
FINE_SAMPLES = (
    ("fwd", "dynamic", "bf16", 128, "causal"), ("bwd", "dynamic", "bf16", 128, "causal"),
    ("bwd", "dynamic", "fp16", 64, ""), ("dkdv", "none", "bf16", 128, "window"),
)
#: ``(kernel, deal, dtype, head dim, mask)`` of the dK/dV kernel's configurations with the tile
#: ring on a batch of short K/V sequences (``tuning.default_ring_tiles``), compiled as samples:
#: the rest of the space is a batch of long ones (the ring off).
RING_SAMPLES = (
    ("bwd", "dynamic", "bf16", 128, ""), ("bwd", "dynamic", "fp16", 128, "causal"),
    ("bwd", "dynamic", "bf16", 64, "window"), ("dkdv", "none", "fp16", 128, ""), ("dkdv", "none", "bf16", 64, "causal"),
)
#: ``(kernel, deal, dtype, head dim, mask)`` of the one pass on a dynamic-grouped table, which owns
#: its short sequences' dQ rows (``tuning.own_span``; with the tile ring), compiled as samples;
#: ``OWN_SPARSE``: the block-sparse one of them.
OWN_SAMPLES = (
    ("bwd", "dynamic", "bf16", 128, ""), ("bwd", "dynamic", "fp16", 128, "causal"), ("bwd", "dynamic", "bf16", 128, "window"),
)
OWN_SPARSE = ("bwd", "dynamic", "bf16", 128, "causal")
#: ``bwd_config``'s batch arguments for a batch of long K/V sequences and for one of short ones.
LONG_KV = {"total_kv": 1 << 30, "batch": 1}
SHORT_KV = {"total_kv": 1, "batch": 1}


def fwd_space():
    """``(name, FwdConfig, dtype)`` of every forward configuration."""
    out = {}
    for dtype, dim, (mask, (left, right)), (deal, (dyn, zz)), ring in product(DTYPES, TLX_HEAD_DIMS, MASKS.items(), DEALS.items(), (False, True)):
        if (deal == "none") or (ring and deal != "dynamic"):
            continue  # batch order differs from a static deal by one flag; the ring is for dynamic plans
        extras = [("", {})]
        if deal == "dynamic":
            extras.append(("_gqa", {"group": 4}))
        if deal == "dynamic" and mask != "window":
            extras.append(("_unfolded", {"scale": -1.0}))
            if not mask:
                extras.append(("_bq", {"q_shared": True}))
        for (suffix, kw), crowded in product(extras, (False, True) if ring else (False,)):
            call = {"group": 1, "q_shared": False, "scale": 1.0, "crowded": crowded, **kw}
            # the policy's config on a batch of short K/V sequences (the ring; with fewer than two
            # tiles an SM, or at least two: SOLO, tuning.default_solo) or of long ones
            cfg = fwd_config(head_dim=dim, left=left, right=right, dynamic=dyn, zigzag=zz, **(SHORT_KV if ring else LONG_KV), **call)
            if ring != cfg.RING_TILES:
                raise RuntimeError(f"the forward policy no longer rings on {'short' if ring else 'long'} K/V: {cfg}")
            kind = ("_solo" if cfg.SOLO else "_ring") if ring else ""
            out.setdefault((cfg, dtype), f"tlx_fwd_{deal}{suffix}{kind} {dtype} d{dim}{' ' + mask if mask else ''}")
    for (kind, deal, dtype, dim, mask), fine in [(s, False) for s in SPARSE_SAMPLES] + [(s, True) for s in FINE_SAMPLES]:
        if kind == "fwd":
            (left, right), (dyn, zz) = MASKS[mask], DEALS[deal]
            cfg = fwd_config(
                head_dim=dim, group=1, left=left, right=right, q_shared=False, scale=1.0, dynamic=dyn, zigzag=zz,
                total_kv=1, batch=1, sparse=True, fine=fine,
            )
            tag = "_fine" if fine else "_sparse"
            out.setdefault((cfg, dtype), f"tlx_fwd_{deal}{tag} {dtype} d{dim}{' ' + mask if mask else ''}")
            if (dtype, dim, mask) == SOLO_SAMPLE:  # (the forward's SOLO, a free field: one sample)
                out.setdefault((dataclasses.replace(cfg, SOLO=True, Q_BUFS=1), dtype), f"tlx_fwd_{deal}{tag}_solo {dtype} d{dim} {mask}")
    return [(name, cfg, dtype) for (cfg, dtype), name in out.items()]


def bwd_space():
    """``(name, BwdConfig, dtype)`` of every dK/dV kernel configuration: the one pass on a dynamic
    plan (every mask; GQA; broadcast-Q), on a static one (every mask) and on batch order (a dense
    batch without a mask); the two passes' dK/dV on batch order (every mask; broadcast-Q)."""
    out = {}
    for dtype, dim, (mask, (left, right)), (deal, (dyn, zz)), fused in product(DTYPES, TLX_HEAD_DIMS, MASKS.items(), DEALS.items(), (True, False)):
        if fused and dim not in TLX_ONE_PASS_HEAD_DIMS:
            continue
        if (not fused and deal != "none") or (fused and deal == "none" and mask):
            continue
        extras = [("", {})]
        if fused and deal == "dynamic":
            extras.append(("_gqa", {"group": 4}))
        if not mask and (deal == "dynamic" or not fused):
            extras.append(("_bq", {"q_shared": True}))
        for suffix, kw in extras:
            call = {"group": 1, "q_shared": False, **kw}
            cfg = bwd_config(head_dim=dim, left=left, right=right, fused_dq=fused, dynamic=dyn, zigzag=zz, **call, **LONG_KV)
            name = f"tlx_{'bwd' if fused else 'dkdv'}_{deal}{suffix} {dtype} d{dim}{' ' + mask if mask else ''}"
            out.setdefault((cfg, dtype), name)
    samples = [(s, "_sparse", {"sparse": True, **LONG_KV}) for s in SPARSE_SAMPLES if s[0] != "fwd"]
    samples += [(s, "_fine", {"sparse": True, "fine": True, **LONG_KV}) for s in FINE_SAMPLES if s[0] != "fwd"]
    samples += [(s, "_ring", SHORT_KV) for s in RING_SAMPLES]
    samples += [(s, "_own", {"grouped": True, **LONG_KV}) for s in OWN_SAMPLES]
    samples += [(OWN_SPARSE, "_own_sparse", {"grouped": True, "sparse": True, **LONG_KV})]
    samples += [(OWN_SPARSE, "_own_sparse_sole", {"grouped": True, "sparse": True, **LONG_KV})]
    for (kind, deal, dtype, dim, mask), suffix, kw in samples:
        (left, right), (dyn, zz) = MASKS[mask], DEALS[deal]
        cfg = bwd_config(
            head_dim=dim, group=1, left=left, right=right, q_shared=False, fused_dq=kind == "bwd", dynamic=dyn,
            zigzag=zz, **kw,
        )
        if suffix.startswith("_own"):  # (what own_span allows: the policy owns on dynamic-grouped tables)
            span = own_span(dim, cfg.BLOCK_N, fused_dq=cfg.FUSED_DQ, q_shared=False, grouped=True)
            cfg = dataclasses.replace(cfg, OWN_SPAN=span, RING_TILES=True)
        if suffix.endswith("_sole"):  # (what the policy takes on short K/V sequences: tuning.SOLE_MEAN_KV)
            cfg = dataclasses.replace(cfg, SOLE_DQ=True)
        out.setdefault((cfg, dtype), f"tlx_{kind}_{deal}{suffix} {dtype} d{dim}{' ' + mask if mask else ''}")
    return [(name, cfg, dtype) for (cfg, dtype), name in out.items()]


#: The type of a kernel's ``lists`` argument with ``SPARSE``: a block mask's ``(counts,
#: indices, head_stride, seq_stride, width)`` (``jagflash.core.block_mask.BlockMask.kernel_lists``).
LISTS_TYPE = ("*i32", "*i32", "i32", "i32", "i32")


def _lists(cfg) -> tuple[dict[str, object], dict[str, object]]:
    """The ``lists`` argument's signature and constexpr entries: a tuple with ``SPARSE``, else
    the constant None the launches pass."""
    if cfg.SPARSE:  # (a tiled 64 x 64 mask's also its bits: FINE)
        return {"lists": LISTS_TYPE + (("*i32",) if cfg.FINE else ())}, {}
    return {"lists": "constexpr"}, {"lists": None}


def _fwd_signature(cfg, dtype: str) -> dict[str, str]:
    d, slot = cfg.HEAD_DIM, cfg.BLOCK_N // 2 if cfg.SOLO else cfg.BLOCK_N  # (SOLO: K/V slots of half a block)
    return {
        "desc_q": f"tensordesc<{dtype}[{cfg.BLOCK_M // 2},{d}]>", "desc_k": f"tensordesc<{dtype}[{slot},{d}]>",
        "desc_v": f"tensordesc<{dtype}[{slot},{d}]>", "desc_o": f"tensordesc<{dtype}[{cfg.BLOCK_M // 2},{d}]>", "O": f"*{dtype}", "LSE": "*fp32", "q_offsets": "*i32",
        "kv_offsets": "*i32", "TILES": "*i32", "COUNT": "*i64", "COUNTER": "*i32" if cfg.DYNAMIC else "*i64",
        "stride_ot": "i32:16", "stride_oh": "i32:16", "stride_lh": "i32", "stride_ls": "i32", "scale": "fp32",
        "left": "i32", "right": "i32", "heads": "i32",
    }


def _bwd_signature(cfg, dtype: str) -> dict[str, str]:
    d, bm, bn = cfg.HEAD_DIM, cfg.BLOCK_M, cfg.BLOCK_N
    return {
        "desc_q": f"tensordesc<{dtype}[{bm},{d}]>", "desc_k": f"tensordesc<{dtype}[{bn // 2},{d}]>",
        "desc_v": f"tensordesc<{dtype}[{bn // 2},{d}]>", "desc_do": f"tensordesc<{dtype}[{bm},{d}]>",
        "DK": f"*{dtype}", "DV": f"*{dtype}", "desc_lse2": f"tensordesc<fp32[1,{bm}]>",
        "desc_delta": f"tensordesc<fp32[1,{bm}]>", "VEC_TILE": "*i32", "q_offsets": "*i32", "kv_offsets": "*i32",
        "TILES": "*i32", "COUNT": "*i64", "COUNTER": "*i32" if cfg.DYNAMIC else "*i64", "stride_dkt": "i32:16",
        "stride_dkh": "i32:16", "stride_dvt": "i32:16", "stride_dvh": "i32:16", "scale": "fp32", "left": "i32",
        "right": "i32",
        "desc_dq": f"tensordesc<fp32[{bm},{cfg.DQ_COLS}]>" if cfg.FUSED_DQ else f"tensordesc<{dtype}[{bm},{d}]>",
        "heads": "i32", "DQ_ACC": "*fp32" if cfg.FUSED_DQ else f"*{dtype}", "DQ": f"*{dtype}", "stride_acc": "i32:16",
        "stride_dqt": "i32:16", "desc_adds": f"tensordesc<i32[1,{CELL_INTS.value}]>", "desc_dqo": f"tensordesc<{dtype}[{bm},{cfg.DQ_COLS}]>",
    }


def compile_configs():
    """Every configuration of the space as the compile check takes it: ``(name, kernel,
    signature, constexprs, options, known_spill)``. ``known_spill``: the spilled bytes a
    configuration is known to need (bench/NOTES.md tracks them; the check fails on more)."""
    from jagflash.core.tlx.bwd_sm90 import _dkdv_kernel
    from jagflash.core.tlx.fwd_sm90 import _fwd_kernel

    options = {"num_warps": 4, "num_stages": 1}
    out = []
    for kernel, space, signature in ((_fwd_kernel, fwd_space(), _fwd_signature), (_dkdv_kernel, bwd_space(), _bwd_signature)):
        for name, cfg, dtype in space:
            lists_sig, lists_const = _lists(cfg)
            sig = {**signature(cfg, dtype), **lists_sig}
            constexprs = {**lists_const, **cfg.constexprs()}
            sig.update(dict.fromkeys(cfg.constexprs(), "constexpr"))
            opts = {**options, "maxnreg": 128} if getattr(cfg, "SOLO", False) else options  # (as fwd_sm90.forward launches it)
            out.append((name, kernel, sig, constexprs, opts, KNOWN_SPILLS.get(name, 0)))
    return out


#: Spilled bytes per configuration as compiled on the CPU (compile_check's table, 2026-12-01:
#: Triton 3.8.0 + uTLX 3.8.0.post16); a known spill stays visible in the table, a larger one fails.
#: At D 128 the forward carries P in fp32 and spills a few per-tile values outside its kv loop
#: (none inside it; fewer with the tile ring, whose consumers re-read the tile's record for the
#: epilogue: HOLD_RECORD, 2026-12-07); the dK/dV kernel keeps dK and dV (64 x D fp32 each) beside
#: the S^T / dP^T tiles and, in the one pass, its dQ tile; the masked steps of a window need the most.
KNOWN_SPILLS: dict[str, int] = {
    "tlx_fwd_dynamic_unfolded fp16 d64 causal": 8,
    "tlx_fwd_dynamic_unfolded_ring fp16 d64 causal": 8,
    "tlx_fwd_dynamic fp16 d128": 24,
    "tlx_fwd_dynamic_gqa fp16 d128": 24,
    "tlx_fwd_dynamic_unfolded fp16 d128": 56,
    "tlx_fwd_dynamic_bq fp16 d128": 24,
    "tlx_fwd_dynamic_ring fp16 d128": 8,
    "tlx_fwd_dynamic_gqa_ring fp16 d128": 8,
    "tlx_fwd_dynamic_unfolded_ring fp16 d128": 40,
    "tlx_fwd_dynamic_bq_ring fp16 d128": 8,
    "tlx_fwd_static fp16 d128": 28,
    "tlx_fwd_dynamic fp16 d128 causal": 44,
    "tlx_fwd_dynamic_gqa fp16 d128 causal": 44,
    "tlx_fwd_dynamic_unfolded fp16 d128 causal": 52,
    "tlx_fwd_dynamic_ring fp16 d128 causal": 20,
    "tlx_fwd_dynamic_gqa_ring fp16 d128 causal": 20,
    "tlx_fwd_dynamic_unfolded_ring fp16 d128 causal": 52,
    "tlx_fwd_static fp16 d128 causal": 44,
    "tlx_fwd_dynamic fp16 d128 window": 68,
    "tlx_fwd_dynamic_ring fp16 d128 window": 40,
    "tlx_fwd_static fp16 d128 window": 68,
    "tlx_fwd_dynamic_gqa fp16 d128 window": 68,
    "tlx_fwd_dynamic_gqa_ring fp16 d128 window": 40,
    "tlx_fwd_dynamic bf16 d128": 32,
    "tlx_fwd_dynamic_gqa bf16 d128": 32,
    "tlx_fwd_dynamic_unfolded bf16 d128": 56,
    "tlx_fwd_dynamic_bq bf16 d128": 32,
    "tlx_fwd_dynamic_ring bf16 d128": 8,
    "tlx_fwd_dynamic_gqa_ring bf16 d128": 8,
    "tlx_fwd_dynamic_unfolded_ring bf16 d128": 40,
    "tlx_fwd_dynamic_bq_ring bf16 d128": 8,
    "tlx_fwd_static bf16 d128": 32,
    "tlx_fwd_dynamic bf16 d128 causal": 44,
    "tlx_fwd_dynamic_gqa bf16 d128 causal": 44,
    "tlx_fwd_dynamic_unfolded bf16 d128 causal": 52,
    "tlx_fwd_dynamic_ring bf16 d128 causal": 20,
    "tlx_fwd_dynamic_gqa_ring bf16 d128 causal": 20,
    "tlx_fwd_dynamic_unfolded_ring bf16 d128 causal": 52,
    "tlx_fwd_static bf16 d128 causal": 48,
    "tlx_fwd_dynamic bf16 d128 window": 60,
    "tlx_fwd_dynamic_ring bf16 d128 window": 40,
    "tlx_fwd_static bf16 d128 window": 60,
    "tlx_fwd_dynamic_gqa bf16 d128 window": 60,
    "tlx_fwd_dynamic_gqa_ring bf16 d128 window": 40,
    "tlx_bwd_dynamic fp16 d128": 32,
    "tlx_bwd_dynamic_bq fp16 d128": 32,
    "tlx_bwd_static fp16 d128": 32,
    "tlx_dkdv_none fp16 d128": 104,
    "tlx_dkdv_none_bq fp16 d128": 104,
    "tlx_bwd_dynamic fp16 d128 causal": 140,
    "tlx_bwd_dynamic_gqa fp16 d128 causal": 104,
    "tlx_bwd_static fp16 d128 causal": 140,
    "tlx_dkdv_none fp16 d128 causal": 112,
    "tlx_bwd_dynamic fp16 d128 window": 136,
    "tlx_bwd_dynamic_gqa fp16 d128 window": 40,
    "tlx_bwd_static fp16 d128 window": 136,
    "tlx_dkdv_none fp16 d128 window": 188,
    "tlx_bwd_dynamic bf16 d128": 32,
    "tlx_bwd_dynamic_bq bf16 d128": 32,
    "tlx_bwd_static bf16 d128": 32,
    "tlx_dkdv_none bf16 d128": 104,
    "tlx_dkdv_none_bq bf16 d128": 104,
    "tlx_bwd_dynamic bf16 d128 causal": 60,
    "tlx_bwd_static bf16 d128 causal": 140,
    "tlx_dkdv_none bf16 d128 causal": 112,
    "tlx_bwd_dynamic bf16 d128 window": 152,
    "tlx_bwd_dynamic_gqa bf16 d128 window": 96,
    "tlx_bwd_static bf16 d128 window": 136,
    "tlx_dkdv_none bf16 d128 window": 188,
    "tlx_bwd_none fp16 d128": 32,
    "tlx_bwd_none bf16 d128": 32,
    # block-sparse (2026-12-02). The forward with the
    # tile ring (session 17): none in its loops but at fp16 without a mask, where the masked loop
    # (a sequence's partial last block, at most one a tile) reloads 11 values an iteration. The
    # consumers' walk through pipeline.walk_on (session 25) added 8 B outside the loops of four
    # forward ring configurations (the record counter; the loops' code unchanged)
    "tlx_fwd_dynamic_sparse fp16 d128": 228,
    "tlx_fwd_dynamic_sparse bf16 d128 causal": 40,
    # With the tile ring in the backward (session 25; block-sparse, and the ring samples of short
    # K/V): none in the one pass's loops, one reload an iteration in the masked steps of the two
    # passes' dK/dV with a window.
    "tlx_bwd_dynamic_sparse fp16 d128 causal": 72,
    "tlx_bwd_dynamic_sparse bf16 d64": 56,
    "tlx_dkdv_none_sparse fp16 d128 window": 264,
    "tlx_dkdv_none_sparse bf16 d128 causal": 224,
    "tlx_bwd_dynamic_ring fp16 d128 causal": 72,
    "tlx_dkdv_none_ring fp16 d128": 56,
    # The one pass owning short sequences' dQ rows (session 30; with the tile ring): the rows'
    # zero and cast loops outside the main loops, none in them but with a window, whose masked
    # steps reload 3 values an iteration (as the ring's window configurations without owning).
    "tlx_bwd_dynamic_own bf16 d128": 4,
    "tlx_bwd_dynamic_own fp16 d128 causal": 76,
    "tlx_bwd_dynamic_own bf16 d128 window": 120,
    "tlx_bwd_dynamic_own_sparse bf16 d128 causal": 12,
    # With SOLE_DQ: single cells by TMA store, the count from the producer (session 36; the store
    # through registers spilled 128 B, session 35): reloads at the step loops' entries, none inside.
    "tlx_bwd_dynamic_own_sparse_sole bf16 d128 causal": 60,
    # A tiled 64 x 64 mask (FINE, session 41): the row's bits and the half's first row live across
    # the loops; none inside them (the forward's +44 B against its 128 x 128 sample, outside).
    "tlx_fwd_dynamic_fine bf16 d128 causal": 84,
    "tlx_bwd_dynamic_fine bf16 d128 causal": 32,
    "tlx_bwd_dynamic_fine fp16 d64": 52,
    "tlx_dkdv_none_fine bf16 d128 window": 300,
}
