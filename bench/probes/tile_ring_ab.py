"""Probe (H200; issues 22, 20): the TLX forward, or the one-pass backward's dK/dV kernel, with
and without the tile ring (``RING_TILES``), in one process on the same inputs and plan.

    python bench/probes/tile_ring_ab.py --workloads bs-lognormal-d25,bs-dense8k-d25,jagged-lognormal-causal-d128
    python bench/probes/tile_ring_ab.py --kernel bwd      # the backward's BWD_WORKLOADS
    python bench/probes/tile_ring_ab.py --workloads jagged-lognormal-causal-d128 --variants 'NUM_KV=3,Q_BUFS=1,STAGE_O=1'

``--variants``: instead of ring on / off, the policy's config, then each variant (free fields
of ``jagflash.core.tuning.FREE_FIELDS`` set over it), then the policy's again; every forward
output bitwise equal to the policy's, every backward's dK and dV (dQ to rounding).

For each workload (its batch, and for a ``bs-*`` one its block pattern, as the bench builds
them) the kernel runs with the ring on and off, the rest of the config the policy's, the plan
built once outside the timing. The forward (``jagflash.core.tlx.fwd_sm90.forward``): the two
outputs must be bitwise equal (the ring moves where the tile's fields are read and when the
producer decodes a tile, not what is computed). The backward (``bwd_sm90.backward`` on the
forward's O and LSE, the policy's plan for it): dK and dV bitwise equal, dQ (reduce-added in a
run-dependent order) to rounding; its time includes the backward's per-token passes (the
vectors, the dQ cast: ``bench/probes/bwd_passes.py`` splits them). Each is timed with the
bench's ``measure`` (median, L2 flushed). Rows: ``workload, ring, policy (the ring the policy
picks), ms_p50, TFLOP/s (visible pairs, or listed pairs of a block mask; the backward 2.5x the
forward's), listed blocks, tiles, tiles with no listed block`` (the last three: the forward's
q-tiles of the sequences' own blocks, the backward's kv-tiles; blank without a mask).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys

import torch

#: The rows timed by default: the block-sparse forward's, and the non-sparse rows the ring serves
#: (tiny: on by the policy) or not (lognormal: off).
DEFAULT_WORKLOADS = (
    "bs-lognormal-d25", "bs-dense8k-d25", "bs-lognormal-d10", "bs-lognormal-local-global",
    "jagged-tiny-d128", "jagged-lognormal-causal-d128", "jagged-lognormal-d128",
)


#: The backward's rows by default: the block-sparse ones, and short dense K/V (tiny).
BWD_WORKLOADS = ("bs-lognormal-d25", "bs-dense8k-d25", "bs-lognormal-d10", "bs-lognormal-local-global", "jagged-tiny-d128")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=None, help="comma-separated (default: DEFAULT_WORKLOADS, or BWD_WORKLOADS)")
    ap.add_argument("--kernel", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument(
        "--variants", default=None,
        help="';'-separated configs to time instead of ring on / off, each FIELD=INT,... "
        "over the policy's (e.g. 'STAGE_O=1;NUM_KV=3,Q_BUFS=1,STAGE_O=1', backward 'OWN_SPAN=0'); the policy's runs first and last",
    )
    a = ap.parse_args()
    names = a.workloads or ",".join(BWD_WORKLOADS if a.kernel == "bwd" else DEFAULT_WORKLOADS)

    from jagflash.bench.data import make_batch
    from jagflash.bench.flops import block_mask_pairs, visible_pairs
    from jagflash.bench.sparsity import make_block_mask
    from jagflash.bench.timing import measure
    from jagflash.bench.workloads import get
    from jagflash.core.tlx import fwd_sm90
    from jagflash.core.tuning import forced_ring

    dev = torch.device("cuda")
    print("workload,ring,policy,ms_p50,tflops,listed_blocks,tiles,empty_tiles")
    for name in names.split(","):
        w = get(name)
        b = make_batch(w, dev)
        q, k, v, qo, ko = b.q, b.k, b.v, b.q_offsets, b.kv_offsets
        m = None if w.blocks is None else make_block_mask(w.blocks, b.q_lens, b.kv_lens, w.causal, qo, ko)
        hq, dim = q.shape[1], q.shape[2]
        left, right = (-1, 0) if w.causal else (-1, -1)
        if m is None:
            pairs, listed, tiles, empty = visible_pairs(b.q_lens, b.kv_lens, w.causal) * hq, "", "", ""
        else:
            own_counts, offs = (m.kv_counts, qo) if a.kernel == "fwd" else (m.q_counts, ko)
            lens = (offs[1:] - offs[:-1]).to(torch.int64)
            size = m.block_size[0 if a.kernel == "fwd" else 1]
            own = torch.arange(own_counts.shape[2], device=dev)[None, None, :] * size < lens[:, None, None]  # the sequences' own blocks
            counts = own_counts.expand(-1, hq, -1)[own.expand(-1, hq, -1)]
            pairs, listed = block_mask_pairs(m, hq, w.causal), int(counts.sum())
            tiles, empty = counts.numel(), int((counts == 0).sum())
        if a.kernel == "bwd":
            _backward_ab(name, b, m, left, right, dim, pairs, (listed, tiles, empty), dev, a.variants)
            continue
        plan, want = fwd_sm90.plan_and_config(q, k, qo, ko, b.max_q, left=left, right=right, scale=dim**-0.5, blocks=m)
        if a.variants:
            _variants_ab(name, b, m, plan, want, a.variants, left, right, dim, pairs, (listed, tiles, empty), dev)
            continue
        outs = {}
        for ring in (True, False):
            fwd = functools.partial(
                fwd_sm90.forward, q, k, v, qo, ko, b.max_q, left=left, right=right, scale=dim**-0.5, plan=plan,
                config=forced_ring(want, ring), blocks=m,
            )
            outs[ring] = fwd()
            ms = measure(fwd, dev).p50
            print(f"{name},{int(ring)},{int(want.RING_TILES)},{ms:.4f},{4 * dim * pairs / ms * 1e-9:.1f},{listed},{tiles},{empty}", flush=True)
        same = all(torch.equal(x, y) for x, y in zip(outs[True], outs[False]))
        print(f"# {name}: ring on/off outputs bitwise equal: {same}", file=sys.stderr, flush=True)
        if not same:
            sys.exit(1)


def _variants_ab(name, b, m, plan, want, variants, left, right, dim, pairs, blocks, dev) -> None:
    """The forward under the policy's config and each of ``variants`` (fields over it), the
    policy's again at the end: rows ``workload, variant, policy's RING_TILES, ms_p50, TFLOP/s,
    ...``; every output bitwise equal to the policy's (the variants move data, not arithmetic), but
    with ``SOLO`` (64-key steps: another order of the online softmax), whose largest difference to
    the policy's O and LSE is printed instead (its GPU tests check it against the reference)."""
    from jagflash.bench.timing import measure
    from jagflash.core.tlx import fwd_sm90

    q, k, v, qo, ko = b.q, b.k, b.v, b.q_offsets, b.kv_offsets
    ref = None
    for label, config in _runs(want, variants):
        fwd = functools.partial(
            fwd_sm90.forward, q, k, v, qo, ko, b.max_q, left=left, right=right, scale=dim**-0.5, plan=plan,
            config=config, blocks=m,
        )
        got = fwd()
        ref = ref or got
        same = all(torch.equal(x, y) for x, y in zip(got, ref))
        if getattr(config, "SOLO", False) and not same:
            finite = torch.isfinite(ref[1])
            print(f"# {name}: {label}: max |O - policy's| {(got[0].float() - ref[0].float()).abs().max().item():.3g}, "
                  f"max |LSE - policy's| {(got[1] - ref[1])[finite].abs().max().item():.3g}, "
                  f"same -inf LSE rows: {torch.equal(finite, torch.isfinite(got[1]))}", file=sys.stderr, flush=True)
            same = True
        ms = measure(fwd, dev).p50
        print(f"{name},{label},{int(want.RING_TILES)},{ms:.4f},{4 * dim * pairs / ms * 1e-9:.1f},"
              + ",".join(map(str, blocks)), flush=True)
        if not same:
            print(f"# {name}: {label}: outputs differ from the policy config's", file=sys.stderr, flush=True)
            sys.exit(1)


