"""Probe (one GPU): what context parallelism's math costs over one call, and the training
tokens/s of the DDP example block.

``merge``: a bench workload's batch (default ``jagged-lognormal-causal-d128``) sharded over a
fake world of N ranks (``jagflash.core.context_parallel``: balanced or contiguous layout); every
rank's ring steps run one after another in this process (``attend_block`` /
``attend_block_backward``: the variant's calls and the LSE merges, no communication), against
one ``jagged_attention`` call over the whole batch, forward and forward + backward. Also the
merges alone (``merge_partials`` as often as the ring calls it) and the fake world's result on
the first ``--check-seqs`` sequences against the fp64 reference (tolerance rule).

``ddp``: ``JaggedBlock`` (width heads x head dim) in a one-rank DDP (NCCL) training step
(forward, backward, SGD step) on the workload's batch, eager and ``torch.compile``-d:
tokens/s.

    python bench/probes/probe_cp.py merge --worlds 2,4,8
    python bench/probes/probe_cp.py ddp
    python bench/probes/probe_cp.py all --csv $OUT/cp.csv

On the H200: ``PROBE=bench/probes/probe_cp.py bash bench/gpu.sh probe`` (or run it directly).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys


def _batch(workload: str, device, tokens_cap: int | None, smoke: bool = False):
    import torch

    from jagflash.bench import workloads as W

    w = W.get(workload, smoke=smoke)
    lengths = w.sample_lengths()[1].tolist()
    if tokens_cap:
        keep, total = [], 0
        for n in lengths:
            if total + n > tokens_cap:
                break
            keep.append(n)
            total += n
        lengths = keep
    dtype = getattr(torch, w.dtype)
    offs = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    t = int(offs[-1])
    q = torch.randn(t, w.heads, w.head_dim, generator=gen, device=device, dtype=dtype)
    k = torch.randn(t, w.hkv, w.head_dim, generator=gen, device=device, dtype=dtype)
    v = torch.randn(t, w.hkv, w.head_dim, generator=gen, device=device, dtype=dtype)
    return w, lengths, offs, q, k, v


def _measure(fn, device):
    """p50-bearing Timing of ``fn`` (jagflash.bench.timing); 3 runs on a CPU dry run."""
    from jagflash.bench.timing import measure

    return measure(fn, device, min_reps=3 if device.type == "cpu" else 20)


class _FakeWorld:
    """Every rank of a ``world``-rank ring over one batch, run in this process."""

    def __init__(self, layout, q, k, v, causal: bool, variant) -> None:
        from jagflash.core import context_parallel as cp

        self.cp, self.layout, self.causal, self.variant = cp, layout, causal, variant
        self.scale = q.shape[-1] ** -0.5
        self.q = [cp.shard(q, layout, r) for r in range(layout.world)]
        self.k = [cp.shard(k, layout, r) for r in range(layout.world)]
        self.v = [cp.shard(v, layout, r) for r in range(layout.world)]
        self.steps = [cp.ring_calls(layout, layout, r, causal) for r in range(layout.world)]
        self.calls = sum(len(s) for steps in self.steps for s in steps)

    def forward(self):
        import torch

        outs = []
        for r, steps in enumerate(self.steps):
            q = self.q[r]
            out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)
            for t, calls in enumerate(steps):
                s = (r - t) % self.layout.world
                out, lse = self.cp.attend_block(self.variant, q, self.k[s], self.v[s], calls, out, lse, scale=self.scale, backend=None)
            outs.append((out.to(q.dtype), lse))
        return outs

    def forward_backward(self, douts):
        import torch

        outs = self.forward()
        for r, steps in enumerate(self.steps):
            dq = torch.zeros(self.q[r].shape, dtype=torch.float32, device=self.q[r].device)
            for t, calls in enumerate(steps):
                s = (r - t) % self.layout.world
                self.cp.attend_block_backward(
                    self.variant, douts[r], self.q[r], self.k[s], self.v[s], *outs[r], calls, dq,
                    scale=self.scale, backend=None,
                )
        return outs


def _row(rows, **kw):
    rows.append(kw)
    print(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items()), flush=True)


def write_csv(path: str, rows: list[dict]) -> None:
    """The rows, one a line, under the union of their keys."""
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows(rows)


def run_merge(args, rows) -> None:
    import torch

    from jagflash.core import context_parallel as cp
    from jagflash.core.reference import attention_reference
    from jagflash.core.softmax import merge_partials
    from jagflash.core.tolerance import assert_close_all
    from jagflash.variants.jagged import SPEC, jagged_attention

    device = torch.device(args.device)
    w, lengths, offs, q, k, v = _batch(args.workload, device, args.tokens, args.smoke)
    variant = cp.find_variant("jagged")
    tokens = int(offs[-1])
    dout = torch.randn_like(q)
    one_fwd = _measure(lambda: jagged_attention(q, k, v, offs, offs, causal=w.causal), device)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def one_fb():
        out = jagged_attention(qg, kg, vg, offs, offs, causal=w.causal)
        torch.autograd.grad(out, (qg, kg, vg), dout)

    one_fb_t = _measure(one_fb, device)
    _row(rows, probe="merge", workload=w.name, layout="one-call", world=1, tokens=tokens, calls=1,
         fwd_ms=one_fwd.p50, fwd_bwd_ms=one_fb_t.p50, fwd_overhead=1.0, fwd_bwd_overhead=1.0)
    for world in [int(x) for x in args.worlds.split(",")]:
        for kind in args.layouts.split(","):
            layout = (cp.balanced_layout if kind == "balanced" else cp.contiguous_layout)(offs, world)
            fake = _FakeWorld(layout, q, k, v, w.causal, variant)
            douts = [cp.shard(dout, layout, r) for r in range(world)]
            fwd = _measure(fake.forward, device)
            fb = _measure(lambda fake=fake, douts=douts: fake.forward_backward(douts), device)
            rows_per_rank = -(-tokens // world)
            o = torch.zeros(rows_per_rank, w.heads, w.head_dim, device=device)
            lse = torch.zeros(w.heads, rows_per_rank, device=device)
            n_merge = max(1, fake.calls // world)  # merges a rank makes: one a call
            merges = _measure(lambda o=o, lse=lse, n=n_merge: [merge_partials(o, lse, o, lse) for _ in range(n)], device)
            _row(rows, probe="merge", workload=w.name, layout=kind, world=world, tokens=tokens, calls=fake.calls,
                 fwd_ms=fwd.p50, fwd_bwd_ms=fb.p50, fwd_overhead=fwd.p50 / one_fwd.p50,
                 fwd_bwd_overhead=fb.p50 / one_fb_t.p50, merge_ms_per_rank=merges.p50)
    # correctness: the fake world on the first sequences against the fp64 reference
    n = min(args.check_seqs, len(lengths))
    t = int(offs[n])
    small = (q[:t], k[:t], v[:t])
    offs_s = offs[: n + 1]
    for world in [int(x) for x in args.worlds.split(",")]:
        layout = cp.balanced_layout(offs_s, world)
        fake = _FakeWorld(layout, *small, w.causal, variant)
        outs = fake.forward()
        got = [cp.unshard([o for o, _ in outs], layout), cp.unshard([lse for _, lse in outs], layout, dim=1)]
        ref = attention_reference(*small, offs_s, offs_s, causal=w.causal, compute_dtype=torch.float64)
        low = attention_reference(*small, offs_s, offs_s, causal=w.causal, compute_dtype=q.dtype)
        try:
            assert_close_all(["out", "lse"], got, list(ref), list(low), SPEC.atol[q.dtype])
            verdict = "pass"
        except AssertionError as e:
            verdict = f"FAIL {e}"
        err = (got[0].double() - ref[0]).abs().max().item()
        _row(rows, probe="merge-check", workload=w.name, layout="balanced", world=world, tokens=t, max_err=err, verdict=verdict)


def run_ddp(args, rows) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from jagflash.variants.jagged.block import JaggedBlock

    device = torch.device(args.device)
    w, lengths, offs, _, _, _ = _batch(args.workload, device, args.tokens, args.smoke)
    tokens, dim = int(offs[-1]), w.heads * w.head_dim
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    dtype = getattr(torch, w.dtype)
    x = torch.randn(tokens, dim, device=device, dtype=dtype)
    max_len = max(lengths)
    for compiled in (False, True):
        torch.manual_seed(0)
        block = JaggedBlock(dim, w.heads, w.hkv, causal=w.causal, device=device, dtype=dtype)
        model = DistributedDataParallel(block)
        if compiled:
            model = torch.compile(model)
        opt = torch.optim.SGD(block.parameters(), lr=1e-4)

        def step(model=model, opt=opt):
            opt.zero_grad(set_to_none=True)
            model(x, offs, max_len).float().square().mean().backward()
            opt.step()

        for _ in range(3):  # compile, caches
            step()
        t = _measure(step, device)
        _row(rows, probe="ddp", workload=w.name, compiled=compiled, tokens=tokens, dim=dim,
             step_ms=t.p50, tokens_per_s=tokens / (t.p50 / 1e3))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["merge", "ddp", "all"])
    parser.add_argument("--workload", default="jagged-lognormal-causal-d128", help="a bench workload (jagflash.bench.workloads)")
    parser.add_argument("--tokens", type=int, default=None, help="keep the workload's first sequences up to this many tokens")
    parser.add_argument("--worlds", default="2,4,8", help="fake world sizes")
    parser.add_argument("--layouts", default="balanced,contiguous")
    parser.add_argument("--check-seqs", type=int, default=16, help="sequences of the fp64 correctness check")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true", help="the workload's tiny fp32 version (CPU: TRITON_INTERPRET=1, --device cpu)")
    parser.add_argument("--csv", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    if args.what in ("merge", "all"):
        run_merge(args, rows)
    if args.what in ("ddp", "all"):
        run_ddp(args, rows)
    if args.csv:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
