"""Probe (one GPU; issue 22): what ``BlockMask.from_mask_mod`` costs beside one forward of the
same batch (the goal: <= 10 %).

    python bench/probes/mask_mod_build.py                      # bs-lognormal and bs-dense8k, H200
    python bench/probes/mask_mod_build.py --csv $OUT/mask_mod_build.csv
    TRITON_INTERPRET=1 python bench/probes/mask_mod_build.py --smoke   # the CPU, tiny, no figures

For each workload (default ``bs-lognormal-local-global`` and ``bs-dense8k-local-global``: the
bench's batches, ``jagflash.bench.data.make_batch``) and each mask_mod (the bench's local +
global rule, ``jagflash.bench.sparsity.mask_mod``, and a causal document mask_mod: documents of
lognormal lengths, median 200 rows (``--document-medians``: others too), inside each sequence,
looked up per token from a packed id tensor) it times, after the first call (its wall clock printed on its own: where the compiled
builder compiles), ``from_mask_mod`` with the max lengths and totals given (no host sync) on the
builder's default path (the generated kernel on CUDA), compiled (``torch.compile``) and eager
(the local + global rule, which reads no ``b``, also with ``per_sequence=False``: the kernel and
the shared grid compiled), and one forward of
``jagged_attention`` (dense, causal) and of ``block_sparse_attention`` with the workload's
mask, plans built outside the timing. Times are ``jagflash.bench.timing.measure`` p50 (CUDA
events, many repetitions; wall clock on the CPU). Rows: ``workload, what, path, ms_p50,
first_call_ms, build / dense forward, build / sparse forward, listed blocks``. ``--profile``
adds, on stderr, each build path's busiest kernels, its launches a build and its host wall time;
``--host-profile`` a ``cProfile`` of the default path's host side.
On CUDA the default and shared builds are also timed replayed in a CUDA graph (``(CUDA graph)``
rows): the device's own time, without the host's; and the host's own time of a call (``(host)``
rows: calls queued without a sync, :func:`host_ms`; ``(host, Triton's launch)``: the generated
kernel launched through Triton's ``kernel[grid](...)`` every call instead of directly).
"""

from __future__ import annotations

import argparse
import sys

import torch

#: The bench batches the probe times by default (bench workloads: tested).
DEFAULT_WORKLOADS = ("bs-lognormal-local-global", "bs-dense8k-local-global")


def _profile(title: str, build, dev: torch.device, calls: int = 5) -> None:
    """``torch.profiler`` over ``calls`` warm builds, to stderr: the busiest device kernels (or
    CPU ops) by total time, the number of launches a build makes, and a build's host wall time
    (the gap between the two is launch overhead)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            build()
        host_ms = (time.perf_counter() - t0) * 1e3 / calls
        if dev.type == "cuda":
            torch.cuda.synchronize()
    events = prof.key_averages()
    sort = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
    kernels = [e for e in events if dev.type != "cuda" or e.device_type.name == "CUDA"]
    launches = sum(e.count for e in kernels) / calls
    print(f"## profile {title}: {launches:.0f} {'kernels' if dev.type == 'cuda' else 'ops'} a build, host {host_ms:.3f} ms a build", file=sys.stderr)
    print(events.table(sort_by=sort, row_limit=12), file=sys.stderr)


def host_ms(build, dev: torch.device, calls: int = 200, rounds: int = 5) -> float:
    """The host's own time of a call (ms, the least of ``rounds`` means over ``calls`` calls
    queued without a sync; the device's queue is drained between rounds, not timed)."""
    import time

    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(calls):
            build()
        best = min(best, (time.perf_counter() - t0) * 1e3 / calls)
    torch.cuda.synchronize(dev)
    return best


