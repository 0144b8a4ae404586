"""The worker: checks and times a list of (workload, provider) items, writing rows as it goes.

A plan (JSON, written by the CLI) names the items, directions, device, timing settings and a
deadline. The worker appends JSON lines to the plan's rows file: ``meta`` once, ``begin`` before
each item (so the parent knows which item a crash or hang belongs to), then one ``row`` per
direction. Items of one workload share the same input sets and the same reference in this process.

Exit status 3 means the CUDA context is gone (a kernel faulted): the parent restarts a worker for
the items that remain. Every other failure of a provider is a row, never a crash.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import gc
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = ["CONTEXT_LOST", "run_plan"]

CONTEXT_LOST = 3
# Seconds before a stuck item gets its Python stacks dumped to stderr (diagnosis only).
HANG_DUMP_S = 180
#: Eager rows under this median also get ``loop_ms`` (``jagflash.bench.timing.loop_ms``): ms per
#: call of calls issued back to back, what a loop of small eager calls runs at.
LOOP_BELOW_MS = 2.0


class ContextLost(RuntimeError):
    pass


@dataclass
class Plan:
    items: list[tuple[str, str]]
    directions: list[str]
    device: str
    smoke: bool
    rows_file: str
    group: str = "main"
    deadline: float | None = None
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    min_reps: int = 20
    cuda_graphs: bool = False
    graph_below_ms: float = 0.1
    measure_ceilings: bool = False
    progress_done: int = 0
    progress_total: int = 0
    run_info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        data = json.loads(Path(path).read_text())
        data["items"] = [tuple(i) for i in data["items"]]
        return cls(**data)

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.__dict__, indent=1))


class _Writer:
    def __init__(self, path: str):
        self.fh = open(path, "a")  # noqa: SIM115 - kept open for the worker's life

    def __call__(self, record: dict) -> None:
        self.fh.write(json.dumps(record, default=str) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def _short(e: BaseException, limit: int = 300) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg[:limit]}" if msg else type(e).__name__


class _WorkloadState:
    """Input sets and the reference of one workload, built lazily and shared by its providers."""

    def __init__(self, w, device, plan: Plan):
        from jagflash.bench.data import make_batch

        self.w = w
        self.device = device
        self.plan = plan
        self._lengths = w.sample_lengths()
        self._make = make_batch
        self._batches: list = []
        self._ref = None
        self._ref_grads = False
        self._base: dict | None = None
        self._ref_failed: str | None = None

    def batches(self, n: int) -> list:
        while len(self._batches) < n:
            self._batches.append(self._make(self.w, self.device, len(self._batches), self._lengths))
        return self._batches[:n]

    def n_sets(self) -> int:
        from jagflash.bench.timing import rotation_sets

        return rotation_sets(self.batches(1)[0].nbytes(), self.device)

    def reference(self, grads: bool):
        from jagflash.bench.reference import GPU_FLOP_BUDGET, compute_reference

        if self._ref_failed is not None:
            raise RuntimeError(f"the reference failed: {self._ref_failed}")
        if self._ref is not None and (self._ref_grads or not grads):
            return self._ref
        budget = GPU_FLOP_BUDGET if self.device.type == "cuda" else None
        self._ref = None
        try:
            self._ref = compute_reference(self.batches(1)[0], grads=grads, flop_budget=budget)
        except Exception as e:
            # Every provider of this workload would fail the same way: fail them without
            # recomputing (an out-of-memory reference would otherwise cost each one its time).
            self._ref_failed = _short(e)
            raise RuntimeError(f"the reference failed: {self._ref_failed}") from e
        self._ref_grads = grads
        return self._ref

    def base_row(self) -> dict:
        """The columns every row of this workload shares (a fresh copy)."""
        if self._base is None:
            self._base = self._make_base_row()
        return {**self._base, "_flops": dict(self._base["_flops"])}

    def _make_base_row(self) -> dict:
        from jagflash.bench.flops import block_mask_pairs, bwd_flops, fwd_flops
        from jagflash.bench.sparsity import band_density

        w = self.w
        q_lens, kv_lens = self._lengths
        extra = {}
        if w.blocks is not None:
            # FLOPs on the pairs the mask lets through: TFLOP/s compare across providers
            mask = self.batches(1)[0].block_mask
            f = 4 * w.head_dim * block_mask_pairs(mask, w.heads, w.causal, w.window)
            extra["block_density"] = round(band_density(mask, w.causal), 4)
        else:
            f = fwd_flops(
                q_lens, kv_lens, heads=w.heads, head_dim=w.head_dim, causal=w.causal, window=w.window
            )
        return {
            **extra,
            "workload": w.name,
            "kind": w.kind,
            "num_seqs": len(kv_lens),
            "tokens_q": int(w.q_len if w.kind == "broadcast_q" else q_lens.sum()),
            "tokens_kv": int(kv_lens.sum()),
            "max_q": int(q_lens.max()) if len(q_lens) else 0,
            "max_kv": int(kv_lens.max()) if len(kv_lens) else 0,
            "heads_q": w.heads,
            "heads_kv": w.hkv,
            "head_dim": w.head_dim,
            "dtype": w.dtype,
            "causal": w.causal,
            "window": "" if not w.has_window else f"{w.window[0]}:{w.window[1]}",
            "smoke": w.is_smoke,
            "_flops": {"fwd": f, "bwd": bwd_flops(f), "build": 0},
        }

    def free(self) -> None:
        self._batches.clear()
        self._ref = None


def smoke_dtype(device: str) -> str:
    """Smoke runs use float32 under the CPU's interpreter (it gets bf16 wrong), bf16 on a GPU."""
    return "float32" if device == "cpu" else "bfloat16"


