"""Probe (one GPU; issue 22): the pair evaluation behind ``BlockMask.from_mask_mod`` on its own,
in several formulations, and what one whole build costs on the device and on the host.

    python bench/probes/mask_mod_eval.py                        # bs-lognormal-d25, -local-global, bs-dense8k-local-global
    python bench/probes/mask_mod_eval.py --code                 # + Inductor's generated code (stderr)
    python bench/probes/mask_mod_eval.py --host-profile         # + cProfile of warm builds (stderr)
    TRITON_INTERPRET=1 python bench/probes/mask_mod_eval.py --smoke   # the CPU, tiny, no figures

For each workload (the bench's batches; its mask_mod: the local + global rule or the lookup of
the listed grid, ``jagflash.bench.sparsity.mask_mod``) the blocks of the builder's no-sync room
are enumerated once (``jagflash.core.mask_mod``'s enumeration), then the builder's compiled
evaluation of the pairs' ``any`` (``jagflash.core.mask_mod._compiled``: only the block count
dynamic, the kv axis reduced first) is timed on those blocks (``measure`` p50, CUDA events) and
per call in a loop (``loop_ms``: the host's share), with int32 and with int64 indices; both
must list the same blocks. Then the whole build (``from_mask_mod``, the max lengths and totals
given; for the local + global rule, which reads no ``b``, also ``per_sequence=False``) the same
two ways. Rows: ``workload, what, ms_p50, loop_ms, blocks, pairs_g_per_s``; the sparse forward
of the workload is a row too (the goal: build <= 10 % of it).

Session 20's calls 1-2 compared the formulations this replaced (this file at 7afbfc8 and at
the commit after it: one reduction over ``bm * bn`` or the kv axis first, ``dynamic=True`` or
only the count dynamic, with and without Inductor's indirect-index asserts).
"""

from __future__ import annotations

import argparse
import sys

import torch

DEFAULT_WORKLOADS = ("bs-lognormal-d25", "bs-lognormal-local-global", "bs-dense8k-local-global")


#: name: the index dtype the builder's compiled evaluation hands the mask_mod
FORMS = {"builder int32": torch.int32, "builder int64": torch.int64}


def _host_profile(title: str, build, dev: torch.device, calls: int = 3) -> None:
    """cProfile of ``calls`` warm builds (the device drained after each), to stderr: where a
    build's host time goes, by cumulative time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    for _ in range(calls):
        prof.enable()
        build()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
    print(f"## host profile {title}, {calls} builds\n{out.getvalue()}", file=sys.stderr)


def workload_rows(name: str, smoke: bool, dev: torch.device, host_profile: bool = False) -> list[tuple]:
    from jagflash.bench.data import make_batch
    from jagflash.bench.sparsity import mask_mod
    from jagflash.bench.timing import loop_ms, measure
    from jagflash.bench.workloads import get
    from jagflash.core.block_mask import BlockMask, _block_counts
    from jagflash.core.jagged import seq_lengths
    from jagflash.core.mask_mod import _blocks, _compiled
    from jagflash.variants.block_sparse import block_sparse_attention
    from jagflash.variants.block_sparse import make_plan as sparse_plan

    w = get(name, smoke=smoke)
    bt = make_batch(w, dev)
    m = bt.block_mask
    bm, bn = m.block_size
    rule = mask_mod(w.blocks, m)
    qo, ko = bt.q_offsets, bt.kv_offsets
    rows = []
    with torch.no_grad():
        sp = sparse_plan(bt.q, bt.k, qo, ko, m, causal=w.causal)
        fwd = measure(lambda: block_sparse_attention(bt.q, bt.k, bt.v, qo, ko, m, causal=w.causal, plan=sp), dev).p50
    rows.append((name, "block_sparse_attention fwd", fwd, "", int(m.kv_counts.sum()), ""))
    nq_b, nk_b = _block_counts(qo, bm), _block_counts(ko, bn)
    nq, nk = -(-bt.max_q // bm), -(-bt.max_kv // bn)
    batch = qo.numel() - 1
    room = min(batch * nq * nk, (bt.total_q + batch * (bm - 1)) // bm * nk, (bt.total_kv + batch * (bn - 1)) // bn * nq)
    *block, _where = _blocks(bm, bn, False, nq_b * nk_b, nq_b, nk_b, seq_lengths(qo), seq_lengths(ko), 0, room, nq, nk)
    ref = None
    for form, idx in FORMS.items():
        fn = _compiled(rule, 1, bm, bn, idx)
        got = fn(*block)
        ref = got if ref is None else ref
        if not torch.equal(got, ref):
            raise SystemExit(f"{name}: {form} lists other blocks than int32")
        t = measure(lambda fn=fn: fn(*block), dev).p50
        rows.append((name, f"pairs {form}", t, loop_ms(lambda fn=fn: fn(*block), dev), room, round(room * bm * bn / t / 1e6, 1)))

    for path, per_sequence in (("default", True), ("shared", False))[: 2 if w.blocks.kind == "local_global" else 1]:
        def build(per_sequence=per_sequence):
            return BlockMask.from_mask_mod(
                rule, qo, ko, 1, (bm, bn), max_seqlen_q=bt.max_q, max_seqlen_kv=bt.max_kv, total_q=bt.total_q,
                total_kv=bt.total_kv, per_sequence=per_sequence,
            )

        built = build()
        if w.blocks.kind == "local_global" and not torch.equal(built.to_dense(), m.to_dense()):
            raise SystemExit(f"{name}: from_mask_mod ({path}) listed other blocks than the workload's mask")
        t = measure(build, dev).p50
        rows.append((name, f"from_mask_mod {path}", t, loop_ms(build, dev), room, ""))
        if host_profile:
            _host_profile(f"{name} {path}", build, dev)
    return [tuple(round(x, 4) if isinstance(x, float) else x for x in r) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--smoke", action="store_true", help="the workloads' smoke versions (CPU interpreter)")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--code", action="store_true", help="Inductor's generated code, to stderr")
    ap.add_argument("--host-profile", action="store_true", help="cProfile of warm builds, to stderr")
    a = ap.parse_args()
    if a.code:
        torch._logging.set_logs(output_code=True)
    torch._dynamo.config.recompile_limit = 64  # a mask_mod function's closures share one entry code: a compile per batch
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    table = [["workload", "what", "ms_p50", "loop_ms", "blocks", "pairs_g_per_s"]]
    for name in a.workloads.split(","):
        table += workload_rows(name, a.smoke, dev, a.host_profile)
    from jagflash.bench.report import emit_table

    emit_table(table, a.csv)


if __name__ == "__main__":
    main()
