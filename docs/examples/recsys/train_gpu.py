"""Train the recommender of recsys.py on a GPU with each attention, side by side.

    python docs/examples/recsys/train_gpu.py                    # all three, defaults below
    python docs/examples/recsys/train_gpu.py --plot results/recsys.csv   # PNG + table from a CSV

Every attention trains the same model (same initial weights, same batches, same negatives) for
``--steps`` steps under bf16 autocast; the first ``--warmup`` steps (compilation, autotuning,
allocator growth) are recorded but left out of the timings. Written to ``--out``:

  recsys.csv     one row per attention and step: loss, step time, real and laid-out tokens
  summary.md     the table (median step time, real tokens/s over the run and at the median step, peak
                 memory, final loss) and the run
  curves.png     loss against step, and tokens/s per attention

``jagflash`` is ``jagged_attention`` (one plan per batch shared by the layers), ``varlen`` is
torch's ``varlen_attn`` (FlashAttention 2), ``sdpa`` is the whole model on the batch padded to
its longest history with ``scaled_dot_product_attention``. An attention that fails (not
installed, out of memory) gets a row saying so; the others still run.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FIELDS = ["attention", "step", "loss", "step_ms", "real_tokens", "layout_tokens"]


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attention", nargs="+", default=["jagflash", "varlen", "sdpa"])
    p.add_argument("--users", type=int, default=8192, help="histories in the data set")
    p.add_argument("--items", type=int, default=100_000)
    p.add_argument("--median-len", type=float, default=256.0)
    p.add_argument("--sigma", type=float, default=1.2, help="log-normal sigma of the lengths")
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--batch", type=int, default=64, help="histories per step")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--negatives", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1 (no varlen, no timings worth reading)")
    p.add_argument("--plot", type=Path, default=None, help="only render summary.md and curves.png from this CSV")
    return p.parse_args(argv)


def train(attention: str, args, data, order) -> tuple[list[dict], dict]:
    import torch
    from recsys import Recommender, pad

    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(args.seed)
    model = Recommender(args.items, dim=args.dim, heads=args.heads, layers=args.layers, max_len=args.max_len, attention=attention).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rows = []
    for step, users in enumerate(order):
        batch = data.batch(users)
        layout = pad(batch)[0].items.numel() if attention == "sdpa" else batch.items.numel()
        sync()
        start = time.perf_counter()
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=cuda):
            loss = model.loss(batch, args.negatives, gen=gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        ms = (time.perf_counter() - start) * 1e3
        rows.append({"attention": attention, "step": step, "loss": float(loss.detach()), "step_ms": ms,
                     "real_tokens": batch.items.numel(), "layout_tokens": layout})
    info = {"peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}
    if attention == "jagflash":
        from jagflash.core.backend import last_choice

        info["backend"] = last_choice("jagged").explain()
    return rows, info


def summarize(rows: list[dict], warmup: int, infos: dict) -> list[dict]:
    table = []
    for attention in dict.fromkeys(r["attention"] for r in rows):
        rs = [r for r in rows if r["attention"] == attention]
        timed = [r for r in rs if int(r["step"]) >= warmup]
        if not timed:
            continue
        step_ms = statistics.median(float(r["step_ms"]) for r in timed)
        tokens = sum(int(r["real_tokens"]) for r in timed) / sum(float(r["step_ms"]) / 1e3 for r in timed)
        # the steady rate: a step's mean real tokens over the median step (the whole-run rate
        # above also pays every step that compiled a kernel on first use)
        steady = statistics.mean(int(r["real_tokens"]) for r in timed) / (step_ms / 1e3)
        layout = sum(int(r["layout_tokens"]) for r in timed) / sum(int(r["real_tokens"]) for r in timed)
        tail = [float(r["loss"]) for r in rs[-10:]]
        table.append({"attention": attention, "step_ms": step_ms, "tokens_per_s": tokens, "steady_tokens_per_s": steady, "layout_x": layout,
                      "peak_gib": infos.get(attention, {}).get("peak_gib"), "final_loss": sum(tail) / len(tail)})
    return table


def markdown(table: list[dict], failures: dict, header: str) -> str:
    lines = [header, "", "| attention | median step (ms) | real tokens/s, whole run | real tokens/s at the median step | laid-out / real tokens | peak memory (GiB) | loss, last 10 steps |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for t in table:
        peak = "" if t["peak_gib"] is None else f"{t['peak_gib']:.2f}"
        lines.append(
            f"| {t['attention']} | {t['step_ms']:.1f} | {t['tokens_per_s']:,.0f} | {t['steady_tokens_per_s']:,.0f} | "
            f"{t['layout_x']:.2f} | {peak} | {t['final_loss']:.3f} |"
        )
    for attention, why in failures.items():
        lines.append(f"| {attention} | failed: {why} | | | | | |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for attention in dict.fromkeys(r["attention"] for r in rows):
        rs = [r for r in rows if r["attention"] == attention]
        a.plot([int(r["step"]) for r in rs], [float(r["loss"]) for r in rs], label=attention, lw=1)
    a.set_xlabel("step")
    a.set_ylabel("sampled-softmax loss")
    a.set_title("training loss (same weights, batches, negatives)")
    a.legend()
    x = range(len(table))
    b.bar([i - 0.2 for i in x], [t["tokens_per_s"] / 1e3 for t in table], width=0.4, label="whole run")
    b.bar([i + 0.2 for i in x], [t["steady_tokens_per_s"] / 1e3 for t in table], width=0.4, label="at the median step")
    b.set_xticks(list(x), [t["attention"] for t in table])
    b.set_ylabel("real tokens / s (thousands)")
    b.set_title("training throughput")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _read(csv_path: Path) -> list[dict]:
    with open(csv_path, newline="") as fh:
        return list(csv.DictReader(fh))


def main(argv=None) -> int:
    args = _args(argv)
    if args.plot is not None:
        rows = _read(args.plot)
        table = summarize(rows, args.warmup, {})
        plot(rows, table, args.plot.with_name("curves.png"))
        print(markdown(table, {}, f"(from {args.plot.name}; peak memory is in the run's summary.md)"))
        return 0

    import torch
    from recsys import make_histories

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train_gpu.py needs a CUDA GPU (--device cpu is a smoke run only)")
    started = time.perf_counter()
    data = make_histories(args.users, args.items, median_len=args.median_len, sigma=args.sigma, max_len=args.max_len, seed=args.seed)
    lens = data.lengths.double()
    data = data.to(args.device)
    gen = torch.Generator().manual_seed(args.seed)
    order = [torch.randperm(args.users, generator=gen)[: args.batch].to(args.device) for _ in range(args.steps)]
    args.out.mkdir(parents=True, exist_ok=True)
    rows, infos, failures = [], {}, {}
    for attention in args.attention:
        t0 = time.perf_counter()
        try:
            r, info = train(attention, args, data, order)
        except Exception as e:  # a missing peer or an OOM is reported in the table, and printed
            traceback.print_exc()
            failures[attention] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            if args.device == "cuda":
                torch.cuda.empty_cache()
            continue
        rows += r
        infos[attention] = info
        print(f"{attention}: {len(r)} steps in {time.perf_counter() - t0:.1f} s, final loss {r[-1]['loss']:.3f}", flush=True)
    with open(args.out / "recsys.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    table = summarize(rows, args.warmup, infos)
    import jagflash.core

    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (smoke run)"
    lines = [
        f"Device: {device}; torch {torch.__version__}; jagflash-core from {Path(jagflash.core.__file__).parent}",
        f"Data: {args.users} histories, {args.items} items, lengths log-normal (median {args.median_len:g}, sigma {args.sigma:g}) "
        f"clipped to [2, {args.max_len}]: mean {lens.mean():.0f}, p99 {lens.quantile(0.99):.0f}, max {lens.max():.0f}.",
        f"Model: dim {args.dim}, {args.heads} heads (head dim {args.dim // args.heads}), {args.layers} layers, {args.negatives} sampled "
        f"negatives, AdamW lr {args.lr:g}, {'bf16 autocast' if args.device == 'cuda' else 'fp32'}; {args.batch} histories a step, {args.steps} steps, timings "
        f"over steps {args.warmup}..{args.steps - 1} (median step; tokens/s = real tokens / total time, and a step's mean real tokens / the median step).",
        f"Command: python docs/examples/recsys/train_gpu.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
        f"Wall time: {time.perf_counter() - started:.0f} s.",
    ]
    if "jagflash" in infos:
        lines.insert(3, f"jagflash backend: {infos['jagflash']['backend'].splitlines()[0]}")
    text = markdown(table, failures, "\n".join(lines))
    (args.out / "summary.md").write_text(text)
    try:
        plot(rows, table, args.out / "curves.png")
    except ImportError as e:
        print(f"curves.png not written ({e}); render it later with --plot {args.out / 'recsys.csv'}")
    print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