def _runs(want, variants):
    """``(label, config)`` of the policy's config, each of ``variants`` (``;``-separated
    ``FIELD=INT,...`` over it), then the policy's again; without variants the ring on and off
    (the fields that ride on it following it: ``tuning.forced_ring``)."""
    from jagflash.core.tuning import forced_ring

    if not variants:
        return [(f"ring={int(r)}", forced_ring(want, r)) for r in (True, False)]
    runs = [("policy", want)]
    for spec in (s_ for s_ in variants.split(";") if s_):
        fields = {f.split("=")[0]: int(f.split("=")[1]) for f in spec.split(",")}
        fields = {k_: bool(v_) if isinstance(getattr(want, k_), bool) else v_ for k_, v_ in fields.items()}
        runs.append((spec.replace(",", " "), dataclasses.replace(want, **fields)))
    return [*runs, ("policy", want)]


def _backward_ab(name, b, m, left, right, dim, pairs, blocks, dev, variants=None) -> None:
    """The backward's rows of one workload (see the module's docstring): the ring on and off, or
    the policy's config and ``variants`` (:func:`_runs`); dK and dV bitwise equal to the first
    run's, dQ to rounding."""
    from jagflash.bench.timing import measure
    from jagflash.core.tlx import bwd_sm90, fwd_sm90

    q, k, v, qo, ko = b.q, b.k, b.v, b.q_offsets, b.kv_offsets
    kw = {"left": left, "right": right, "scale": dim**-0.5, "blocks": m}
    out, lse = fwd_sm90.forward(q, k, v, qo, ko, b.max_q, **kw)
    plan, want = bwd_sm90.plan_and_config(q, k, qo, ko, left=left, right=right, blocks=m)
    first = None
    for label, config in _runs(want, variants):
        bwd = functools.partial(bwd_sm90.backward, b.dout, q, k, v, out, lse, qo, ko, plan=plan, config=config, **kw)
        got = bwd()
        first = first or got
        ms = measure(bwd, dev).p50
        print(f"{name},{label},{int(want.RING_TILES)}/{want.OWN_SPAN},{ms:.4f},{2.5 * 4 * dim * pairs / ms * 1e-9:.1f},"
              + ",".join(map(str, blocks)), flush=True)
        same = torch.equal(got[1], first[1]) and torch.equal(got[2], first[2])
        dq_diff = (got[0].float() - first[0].float()).abs().max().item()
        print(f"# {name}: {label}: dK, dV bitwise equal to the first run's: {same}; max |dQ - first| {dq_diff:.3g}",
              file=sys.stderr, flush=True)
        if not same or not dq_diff < 0.05:
            sys.exit(1)


if __name__ == "__main__":
    main()
