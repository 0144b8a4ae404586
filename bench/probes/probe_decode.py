"""Probe (H200; a CPU smoke): the decode path of #20 (``jagflash.core.portable.decode``) on the
issue's short-query rows, against the tile kernels and the peers, forward, in one run.

Rows (H 16, D 128, bf16; lengths seeded):

- ``tokens1-b4096``: 4,096 sequences of 1 query and 1 key (the issue's "4,096 sequences of 1
  token"; goal <= 60 us).
- ``q1-64-kv1024-b512``: 512 sequences of U[1, 65) queries against U[960, 1089) keys (the issue's
  "512 x (1-64 queries vs ~1,024 keys)"); past the automatic bound (16), so ``auto`` is the tile
  kernels there and ``decode`` forces the decode kernel.
- ``q1-16-kv1024-b512-gqa4``: the same keys, U[1, 17) queries, 4 kv heads: what the automatic
  rule sends to the decode kernel.

Providers: jagflash on ``tlx-sm90`` and ``portable``, each ``auto`` (the call's own choice),
``decode`` (``decode=True``) and ``tiles`` (``decode=False``), with a plan built once outside the
timing (as the bench does); the bench's own ``varlen-fa2`` and ``fa4`` providers
(``jagflash.bench.providers``), FA4 in a child process without the TLX bundle on PYTHONPATH
(``jagflash.bench.env.host_triton_env``, as the bench runs it). Every provider's output is
checked against the bench's float32 reference (``jagflash.bench.reference``) before it is timed
(``jagflash.bench.timing.measure``: do_bench p20/p50/p80; ``--graphs``: replayed in a CUDA graph
under 0.1 ms). Prints one line per (row, provider): ms, TFLOP/s from the visible pairs, the
relative error, the path ``last_choice`` reports. ``--backward``: the backward instead (dQ, dK,
dV checked against the reference first; TFLOP/s at 2.5x the forward's FLOPs; with ``--graphs``
replayed by ``jagflash.bench.timing.graph_backward`` on fresh leaves), e.g. whether the decode
backward (``jagflash-*-decode``) beats the tile kernels on the 1-64-query row, where the
automatic rule keeps the tiles.

H200: ``PROBE=bench/probes/probe_decode.py PROBE_TIMEOUT_S=400 bash bench/gpu.sh probe``
(``PROBE_ARGS=--causal`` for the causal rows, ``--graphs`` for CUDA-graph replays).
CPU: ``TRITON_INTERPRET=1 python bench/probes/probe_decode.py --smoke`` (the rows shrunk, the
interpreter only; seconds). ``TRITON_INTERPRET=0 python bench/probes/probe_decode.py --ptx`` (CPU,
no GPU): each row's decode launches at full size compiled for sm_90a (``portable_ptx``'s
compile), forward and backward, with their grids, tiles, registers and spills.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np
import torch

from jagflash.bench.data import make_batch
from jagflash.bench.env import host_triton_env
from jagflash.bench.flops import fwd_flops
from jagflash.bench.providers import PROVIDERS, Prepared
from jagflash.bench.reference import compute_reference, rel_err, tolerance
from jagflash.bench.timing import measure
from jagflash.bench.workloads import Fixed, Uniform, Workload

#: name -> (q lengths, kv lengths, kv heads, smoke: (count, q hi, kv lo, kv hi)).
ROWS = {
    "tokens1-b4096": (Fixed(4096, 1), Fixed(4096, 1), 16, (6, 2, 1, 2)),
    "q1-64-kv1024-b512": (Uniform(512, 1, 65), Uniform(512, 960, 1089), 16, (3, 9, 60, 90)),
    "q1-16-kv1024-b512-gqa4": (Uniform(512, 1, 17), Uniform(512, 960, 1089), 4, (3, 5, 60, 90)),
}
JAGFLASH = {f"jagflash-{b}-{p}": (backend, p) for b, backend in (("tlx", "tlx-sm90"), ("portable", "portable")) for p in ("auto", "decode", "tiles")}
PEERS = ("varlen-fa2", "fa4")


def _row(name: str, causal: bool, smoke: bool) -> tuple[Workload, np.ndarray, np.ndarray]:
    q_spec, kv_spec, hkv, small = ROWS[name]
    seed = sum(map(ord, name))
    if smoke:
        count, q_hi, kv_lo, kv_hi = small
        q_spec, kv_spec = Uniform(count, 1, q_hi), Uniform(count, kv_lo, kv_hi)
        hkv = 1 if hkv < 16 else 2
    w = Workload(
        name, "jagged", kv_spec, heads=(4 if hkv == 1 else 2) if smoke else 16, kv_heads=hkv,
        head_dim=32 if smoke else 128, dtype="float32" if smoke else "bfloat16", causal=causal, seed=seed,
    )
    rng = np.random.default_rng(seed)
    return w, q_spec.sample(rng).astype(np.int64), kv_spec.sample(rng).astype(np.int64)


def _jagflash(backend: str, path: str, w: Workload, batch, grad: bool) -> Prepared:
    from jagflash.core.backend import last_choice
    from jagflash.variants.jagged import jagged_attention, make_plan

    q, k, v = (t.detach().requires_grad_(grad) for t in (batch.q, batch.k, batch.v))
    decode = {"auto": None, "decode": True, "tiles": False}[path]
    mq, mk = batch.max_q, batch.max_kv
    kw = dict(causal=w.causal, max_seqlen_q=mq, max_seqlen_kv=mk, backend=backend, decode=decode)
    if decode is False:  # the tile kernels on a plan built once, as the bench runs them; a decode
        # forward without gradients builds none, and ``auto`` takes the plan its first call keeps
        kw["plan"] = make_plan(
            q, k, batch.q_offsets, batch.kv_offsets, causal=w.causal, max_seqlen_q=mq, max_seqlen_kv=mk,
            backward=grad, backend=backend,
        )

    def note() -> str:
        c = last_choice("jagged")
        return f"{c.name}/{c.path}" if c is not None else ""

    return Prepared(
        fwd=lambda: jagged_attention(q, k, v, batch.q_offsets, batch.kv_offsets, **kw),
        leaves=(q, k, v), dout=batch.dout, note=note,
    )


def _prepare(p: str, w: Workload, batch, device: torch.device, grad: bool) -> Prepared:
    if p in JAGFLASH:
        return _jagflash(*JAGFLASH[p], w, batch, grad)
    prov = PROVIDERS[p]
    why = prov.available(device) or prov.supports(w)
    if why:
        raise NotImplementedError(why)
    return prov.prepare(w, batch, grad)


def _time_backward(p: str, w: Workload, batch, ref, device: torch.device, args):
    """The backward of provider ``p``: its dQ, dK, dV checked against ``ref``, then timed
    (eager do_bench, or with ``--graphs`` replayed on fresh leaves); ``(timing, worst error,
    the path the checked call took)``."""
    from jagflash.bench.timing import graph_backward

    def backwards(prep):
        with torch.enable_grad():
            out = prep.fwd()
        return lambda: torch.autograd.grad(out, prep.leaves, prep.dout, retain_graph=True)

    prep = _prepare(p, w, batch, device, True)
    eager = backwards(prep)
    dq, dk, dv = prep.grads_canon(tuple(eager()))
    err = max(rel_err(ref.slice_q(dq), ref.dq), rel_err(ref.slice_kv(dk), ref.dk), rel_err(ref.slice_kv(dv), ref.dv))
    if not err <= tolerance(batch.q.dtype):
        raise RuntimeError(f"wrong: relative error {err:.3g} (worst of dQ, dK, dV)")
    note = prep.note()
    if args.graphs and device.type == "cuda":
        t, why = graph_backward(lambda: [backwards(_prepare(p, w, batch, device, True))], device)
        if t is not None:
            return t, err, note
        print(f"{p}: backward graph capture failed ({why}): eager", flush=True)
    return measure(eager, device), err, note


def _measure_row(name: str, providers: list[str], args) -> list[dict]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    w, q_lens, kv_lens = _row(name, args.causal, args.smoke)
    batch = make_batch(w, device, lengths=(q_lens, kv_lens))
    ref = compute_reference(batch, grads=args.backward)
    flops = fwd_flops(q_lens, kv_lens, heads=w.heads, head_dim=w.head_dim, causal=w.causal)
    flops *= 2.5 if args.backward else 1
    rows = []
    for p in providers:
        row = {"row": name, "provider": p, "B": len(q_lens), "Tq": int(q_lens.sum()), "Tk": int(kv_lens.sum())}
        try:
            if args.backward:
                t, err, note = _time_backward(p, w, batch, ref, device, args)
                row.update(err=err, note=note)
            else:
                prep = _prepare(p, w, batch, device, False)
                with torch.no_grad():
                    out = prep.out_canon(prep.fwd())
                    err = rel_err(out[:, : ref.heads_q], ref.out)
                    row.update(err=err, note=prep.note())
                    if not err <= tolerance(batch.q.dtype):
                        raise RuntimeError(f"wrong: relative error {err:.3g}")
                    t = measure(prep.fwd, device, cuda_graph=args.graphs)
            row.update(ms=t.p50, p20=t.p20, p80=t.p80, timer=t.timer, tflops=flops / (t.p50 * 1e-3) / 1e12)
        except Exception as e:  # the row says why; the next provider still runs
            row.update(error=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        rows.append(row)
    return rows


def _ptx(args) -> None:
    """Compile each row's decode launches for sm_90a on the CPU (132 SMs assumed) and print them."""
    from portable_ptx import _compile, _ptxas  # bench/probes/ is on sys.path

    import jagflash.core.portable.decode as dec

    class Compiled:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def run(*a, num_warps=4, num_stages=2, **kw):
                c = _compile(self.kernel, a, {**kw, "num_warps": num_warps, "num_stages": num_stages})
                tiles = f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_D']} seqs {kw['SEQS']} splits {kw['SPLITS']}"
                print(f"  {self.kernel.fn.__name__:20s} grid {grid} {tiles} shared {c.metadata.shared} | {_ptxas(c.asm['ptx'])}")

            return run

    for name in ("decode_fwd_kernel", "decode_merge_kernel", "decode_bwd_kernel", "decode_bwd_merge_kernel"):
        setattr(dec, name, Compiled(getattr(dec, name)))
    dec.default_workers = lambda device: 132
    for name in args.rows.split(","):
        w, q_lens, kv_lens = _row(name, args.causal, False)
        print(name)
        qo, ko = (torch.tensor(np.concatenate([[0], np.cumsum(x)]), dtype=torch.int32) for x in (q_lens, kv_lens))
        q = torch.empty(int(qo[-1]), w.heads, w.head_dim, dtype=torch.bfloat16)
        k = torch.empty(int(ko[-1]), w.hkv, w.head_dim, dtype=torch.bfloat16)
        kw = dict(
            max_seqlen_q=int(q_lens.max()), max_seqlen_kv=int(kv_lens.max()), left=-1,
            right=0 if args.causal else -1, scale=w.head_dim**-0.5, backend="portable",
        )
        dec.forward(q, k, k, qo, ko, **kw)
        lse = torch.empty(w.heads, q.shape[0], dtype=torch.float32)
        dec.backward(q, q, k, k, q, lse, qo, ko, **kw)