def _host_profile(title: str, build, calls: int = 300) -> None:
    """``cProfile`` of ``calls`` warm builds (queued without a sync), to stderr: where the host's
    time of a build goes (by own time, then by cumulative time)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        build()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(18)
    stats.sort_stats("cumulative").print_stats(14)
    print(f"## host profile {title} ({calls} builds)\n{out.getvalue()}", file=sys.stderr)


def workload_rows(
    name: str, smoke: bool, dev: torch.device, profile: bool = False, host_profile: bool = False, medians: tuple[int, ...] = (200,),
) -> list[tuple]:
    """The probe's rows of one workload (module docstring)."""
    from jagflash.bench.data import make_batch
    from jagflash.bench.sparsity import document_mask_mod, mask_mod, mask_mod_reads_b
    from jagflash.bench.timing import first_call_ms, measure
    from jagflash.bench.workloads import get
    from jagflash.core.block_mask import BlockMask
    from jagflash.variants.block_sparse import block_sparse_attention
    from jagflash.variants.block_sparse import make_plan as sparse_plan
    from jagflash.variants.jagged import jagged_attention
    from jagflash.variants.jagged import make_plan as jagged_plan

    w = get(name, smoke=smoke)
    b = make_batch(w, dev)
    q, k, v, qo, ko, m = b.q, b.k, b.v, b.q_offsets, b.kv_offsets, b.block_mask
    bounds = dict(max_seqlen_q=b.max_q, max_seqlen_kv=b.max_kv)
    with torch.no_grad():
        jp = jagged_plan(q, k, qo, ko, causal=w.causal, **bounds)
        dense = measure(lambda: jagged_attention(q, k, v, qo, ko, causal=w.causal, **bounds, plan=jp), dev).p50
        sp = sparse_plan(q, k, qo, ko, m, causal=w.causal)
        sparse = measure(lambda: block_sparse_attention(q, k, v, qo, ko, m, causal=w.causal, plan=sp), dev).p50
    rows = [
        (name, "jagged_attention fwd", "default", dense, "", "", "", ""),
        (name, "block_sparse_attention fwd", "default", sparse, "", "", "", int(m.kv_counts.sum())),
    ]
    paths = (("default", None, True), ("compiled", "compiled", True), ("eager", "eager", True))
    shared = (("shared", None, False), ("shared compiled", "compiled", False))  # per_sequence=False: b not read
    own = "local+global" if w.blocks.kind == "local_global" else f"{w.blocks.kind} lookup"  # the workload's own mask_mod
    own_more = () if mask_mod_reads_b(w.blocks) else shared
    documents = [("document" if n == 200 else f"document (median {n})", document_mask_mod(b, n), ()) for n in medians]
    for rule_name, rule, more in ((own, mask_mod(w.blocks, m), own_more), *documents):
        for path, evaluator, per_sequence in paths + more:
            def build(rule=rule, evaluator=evaluator, per_sequence=per_sequence):
                return BlockMask.from_mask_mod(
                    rule, qo, ko, 1, m.block_size, **bounds, total_q=b.total_q, total_kv=b.total_kv, evaluator=evaluator,
                    per_sequence=per_sequence,
                )

            first, built = first_call_ms(build, dev)
            if rule_name == own and not torch.equal(built.to_dense(), m.to_dense()):
                raise SystemExit(f"{name}: from_mask_mod of the workload's {own} rule listed other blocks than its mask")
            t = measure(build, dev).p50
            if profile:
                _profile(f"{name} {rule_name} {path}", build, dev)
            if host_profile and path == "default":
                _host_profile(f"{name} {rule_name} {path}", build)
            rows.append((
                name, f"from_mask_mod {rule_name}", path, t, round(first, 1), round(t / dense, 3), round(t / sparse, 3),
                int(built.kv_counts.sum()),
            ))
            if path in ("default", "shared") and dev.type == "cuda":  # the device's own time: the build replayed in a CUDA graph
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    build()
                g = measure(graph.replay, dev).p50
                rows.append((name, f"from_mask_mod {rule_name}", f"{path} (CUDA graph)", g, "", round(g / dense, 3), round(g / sparse, 3), ""))
                h = host_ms(build, dev)
                rows.append((name, f"from_mask_mod {rule_name}", f"{path} (host)", h, "", round(h / dense, 3), round(h / sparse, 3), ""))
                from jagflash.core import mask_mod_kernel

                def through_triton(build=build):  # Triton's own launch path every call (its binding of the arguments)
                    mask_mod_kernel._BOUND.clear()
                    return build()

                h = host_ms(through_triton, dev)
                rows.append((name, f"from_mask_mod {rule_name}", f"{path} (host, Triton's launch)", h, "", round(h / dense, 3), round(h / sparse, 3), ""))
    return [tuple(round(x, 4) if isinstance(x, float) else x for x in r) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--smoke", action="store_true", help="the workloads' smoke versions (CPU interpreter)")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--profile", action="store_true", help="torch.profiler of each build path, to stderr")
    ap.add_argument("--host-profile", action="store_true", help="cProfile of the default build's host side, to stderr")
    ap.add_argument("--document-medians", default="200", help="the document mask_mods' median lengths (rows), comma-separated")
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    table = [["workload", "what", "path", "ms_p50", "first_call_ms", "build_over_dense_fwd", "build_over_sparse_fwd", "listed_blocks"]]
    for name in a.workloads.split(","):
        table += workload_rows(name, a.smoke, dev, a.profile, a.host_profile, tuple(int(x) for x in a.document_medians.split(",")))
    from jagflash.bench.report import emit_table

    emit_table(table, a.csv)
    print(f"# device {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}", file=sys.stderr)


if __name__ == "__main__":
    main()