def _poison_free_memory(batch, device) -> None:
    """Leave NaN in the allocator's free blocks of output size before a provider's checked run.

    A provider that leaves part of its output unwritten could otherwise inherit the previous
    provider's correct values from a reused block and pass the check. Heuristic (the caching
    allocator tends to hand the same-size block back), cheap, and NaN never passes the check.
    """
    import torch

    if device.type != "cuda":
        return
    shape = batch.out_shape()
    blocks = [torch.full(shape, float("nan"), dtype=batch.q.dtype, device=device) for _ in range(3)]
    del blocks


def _peak_mib(fn, device) -> float | None:
    """Memory one call of ``fn`` allocates on the GPU at its peak, above what was allocated
    before it (MiB): the working memory a user pays for, e.g. the expanded Q of the expand-Q
    baseline, or a training forward's saved tensors. ``None`` off CUDA."""
    import torch

    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def _context_broken(device) -> bool:
    import torch

    if device.type != "cuda":
        return False
    try:
        torch.cuda.synchronize(device)
        torch.ones(1, device=device).add_(1).item()
    except Exception:
        return True
    return False


class Worker:
    def __init__(self, plan: Plan, emit):
        import torch

        from jagflash.bench import providers as P
        from jagflash.bench import workloads as W

        self.torch = torch
        self.P, self.W = P, W
        self.plan = plan
        self.emit = emit
        self.device = torch.device(plan.device)
        self.env = {}
        self._available: dict[str, str | None] = {}
        from jagflash.bench.progress import Progress

        self.progress = Progress(plan.progress_total, plan.progress_done)

    # ---------------------------------------------------------------- rows

    def _row(
        self,
        state: _WorkloadState,
        provider: str,
        direction: str,
        status: str,
        note: str = "",
        **kw,
    ) -> dict:
        base = state.base_row()
        flops = base.pop("_flops")[direction]
        row = {
            **base,
            "provider": provider,
            "direction": direction,
            "status": status,
            "note": note,
            "flops": flops,
            "device": self.device.type,
            **self.env,
            **self.plan.run_info,
        }
        row.update(kw)
        return row

    def _emit_row(self, row: dict) -> None:
        self.emit({"type": "row", **row})
        what = f"{row['workload']} · {row['provider']} · {row['direction']} · {row['status']}"
        if row["status"] == "ok":
            rate = "" if row.get("tflops") is None else f" {row['tflops']:.4g} TFLOP/s"
            what += f"{rate} {row['ms_p50']:.4g} ms"
        elif row.get("note"):
            what += f": {row['note'][:100]}"
        self.progress.advance(what)

    def _all_dirs(self, state, provider, status, note) -> None:
        for d in self.plan.directions:
            self._emit_row(self._row(state, provider, d, status, note))

    # ------------------------------------------------------------- budget

    def _timing_kw(self, remaining_items: int) -> dict:
        p = self.plan
        kw = dict(
            warmup_ms=p.warmup_ms,
            rep_ms=p.rep_ms,
            min_reps=p.min_reps,
            cuda_graph=p.cuda_graphs,
            graph_below_ms=p.graph_below_ms,
            max_rep_ms=max(2000.0, p.rep_ms),
        )
        if p.deadline is None or self.device.type != "cuda":
            return kw
        left = p.deadline - time.time()
        per_item = left / max(remaining_items, 1)
        nominal = len(p.directions) * (p.warmup_ms + 2 * p.rep_ms) / 1e3 + 2.0
        f = max(0.05, min(1.0, per_item / nominal))
        if f < 1.0:
            kw.update(
                warmup_ms=max(2.0, p.warmup_ms * f),
                rep_ms=max(5.0, p.rep_ms * f),
                min_reps=max(3, int(p.min_reps * f)),
                max_rep_ms=max(50.0, 2000.0 * f),
            )
        return kw

    # ------------------------------------------------------------ measure

    def _available_reason(self, prov) -> str | None:
        if prov.name not in self._available:
            if not prov.runs_on(self.device.type):
                reason = f"runs on {'/'.join(sorted(prov.devices))} only"
            else:
                try:
                    reason = prov.available(self.device)
                except Exception as e:
                    reason = f"availability check raised {_short(e)}"
            self._available[prov.name] = reason
        return self._available[prov.name]

    def _measure(self, prov, state: _WorkloadState, remaining_items: int) -> None:
        prep = self._measure_dirs(prov, state, remaining_items)
        if prep is not None and prep.build is not None and "fwd" in self.plan.directions:
            self._measure_build(prov, prep, state, self._timing_kw(remaining_items))

    def _graph_backward(self, prov, state: _WorkloadState, batches, eager, leaves, timing_kw):
        """With ``--cuda-graphs``, a backward whose eager run is under ``--graph-below-ms`` timed
        by replaying it in a CUDA graph on fresh leaves (:func:`timing.graph_backward`):
        ``(timing, "")``; ``(None, "")`` where it is not offered, ``(None, why)`` where its capture
        failed (the caller times it eagerly and its timer says why)."""
        from jagflash.bench.timing import estimate_ms, graph_backward

        torch, dev = self.torch, self.device
        if not (timing_kw.get("cuda_graph") and dev.type == "cuda"):
            return None, ""
        est = estimate_ms(eager, dev)
        for x in leaves:
            x.grad = None
        if est >= timing_kw["graph_below_ms"]:
            return None, ""

        def make_backwards():
            fns = []
            for b in batches:
                p = prov.prepare(state.w, b, True)  # fresh leaves: no eager backward touched them
                with torch.enable_grad():
                    out = p.fwd()
                fns.append(
                    functools.partial(
                        torch.autograd.grad, out, p.leaves, p.dout, retain_graph=True, allow_unused=True
                    )
                )
            return fns

        return graph_backward(make_backwards, dev, rep_ms=timing_kw["rep_ms"])

    def _measure_dirs(self, prov, state: _WorkloadState, remaining_items: int):
        """Check and time ``prov``'s directions; its first Prepared when the forward passed."""
        from jagflash.bench.reference import rel_err, tolerance
        from jagflash.bench.timing import Rotator, measure

        torch = self.torch
        w, dev, dirs = state.w, self.device, self.plan.directions
        want_bwd = "bwd" in dirs
        no_bwd = prov.no_backward(dev)
        grad = want_bwd and no_bwd is None
        n_sets = state.n_sets()
        batches = state.batches(n_sets)

        def first_forward(grad: bool):
            preps = [prov.prepare(w, b, grad) for b in batches]
            _poison_free_memory(batches[0], dev)
            with torch.set_grad_enabled(grad):
                out = preps[0].fwd()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            return preps, out

        try:
            preps, out = first_forward(grad)
        except NotImplementedError as e:
            if not grad:
                raise
            # A forward-only backend refuses inputs that require grad: time its (inference)
            # forward anyway, and say why there is no backward.
            no_bwd, grad = f"forward only: {_short(e, 300)}", False
            preps, out = first_forward(grad)
        ref = state.reference(grads=want_bwd)
        tol = tolerance(batches[0].q.dtype)
        check_note = ref.note(w.heads)
        timing_kw = self._timing_kw(remaining_items)
        notes = [n for n in (preps[0].note(), check_note) if n]
        err_fwd = rel_err(ref.slice_q(preps[0].out_canon(out)), ref.out)
        fwd_ok = err_fwd <= tol
        # Forward is timed as a training forward when backward is benchmarked too; a provider
        # without a backward can only run the inference forward, and its row says so.
        notes_fwd = [*notes, "inference forward (no backward)"] if want_bwd and not grad else notes
        if "fwd" in dirs:
            if not fwd_ok:
                self._emit_row(
                    self._row(
                        state,
                        prov.name,
                        "fwd",
                        "wrong",
                        f"rel err {err_fwd:.3g} > {tol:g} on out",
                        rel_err=err_fwd,
                    )
                )
            else:

                def fwd_fn(p):
                    with torch.set_grad_enabled(grad):
                        p.fwd()

                peak = _peak_mib(functools.partial(fwd_fn, preps[0]), dev)
                calls = Rotator([functools.partial(fwd_fn, p) for p in preps])
                t = measure(calls, dev, **timing_kw)
                loop = self._loop_ms(t, calls)
                self._emit_timed(state, prov.name, "fwd", t, err_fwd, notes_fwd, n_sets, peak, loop)
        if not want_bwd:
            return preps[0] if fwd_ok else None
        if no_bwd is not None:
            self._emit_row(self._row(state, prov.name, "bwd", "unsupported", no_bwd))
            return preps[0] if fwd_ok else None
        if not fwd_ok:
            self._emit_row(
                self._row(
                    state,
                    prov.name,
                    "bwd",
                    "wrong",
                    f"not timed: forward rel err {err_fwd:.3g} > {tol:g}",
                    rel_err=err_fwd,
                )
            )
            return preps[0] if fwd_ok else None
        p0 = preps[0]
        grads = torch.autograd.grad(out, p0.leaves, p0.dout, retain_graph=True, allow_unused=True)
        dq, dk, dv = p0.grads_canon(tuple(grads))
        errs = {}
        for name, x, r, sl in (
            ("dq", dq, ref.dq, ref.slice_q),
            ("dk", dk, ref.dk, ref.slice_kv),
            ("dv", dv, ref.dv, ref.slice_kv),
        ):
            errs[name] = float("inf") if x is None else rel_err(sl(x), r)
        worst = max(errs, key=errs.get)
        del grads, dq, dk, dv
        if errs[worst] > tol:
            detail = ", ".join(f"{k} {v:.3g}" for k, v in errs.items())
            self._emit_row(
                self._row(
                    state,
                    prov.name,
                    "bwd",
                    "wrong",
                    f"rel err {detail} (> {tol:g})",
                    rel_err=errs[worst],
                )
            )
            return preps[0] if fwd_ok else None
        outs = [out]
        with torch.enable_grad():
            outs += [p.fwd() for p in preps[1:]]
        fns = [
            functools.partial(o.backward, p.dout, retain_graph=True) for o, p in zip(outs, preps)
        ]
        leaves = [x for p in preps for x in p.leaves]
        peak = _peak_mib(fns[0], dev)
        for x in leaves:
            x.grad = None
        eager = Rotator(fns)
        t, why = self._graph_backward(prov, state, batches, eager, leaves, timing_kw)
        if t is None:
            t = measure(eager, dev, grad_to_none=leaves, **{**timing_kw, "cuda_graph": False})
            if why:
                t = replace(t, timer=f"{t.timer} (backward graph capture failed: {why})")

        def fresh_grads_call():
            for x in leaves:
                x.grad = None
            eager()

        loop = self._loop_ms(t, fresh_grads_call)
        self._emit_timed(state, prov.name, "bwd", t, errs[worst], notes, n_sets, peak, loop)
        return preps[0]

    def _measure_build(self, prov, prep, state: _WorkloadState, timing_kw: dict) -> None:
        """The ``build`` row of a provider whose Prepared builds a block mask: its result checked
        (``build_check``), then timed like the other rows (FLOPs 0: ms only). The checked first
        call (where a compiled builder compiles) is timed on its own, wall clock, into the notes;
        the row is the steady state."""
        from jagflash.bench.timing import first_call_ms, measure

        try:
            first = first_call_ms(prep.build, self.device)
            problem = prep.build_check(first[1])
            if problem:
                self._emit_row(self._row(state, prov.name, "build", "wrong", problem))
                return
            t = measure(prep.build, self.device, **timing_kw)
        except Exception as e:  # a failing build is a row, like a failing provider
            traceback.print_exc(limit=-8, file=sys.stderr)
            self._emit_row(self._row(state, prov.name, "build", "failed", _short(e)))
            return
        self._emit_timed(state, prov.name, "build", t, None, [prep.build_note, f"first call {first[0]:.1f} ms (compile included)"], 1)

    def _loop_ms(self, t, fn) -> float | None:
        """:func:`timing.loop_ms` of an eagerly timed row under ``LOOP_BELOW_MS`` (a graph
        replay has no loop of eager calls to stand for; a long call is its device time)."""
        from jagflash.bench.timing import loop_ms

        if t.timer.startswith(("do_bench_cudagraph", "graph_backward")) or t.p50 >= LOOP_BELOW_MS:
            return None
        return loop_ms(fn, self.device)

    def _emit_timed(self, state, provider, direction, t, err, notes, n_sets, peak=None, loop=None) -> None:
        row = self._row(
            state,
            provider,
            direction,
            "ok",
            "; ".join(notes),
            rel_err=err,
            ms_p20=t.p20,
            ms_p50=t.p50,
            ms_p80=t.p80,
            timer=t.timer,
            runs=t.runs,
            loop_ms=loop,
        )
        row["tflops"] = row["flops"] / (t.p50 * 1e-3) / 1e12 if t.p50 > 0 and row["flops"] else None
        row["peak_mib"] = peak
        if n_sets > 1:
            row["timer"] += f", {n_sets} input sets"
        self._emit_row(row)

    # ---------------------------------------------------------------- loop

    def run(self) -> int:
        torch = self.torch
        plan = self.plan
        from jagflash.bench import env as E

        info = E.versions(self.device.type, probe_fa4=plan.group == "host")
        self.env = {k: info.get(k, "") for k in ("gpu", "torch", "triton", "cudnn", "cuda")}
        meta = {"type": "meta", "group": plan.group, "pid": os.getpid(), **info}
        meta["reference"] = "jagflash.core.reference.attention_reference"
        if plan.measure_ceilings:
            try:
                meta["ceilings"] = E.ceilings(self.device.type)
            except Exception as e:
                meta["ceilings_error"] = _short(e)
        self.emit(meta)
        self._print_header(meta)

        by_workload: dict[str, list[str]] = {}
        for wl, pv in plan.items:
            by_workload.setdefault(wl, []).append(pv)
        remaining = len(plan.items)
        for wl, provs in by_workload.items():
            w = self.W.get(wl, smoke=plan.smoke, smoke_dtype=smoke_dtype(plan.device))
            state = _WorkloadState(w, self.device, plan)
            for name in provs:
                prov = self.P.get(name)
                self.emit({"type": "begin", "workload": wl, "provider": name, "group": plan.group})
                self.progress.working(f"{wl} · {name}")
                try:
                    self._run_item(prov, state, remaining)
                except ContextLost:
                    return CONTEXT_LOST
                finally:
                    remaining -= 1
                    gc.collect()
                    if self.device.type == "cuda":
                        with contextlib.suppress(Exception):
                            torch.cuda.empty_cache()
            state.free()
        self.emit({"type": "end", "group": plan.group})
        return 0

    def _run_item(self, prov, state: _WorkloadState, remaining: int) -> None:
        reason = self._available_reason(prov)
        if reason:
            self._all_dirs(state, prov.name, "unavailable", reason)
            return
        reason = prov.supports(state.w)
        if state.w.blocks is not None and not prov.block_sparse:
            reason = "takes no block mask (block-sparse workloads run on the providers that do)"
        if reason:
            self._all_dirs(state, prov.name, "unsupported", reason)
            return
        if self.plan.deadline is not None and time.time() > self.plan.deadline:
            self._all_dirs(state, prov.name, "skipped", "time budget exhausted")
            return
        from jagflash.bench.providers import _Unavailable

        n_before = self.progress.done
        faulthandler.dump_traceback_later(HANG_DUMP_S, repeat=False, file=sys.stderr)
        try:
            self._measure(prov, state, remaining)
        except _Unavailable as e:
            self._finish_dirs(state, prov.name, n_before, "unavailable", str(e))
        except NotImplementedError as e:
            self._finish_dirs(state, prov.name, n_before, "unsupported", _short(e, 400))
        except Exception as e:  # a provider failing is a row, not a crash
            oom = type(e).__name__ == "OutOfMemoryError"
            traceback.print_exc(limit=-8, file=sys.stderr)  # the frames nearest the error
            self._finish_dirs(
                state, prov.name, n_before, "failed", "out of memory" if oom else _short(e)
            )
            if _context_broken(self.device):
                raise ContextLost(str(e)) from e
        finally:
            faulthandler.cancel_dump_traceback_later()

    def _finish_dirs(self, state, provider, n_before, status, note) -> None:
        """Rows for the directions this item had not reported yet."""
        done = self.progress.done - n_before
        for d in self.plan.directions[done:]:
            self._emit_row(self._row(state, provider, d, status, note))

    def _print_header(self, meta: dict) -> None:
        keys = (
            "gpu",
            "capability",
            "torch",
            "triton",
            "cudnn",
            "cuda",
            "tlx",
            "flash_attn",
            "reference",
        )
        parts = [f"{k}={meta[k]}" for k in keys if meta.get(k)]
        print(
            f"[jagflash.bench {self.plan.group} worker pid {os.getpid()}] " + " ".join(parts),
            flush=True,
        )
        c = meta.get("ceilings")
        if c:
            print(
                f"[jagflash.bench] ceilings: bf16 matmul 8192^3 {c['matmul_bf16_tflops']:.0f} TFLOP/s, "
                f"device copy {c['copy_gbps']:.0f} GB/s",
                flush=True,
            )


def run_plan(plan: Plan) -> int:
    """Run ``plan`` in this process (the worker entry point; also ``--in-process``)."""
    if plan.smoke and plan.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if plan.device == "cpu":
        import torch

        # Tiny CPU problems on a shared 2-core machine: a second OpenMP thread only waits for a
        # core (each op's barrier costs a scheduler slice), one thread is faster and steadier.
        torch.set_num_threads(1)
    writer = _Writer(plan.rows_file)
    try:
        return Worker(plan, writer).run()
    finally:
        writer.close()