def _print(rows: list[dict]) -> None:
    for r in rows:
        if "error" in r:
            print(f"{r['row']:24s} {r['provider']:24s} {r['error']}")
        else:
            print(
                f"{r['row']:24s} {r['provider']:24s} {r['ms'] * 1e3:9.1f} us (p20 {r['p20'] * 1e3:.1f}, p80 {r['p80'] * 1e3:.1f}, "
                f"{r['timer']}) {r['tflops']:7.2f} TFLOP/s err {r['err']:.1e} {r.get('note', '')}"
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--providers", default=",".join([*JAGFLASH, *PEERS]))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--graphs", action="store_true", help="replay rows under 0.1 ms in a CUDA graph")
    ap.add_argument("--backward", action="store_true", help="time the backward (gradients checked first)")
    ap.add_argument("--smoke", action="store_true", help="tiny rows (the CPU's interpreter)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON (the FA4 child)")
    ap.add_argument("--ptx", action="store_true", help="compile the decode launches for sm_90a (CPU)")
    args = ap.parse_args()
    if args.ptx:
        return _ptx(args)
    wanted = [p for p in args.providers.split(",") if p]
    if not torch.cuda.is_available():
        wanted = [p.replace("-tlx-", "-portable-") for p in wanted if p in JAGFLASH and "tlx" not in p]
        JAGFLASH.update({p: ("interpreter", JAGFLASH[p][1]) for p in wanted})
    here = [p for p in wanted if p != "fa4" or args.json]
    child = "fa4" in wanted and not args.json
    rows = []
    for name in args.rows.split(","):
        rows += _measure_row(name, here, args)
    if child:  # FA4 needs the host's own Triton: a child process without the TLX bundle
        cmd = [sys.executable, __file__, "--json", "--providers", "fa4", "--rows", args.rows]
        cmd += [f for f, on in (("--causal", args.causal), ("--graphs", args.graphs), ("--smoke", args.smoke),
                                ("--backward", args.backward)) if on]
        res = subprocess.run(cmd, env=host_triton_env(), capture_output=True, text=True, check=False)
        lines = [line for line in res.stdout.splitlines() if line.startswith("[")]
        if lines:
            rows += json.loads(lines[-1])
        else:
            rows.append({"row": "*", "provider": "fa4", "error": f"child failed (rc {res.returncode}): {res.stderr.strip()[-300:]}"})
    if args.json:
        print(json.dumps(rows))
    else:
        rows.sort(key=lambda r: (list(ROWS).index(r["row"]) if r["row"] in ROWS else 99))
        _print(rows)


if __name__ == "__main__":
    main()
