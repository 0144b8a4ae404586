"""``python -m jagflash.bench``: plan the (workload, provider) items, run them in worker
processes, merge their rows into one CSV and render the report.

    python -m jagflash.bench --smoke --out /tmp/bench-smoke          # CPU, interpreter, < 1 min
    python -m jagflash.bench --out results/h200 --budget-s 400       # the GPU run
    python -m jagflash.bench --workloads 'jagged-*' --providers 'jagflash-*,varlen-fa2'
    python -m jagflash.bench --list
    python -m jagflash.bench --report-only results/h200               # CSV -> markdown + PNG

Two worker groups run one after the other, so they never share the GPU: ``main`` (jagflash and
every peer that runs on the Triton in front of the path, TLX included) and ``host`` (providers
with ``needs_host_triton``: FlexAttention through torch.compile and FlashAttention-4), whose
PYTHONPATH drops the TLX bundle (see :mod:`jagflash.bench.env`). A worker that dies (a kernel
fault kills the CUDA context) is restarted for the items it had left; one that hangs is killed at
its deadline. Rows reach ``rows.jsonl`` as they are measured, so a killed run still leaves them
for ``--report-only``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from jagflash.bench import report
from jagflash.bench import workloads as W
from jagflash.bench.runner import smoke_dtype

__all__ = ["main"]

DIRECTIONS = ("fwd", "bwd")
#: Row directions in table order: a block-sparse workload's mask build comes after them.
ROW_DIRECTIONS = (*DIRECTIONS, "build")
MAX_ATTEMPTS = 5
PLUGINS_VAR = "JAGFLASH_BENCH_PLUGINS"
GRACE_S = 10.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jagflash.bench",
        description="Side-by-side attention benchmark: jagflash vs. its peers, checked then timed.",
    )
    p.add_argument("--workloads", help="comma-separated globs (default: all; --smoke: a small set)")
    p.add_argument(
        "--providers", help="comma-separated globs (default: every provider for the device)"
    )
    p.add_argument("--directions", default="fwd,bwd", help="fwd, bwd or fwd,bwd (default)")
    p.add_argument("--out", default="jagflash-bench-out", help="output directory")
    p.add_argument("--smoke", action="store_true", help="tiny shapes; Triton interpreter on a CPU")
    p.add_argument(
        "--reps", type=int, default=None, help="minimum timed runs (default 20; smoke 2)"
    )
    p.add_argument("--rep-ms", type=float, default=100.0, help="do_bench repetition time (ms)")
    p.add_argument("--warmup-ms", type=float, default=25.0, help="do_bench warm-up time (ms)")
    p.add_argument(
        "--budget-s", type=float, default=None, help="wall-clock budget for the whole run"
    )
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default=None, help="default: cuda if present"
    )
    p.add_argument(
        "--cuda-graphs", action="store_true",
        help="time problems whose one run is under --graph-below-ms by CUDA graph replay",
    )
    p.add_argument(
        "--graph-below-ms", type=float, default=0.1,
        help="with --cuda-graphs, the run time under which a problem is replayed in a graph "
        "(default 0.1; e.g. 1.0 also takes the host-bound broadcast-Q Lq256 x 64 rows)",
    )
    p.add_argument("--in-process", action="store_true", help="run the main group in this process")
    p.add_argument("--no-ceilings", action="store_true", help="skip the matmul / copy ceilings")
    p.add_argument("--list", action="store_true", help="list workloads and providers, then exit")
    p.add_argument(
        "--ceilings",
        action="store_true",
        help="print versions and the GPU's two ceilings, then exit",
    )
    p.add_argument("--report-only", metavar="DIR", help="rebuild CSV / markdown / PNG from DIR")
    p.add_argument("--worker", metavar="PLAN", help=argparse.SUPPRESS)
    return p


def _has_gpu_device_node() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


def _pick_device(args) -> str:
    if args.device:
        return args.device
    if not _has_gpu_device_node():
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _directions(text: str) -> list[str]:
    asked = {d.strip() for d in text.split(",") if d.strip()}
    bad = asked - set(DIRECTIONS)
    if bad or not asked:
        raise SystemExit(f"--directions: expected fwd and/or bwd, got {text!r}")
    return [d for d in DIRECTIONS if d in asked]


def _list() -> int:
    from jagflash.bench import providers as P

    print("workloads:")
    for w in W.WORKLOADS.values():
        print(f"  {w.name:<36} {w.describe()}")
    print("providers:")
    for p in P.PROVIDERS.values():
        flags = []
        if p.needs_host_triton:
            flags.append("host triton")
        if p.default_workloads:
            flags.append("default on " + ", ".join(p.default_workloads))
        extra = f" [{'; '.join(flags)}]" if flags else ""
        print(f"  {p.name:<28} {'/'.join(sorted(p.kinds)):<26} {p.description}{extra}")
    return 0


def _print_ceilings(device: str) -> int:
    from jagflash.bench import env as E

    info = E.versions(device)
    print("[jagflash.bench] " + " ".join(f"{k}={v}" for k, v in info.items() if v), flush=True)
    if device != "cuda":
        print("[jagflash.bench] no CUDA GPU: no ceilings", flush=True)
        return 0
    c = E.ceilings(device)
    print(
        f"[jagflash.bench] ceilings: bf16 matmul 8192^3 {c['matmul_bf16_tflops']:.0f} TFLOP/s, "
        f"device copy {c['copy_gbps']:.0f} GB/s (read + write)",
        flush=True,
    )
    return 0


def _read_records(path: Path) -> list[dict]:
    out = []
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a killed worker
            continue
    return out


def _bench_src() -> str:
    return str(Path(__file__).resolve().parents[2])


def _spawn(plan_path: Path, group: str, timeout: float) -> tuple[int | None, str]:
    from jagflash.bench.env import host_triton_env

    if group == "host":
        env = host_triton_env(extra_paths=[_bench_src()])
    else:
        env = dict(os.environ)
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if _bench_src() not in parts:
            env["PYTHONPATH"] = os.pathsep.join([*parts, _bench_src()])
    cmd = [sys.executable, "-m", "jagflash.bench", "--worker", str(plan_path)]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=max(timeout, 1.0)), ""
    except subprocess.TimeoutExpired:
        why = f"timed out (worker killed after {timeout:.0f} s)"
    except KeyboardInterrupt:
        why = "interrupted"
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    if why == "interrupted":
        raise KeyboardInterrupt
    return None, why


class _Run:
    def __init__(self, args, device: str):
        from jagflash.bench import env as E
        from jagflash.bench import providers as P

        self.args = args
        self.device = device
        self.smoke = bool(args.smoke)
        self.out = Path(args.out)
        self.rows_path = self.out / "rows.jsonl"
        self.dirs = _directions(args.directions)
        self.t0 = time.time()
        reserve = 5.0 if self.smoke else 25.0
        self.deadline = None if args.budget_s is None else self.t0 + args.budget_s - reserve
        self.run_info = {"git_commit": E.git_commit(), "date": E.now_utc()}
        self.workloads = W.select(args.workloads, smoke=self.smoke, smoke_dtype=smoke_dtype(device))
        self.providers, explicit = P.select(args.providers, device)
        # A block-sparse workload's speed-ups are against its baseline (the same batch without
        # the mask): run that for the jagflash providers even where --workloads left it out.
        chosen = {w.name for w in self.workloads}
        baselines = {w.baseline for w in self.workloads if w.baseline and w.baseline not in chosen}
        self.workloads += [W.get(n, smoke=self.smoke, smoke_dtype=smoke_dtype(device)) for n in sorted(baselines)]
        self.items: dict[str, list[tuple[str, str]]] = {"main": [], "host": []}
        self.pre_rows: list[dict] = []
        for w in W.run_order(self.workloads):
            for p in self.providers:
                if w.kind not in p.kinds:
                    continue
                if w.name in baselines and not p.name.startswith("jagflash-"):
                    continue
                if (
                    not explicit
                    and not self.smoke
                    and device == "cuda"
                    and not p.default_for(w.name)
                ):
                    note = f"not in {p.name}'s default workloads (name it in --providers to run it)"
                    self.pre_rows += [
                        self._bare_row(w, p.name, d, "skipped", note) for d in self.dirs
                    ]
                    continue
                self.items["host" if p.needs_host_triton else "main"].append((w.name, p.name))
        # Only now that the selection is valid: a typo must not leave an empty output dir.
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows_path.write_text("")
        self.total_rows = len(self.pre_rows) + len(self.dirs) * sum(
            len(v) for v in self.items.values()
        )
        if "fwd" in self.dirs:  # a block-sparse item of a mask-building provider: a build row
            names = {w.name: w for w in self.workloads}
            self.total_rows += sum(
                1 for v in self.items.values() for wl, pv in v if names[wl].blocks is not None and P.get(pv).mask_build
            )

    def _bare_row(self, w, provider: str, direction: str, status: str, note: str) -> dict:
        return {
            "type": "row",
            "workload": w.name,
            "kind": w.kind,
            "provider": provider,
            "direction": direction,
            "status": status,
            "note": note,
            "heads_q": w.heads,
            "heads_kv": w.hkv,
            "head_dim": w.head_dim,
            "dtype": w.dtype,
            "causal": w.causal,
            "smoke": w.is_smoke,
            "device": self.device,
            **self.run_info,
        }

    def _append(self, records: list[dict]) -> None:
        with self.rows_path.open("a") as fh:
            for r in records:
                fh.write(json.dumps(r, default=str) + "\n")

    def _rows_done(self) -> int:
        return sum(1 for r in _read_records(self.rows_path) if r.get("type") == "row")

    def _plan(self, group: str, items, deadline: float | None, ceilings: bool) -> Path:
        from jagflash.bench.runner import Plan

        reps = self.args.reps if self.args.reps is not None else (2 if self.smoke else 20)
        plan = Plan(
            items=list(items),
            directions=self.dirs,
            device=self.device,
            smoke=self.smoke,
            rows_file=str(self.rows_path.resolve()),
            group=group,
            deadline=deadline,
            warmup_ms=self.args.warmup_ms,
            rep_ms=self.args.rep_ms,
            min_reps=reps,
            cuda_graphs=self.args.cuda_graphs,
            graph_below_ms=self.args.graph_below_ms,
            measure_ceilings=ceilings,
            progress_done=self._rows_done(),
            progress_total=self.total_rows,
            run_info=self.run_info,
        )
        path = self.out / f"plan-{group}.json"
        plan.dump(path)
        return path

    def _group_deadline(self, group: str) -> float | None:
        if self.deadline is None:
            return None
        left = self.deadline - time.time()
        if group == "host" or not self.items["host"]:
            return self.deadline
        # Main first; a host item costs about three main ones (torch.compile, FA4's JIT).
        wm = len(self.items["main"]) + 10
        wh = 3 * len(self.items["host"]) + 10
        return time.time() + left * wm / (wm + wh)

    def run_group(self, group: str) -> None:
        items = list(self.items[group])
        key = lambda r: (r.get("workload"), r.get("provider"))
        first = True
        deadline = self._group_deadline(group)  # once: a restart does not get a fresh share
        for _attempt in range(MAX_ATTEMPTS):
            if not items:
                return
            if deadline is not None and time.time() >= deadline:
                break
            before = {key(r) for r in _read_records(self.rows_path) if r.get("type") == "row"}
            ceilings = (
                group == "main" and first and self.device == "cuda" and not self.args.no_ceilings
            )
            plan_path = self._plan(group, items, deadline, ceilings)
            first = False
            print(
                f"[jagflash.bench] {group} group: {len(items)} items"
                + (f", deadline in {deadline - time.time():.0f} s" if deadline else ""),
                flush=True,
            )
            if group == "main" and self.args.in_process:
                from jagflash.bench.runner import Plan, run_plan

                rc, why = run_plan(Plan.load(plan_path)), ""
            else:
                # The worker stops starting items at its deadline; this is how long the item
                # in flight may overrun before the worker is killed.
                grace = GRACE_S
                timeout = (deadline - time.time() + grace) if deadline else 24 * 3600.0
                rc, why = _spawn(plan_path, group, timeout)
            records = _read_records(self.rows_path)
            got: dict[tuple, set[str]] = {}
            for r in records:
                if r.get("type") == "row":
                    got.setdefault(key(r), set()).add(r["direction"])
            if rc != 0:
                began = [
                    key(r) for r in records if r.get("type") == "begin" and r.get("group") == group
                ]
                stuck = began[-1] if began else None
                if (
                    stuck is not None
                    and stuck in {tuple(i) for i in items}
                    and not set(self.dirs) <= got.get(stuck, set())
                ):
                    w = W.get(stuck[0], smoke=self.smoke, smoke_dtype=smoke_dtype(self.device))
                    note = why or (
                        f"worker exited with status {rc}" if rc is not None else "worker died"
                    )
                    missing = [d for d in self.dirs if d not in got.get(stuck, set())]
                    self._append([self._bare_row(w, stuck[1], d, "failed", note) for d in missing])
                    got.setdefault(stuck, set()).update(missing)
                print(
                    f"[jagflash.bench] {group} worker ended: "
                    + (why or f"status {rc}")
                    + "; restarting for what is left",
                    flush=True,
                )
            items = [i for i in items if not set(self.dirs) <= got.get(tuple(i), set())]
            progressed = {
                key(r) for r in _read_records(self.rows_path) if r.get("type") == "row"
            } - before
            if rc == 0 or not progressed:
                break
        if items:
            note = (
                "time budget exhausted"
                if deadline and time.time() >= deadline
                else "not run: its worker kept failing"
            )
            rows = []
            for wl, pv in items:
                w = W.get(wl, smoke=self.smoke, smoke_dtype=smoke_dtype(self.device))
                rows += [self._bare_row(w, pv, d, "skipped", note) for d in self.dirs]
            self._append(rows)

    def go(self) -> int:
        self._append(self.pre_rows)
        n_items = sum(len(v) for v in self.items.values())
        print(
            f"[jagflash.bench] {len(self.workloads)} workloads x {len(self.providers)} providers: "
            f"{n_items} items, directions {','.join(self.dirs)}, device {self.device}"
            + (", smoke" if self.smoke else "")
            + (f", budget {self.args.budget_s:.0f} s" if self.args.budget_s else ""),
            flush=True,
        )
        interrupted = False
        try:
            for group in ("main", "host"):
                self.run_group(group)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the worker is gone; report what ran
            interrupted = True
            print("[jagflash.bench] interrupted: writing the report of what ran", flush=True)
        rc = finish(
            self.out,
            command=" ".join(["python -m jagflash.bench", *map(shlex.quote, sys.argv[1:])]),
            extra={
                "budget_s": self.args.budget_s,
                "directions": self.dirs,
                "elapsed_s": round(time.time() - self.t0, 1),
                "interrupted": interrupted,
                **self.run_info,
            },
        )
        return 130 if interrupted else rc


def _sort_key(r: dict):
    from jagflash.bench import providers as P

    wl = list(W.WORKLOADS)
    pv = list(P.PROVIDERS)
    return (
        wl.index(r["workload"]) if r["workload"] in wl else len(wl),
        pv.index(r["provider"]) if r["provider"] in pv else len(pv),
        ROW_DIRECTIONS.index(r["direction"]) if r["direction"] in ROW_DIRECTIONS else 9,
    )


def finish(out: Path, command: str = "", extra: dict | None = None) -> int:
    """rows.jsonl -> results.csv + meta.json -> results.md, PNGs, summary.txt; print summary."""
    out = Path(out)
    records = _read_records(out / "rows.jsonl")
    metas = {r.get("group"): r for r in records if r.get("type") == "meta"}
    main_meta = metas.get("main") or next(iter(metas.values()), {})
    host_meta = metas.get("host", {})
    meta_path = out / "meta.json"
    old = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    meta = {**old, **(extra or {})}
    if command:
        meta["command"] = command
    for k in (
        "gpu",
        "capability",
        "torch",
        "triton",
        "cudnn",
        "cuda",
        "tlx",
        "ceilings",
        "reference",
    ):
        if main_meta.get(k) not in (None, ""):
            meta[k] = main_meta[k]
    if host_meta:
        meta["host_triton"] = host_meta.get("triton", "")
        if host_meta.get("flash_attn"):
            meta["flash_attn"] = host_meta["flash_attn"]
        for k in ("gpu", "torch", "cudnn", "cuda"):
            meta.setdefault(k, host_meta.get(k, ""))
    meta["workers"] = {g: {k: v for k, v in m.items() if k != "type"} for g, m in metas.items()}
    meta_path.write_text(json.dumps(meta, indent=1, default=str) + "\n")

    rows = [r for r in records if r.get("type") == "row"]
    for r in rows:
        for k in ("gpu", "torch", "triton", "cudnn", "cuda"):
            if not r.get(k):
                r[k] = meta.get(k, "")
    rows.sort(key=_sort_key)
    csv_path = out / "results.csv"
    if rows or not csv_path.is_file():
        report.write_csv(rows, csv_path)
    written = report.render(csv_path, out, meta)
    print(
        "\n=== jagflash bench: " + ", ".join(str(p) for p in [csv_path, *written.values()]),
        flush=True,
    )
    print(written["summary"].read_text(), flush=True)
    return 0


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _load_plugins() -> None:
    """Import every module named in ``$JAGFLASH_BENCH_PLUGINS`` (comma-separated): a module may
    add to ``workloads.WORKLOADS`` and ``providers.PROVIDERS`` without editing this package.
    Workers inherit the variable, so they see the same additions."""
    import importlib

    for name in filter(None, (m.strip() for m in os.environ.get(PLUGINS_VAR, "").split(","))):
        importlib.import_module(name)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _load_plugins()
    if args.worker:
        from jagflash.bench.runner import Plan, run_plan

        return run_plan(Plan.load(args.worker))
    if args.list:
        return _list()
    if args.ceilings:
        return _print_ceilings(_pick_device(args))
    if args.report_only:
        out = Path(args.report_only)
        if (out / "rows.jsonl").is_file() and (out / "rows.jsonl").stat().st_size:
            return finish(out)
        csv_path = out / "results.csv"
        if not csv_path.is_file():
            print(
                f"--report-only: neither {out / 'rows.jsonl'} nor {csv_path} exists",
                file=sys.stderr,
            )
            return 2
        written = report.render(csv_path, out)
        print(written["summary"].read_text())
        return 0
    device = _pick_device(args)
    if device == "cpu" and not args.smoke:
        print(
            "no CUDA GPU here: the full workloads need one (use --smoke on a CPU)", file=sys.stderr
        )
        return 2
    if device == "cpu":
        # Before anything imports jagflash's kernels, in this process and in every worker.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    # A SIGTERM (e.g. from `timeout`) must not orphan the worker, which runs in its own session:
    # turn it into KeyboardInterrupt, which kills the worker's process group and reports.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return _Run(args, device).go()
    except ValueError as e:  # a --workloads / --providers pattern that matches nothing
        print(f"jagflash.bench: {e}", file=sys.stderr)
        return 2
