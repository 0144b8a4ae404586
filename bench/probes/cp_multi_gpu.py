"""Probe (several GPUs, NCCL; issue #25): the DDP / FSDP2 step of the jagged example block and
context-parallel attention across GPUs, checked and timed.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --standalone --nproc-per-node 2 bench/probes/cp_multi_gpu.py all --csv $OUT/multi.csv

(the script sets those three variables itself too, before NCCL starts, for itself and any child.)

``train``: a bench workload's first ``--check-seqs`` sequences dealt to the ranks; one
backward of ``JaggedBlock`` under DDP and under FSDP2 (every Linear and the block sharded);
the averaged gradients, gathered on rank 0, against one GPU's on the whole batch and against
the fp64 reference block (tolerance rule, bf16 reference as PyTorch's own error). Then the
step time (forward, backward, SGD) and tokens/s on ``--train-tokens`` tokens a rank, against
one GPU running one rank's batch alone.

``cp``: ``ring_attention`` over NCCL on a balanced layout of the check batch, forward and
backward, unsharded on rank 0 against one GPU's single call and the fp64 reference; then the
time of the ring call (fwd, fwd + bwd) on ``--cp-tokens`` tokens of the workload against the
same ring's compute alone (every block gathered beforehand, no communication): the overlap.
``--long-tokens N``: one causal sequence of N tokens through the ring (the single-GPU call on
rank 0 is tried first and its out-of-memory reported: state N where it does not fit).
"""

from __future__ import annotations

import os

for _var, _val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_var, _val)

import argparse  # noqa: E402
import sys  # noqa: E402

from probe_cp import _measure, write_csv  # noqa: E402  (bench/probes/, this script's folder, is on sys.path)


def _rows_out(rows, me: int, **kw) -> None:
    if me == 0:
        rows.append(kw)
        print(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items()), flush=True)


SMOKE = False


def _lengths(workload: str, seqs: int | None, tokens: int | None) -> tuple[object, list[int]]:
    from jagflash.bench import workloads as W

    w = W.get(workload, smoke=SMOKE)
    lengths = w.sample_lengths()[1].tolist()
    if seqs is not None:
        lengths = lengths[:seqs]
    if tokens is not None:  # repeat / cut the workload's lengths to about this many tokens
        out, total, i = [], 0, 0
        while total < tokens and lengths:
            out.append(min(lengths[i % len(lengths)], tokens - total))
            total += out[-1]
            i += 1
        lengths = out
    return w, lengths


def _offsets(lengths, device):
    import torch

    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32, device=device)


def _share(lengths, rank: int, world: int) -> tuple[int, int]:
    """Sequences [a, b) of rank ``rank``: the batch cut into ``world`` runs of about equal tokens."""
    total, acc, bounds = sum(lengths), 0, [0]
    for i, n in enumerate(lengths):
        acc += n
        if len(bounds) < world and acc >= total * len(bounds) / world:
            bounds.append(i + 1)
    bounds += [len(lengths)] * (world + 1 - len(bounds))
    return bounds[rank], bounds[rank + 1]


def _block(w, device, dtype, attention=None):
    import torch

    from jagflash.variants.jagged.block import JaggedBlock

    torch.manual_seed(0)
    return JaggedBlock(w.heads * w.head_dim, w.heads, w.hkv, causal=w.causal, attention=attention).to(device=device, dtype=dtype)


def run_train(args, rows, rank: int, world: int, device) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from jagflash.core.reference import attention_reference
    from jagflash.core.tolerance import assert_close_all
    from jagflash.variants.jagged import SPEC

    w, lengths = _lengths(args.workload, args.check_seqs, None)
    dtype = getattr(torch, w.dtype)
    dim = w.heads * w.head_dim
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(sum(lengths), dim, generator=gen, device=device, dtype=dtype)
    offs = _offsets(lengths, device)
    a, b = _share(lengths, rank, world)
    lo, hi = int(offs[a]), int(offs[b])
    local = _offsets(lengths[a:b], device)
    total = sum(lengths)

    def loss(model, xs, o, scale):
        return model(xs, o).float().square().sum() * scale

    grads = {}
    for mode in ("ddp", "fsdp2"):
        block = _block(w, device, dtype)
        if mode == "ddp":
            model = DistributedDataParallel(block)
        else:
            mesh = init_device_mesh(device.type, (world,))
            for m in block.modules():
                if isinstance(m, torch.nn.Linear):
                    fully_shard(m, mesh=mesh)
            model = fully_shard(block, mesh=mesh)
        loss(model, x[lo:hi], local, world / total).backward()
        grads[mode] = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).float() for n, p in block.named_parameters()}
    if rank == 0:
        one = _block(w, device, dtype)
        loss(one, x, offs, 1 / total).backward()
        refs = {}
        for rdtype in (torch.float64, dtype):
            ref = _block(w, device, rdtype, attention=lambda q, k, v, qo, ko, *, causal, rdtype=rdtype, **_: attention_reference(q, k, v, qo, ko, causal=causal, compute_dtype=rdtype)[0])
            loss(ref, x.to(rdtype), offs, 1 / total).backward()
            refs[rdtype] = {n: p.grad for n, p in ref.named_parameters()}
        names = sorted(refs[dtype])
        for mode, g in grads.items():
            try:
                assert_close_all(names, [g[n] for n in names], [refs[torch.float64][n] for n in names], [refs[dtype][n] for n in names], SPEC.atol[dtype])
                verdict = "pass"
            except AssertionError as e:
                verdict = f"FAIL {e}"
            diff = max((g[n] - p.grad.float()).abs().max().item() for n, p in one.named_parameters())
            _rows_out(rows, rank, probe="train-check", mode=mode, world=world, tokens=total, max_diff_vs_one_gpu=diff, verdict=verdict)
    dist.barrier()
    # timing: --train-tokens a rank
    w, lengths = _lengths(args.workload, None, args.train_tokens)
    x = torch.randn(sum(lengths), dim, device=device, dtype=dtype)
    offs = _offsets(lengths, device)
    max_len = max(lengths)
    for mode in ("one-gpu", "ddp", "fsdp2"):
        block = _block(w, device, dtype)
        if mode == "ddp":
            model = DistributedDataParallel(block)
        elif mode == "fsdp2":
            mesh = init_device_mesh(device.type, (world,))
            for m in block.modules():
                if isinstance(m, torch.nn.Linear):
                    fully_shard(m, mesh=mesh)
            model = fully_shard(block, mesh=mesh)
        else:
            model = block
        opt = torch.optim.SGD(block.parameters(), lr=1e-4)

        def step(model=model, opt=opt):
            opt.zero_grad(set_to_none=True)
            model(x, offs, max_len).float().square().mean().backward()
            opt.step()

        if mode == "one-gpu" and rank != 0:
            dist.barrier()
            continue
        for _ in range(3):
            step()
        t = _measure(step, device)
        ranks = 1 if mode == "one-gpu" else world
        _rows_out(rows, rank, probe="train-time", mode=mode, world=ranks, tokens_per_rank=sum(lengths),
                  step_ms=t.p50, tokens_per_s=ranks * sum(lengths) / (t.p50 / 1e3))
        if mode == "one-gpu":
            dist.barrier()


def run_cp(args, rows, rank: int, world: int, device) -> None:
    import torch
    import torch.distributed as dist

    from jagflash.core import context_parallel as cp
    from jagflash.core.reference import attention_reference
    from jagflash.core.tolerance import assert_close_all
    from jagflash.variants.jagged import SPEC, jagged_attention

    def batch(lengths, w, seed):
        gen = torch.Generator(device=device).manual_seed(seed)
        t = sum(lengths)
        dtype = getattr(torch, w.dtype)
        return [torch.randn(t, h, w.head_dim, generator=gen, device=device, dtype=dtype) for h in (w.heads, w.hkv, w.hkv, w.heads)]

    # correctness on the check batch
    w, lengths = _lengths(args.workload, args.check_seqs, None)
    q, k, v, dout = batch(lengths, w, 2)
    offs = _offsets(lengths, device)
    layout = cp.balanced_layout(offs, world)
    ql, kl, vl = (cp.shard(t, layout, rank).requires_grad_() for t in (q, k, v))
    out, lse = cp.ring_attention(ql, kl, vl, layout, causal=w.causal, return_lse=True)
    grads = torch.autograd.grad(out, (ql, kl, vl), cp.shard(dout, layout, rank))
    parts = [out.detach(), lse, *grads]
    gathered = [None] * world
    dist.all_gather_object(gathered, [p.cpu() for p in parts])
    if rank == 0:
        got = [cp.unshard([g[j] for g in gathered], layout, dim=1 if j == 1 else 0).to(device) for j in range(5)]
        refs = []
        for rdtype in (torch.float64, q.dtype):
            leaves = [t.to(rdtype).requires_grad_() for t in (q, k, v)]
            ro, rl = attention_reference(*leaves, offs, offs, causal=w.causal, compute_dtype=rdtype)
            refs.append([ro.detach(), rl.detach(), *torch.autograd.grad(ro, leaves, dout.to(rdtype))])
        one = jagged_attention(q, k, v, offs, offs, causal=w.causal)
        try:
            assert_close_all(["out", "lse", "dq", "dk", "dv"], got, *refs, SPEC.atol[q.dtype])
            verdict = "pass"
        except AssertionError as e:
            verdict = f"FAIL {e}"
        _rows_out(rows, rank, probe="cp-check", world=world, tokens=sum(lengths),
                  max_diff_vs_one_gpu=(got[0].float() - one.float()).abs().max().item(), verdict=verdict)
    dist.barrier()
    # timing and overlap on --cp-tokens
    w, lengths = _lengths(args.workload, None, args.cp_tokens)
    q, k, v, dout = batch(lengths, w, 3)
    layout = cp.balanced_layout(_offsets(lengths, device), world)
    ql, kl, vl, dl = (cp.shard(t, layout, rank) for t in (q, k, v, dout))
    del q, k, v, dout
    _time_ring(rows, rank, world, device, layout, ql, kl, vl, dl, w.causal, f"{w.name} x{sum(lengths)}", gather=True)
    if args.long_tokens:
        _long(args, rows, rank, world, device, w)


def _time_ring(rows, rank, world, device, layout, ql, kl, vl, dl, causal, name, gather: bool) -> None:
    import torch
    import torch.distributed as dist

    from jagflash.core import context_parallel as cp

    qg, kg, vg = (t.clone().requires_grad_() for t in (ql, kl, vl))
    fwd = _measure(lambda: cp.ring_attention(ql, kl, vl, layout, causal=causal), device)

    def fb():
        out = cp.ring_attention(qg, kg, vg, layout, causal=causal)
        torch.autograd.grad(out, (qg, kg, vg), dl)

    fwd_bwd = _measure(fb, device)
    row = {"probe": "cp-time", "batch": name, "world": world, "rank": rank, "ring_fwd_ms": fwd.p50, "ring_fwd_bwd_ms": fwd_bwd.p50}
    if gather:  # the same steps' compute with every block already here: no communication
        ks, vs = [], []
        for r in range(world):
            for mine, out in ((kl, ks), (vl, vs)):
                buf = mine if r == rank else mine.new_empty((layout.rows(r), *mine.shape[1:]))
                dist.broadcast(buf, r)
                out.append(buf)
        variant = cp.find_variant()
        steps = cp.ring_calls(layout, layout, rank, causal)
        scale = ql.shape[-1] ** -0.5

        def alone():
            out = torch.zeros(ql.shape, dtype=torch.float32, device=device)
            lse = torch.full((ql.shape[1], ql.shape[0]), float("-inf"), device=device)
            for t, calls in enumerate(steps):
                s = (rank - t) % world
                out, lse = cp.attend_block(variant, ql, ks[s], vs[s], calls, out, lse, scale=scale, backend=None)
            return out, lse

        comp = _measure(alone, device)
        row.update(compute_alone_fwd_ms=comp.p50, overlap_fwd=comp.p50 / fwd.p50)
    gathered = [None] * world
    dist.all_gather_object(gathered, row)
    for r in gathered:
        _rows_out(rows, rank, **r)


def _long(args, rows, rank, world, device, w) -> None:
    import torch
    import torch.distributed as dist

    from jagflash.core import context_parallel as cp
    from jagflash.variants.jagged import jagged_attention

    n = args.long_tokens
    dtype = getattr(torch, w.dtype)
    offs = torch.tensor([0, n], dtype=torch.int32, device=device)
    if rank == 0:  # does one GPU hold the single call, forward and backward?
        try:
            q, k, v = (torch.randn(n, h, w.head_dim, device=device, dtype=dtype, requires_grad=True) for h in (w.heads, w.hkv, w.hkv))
            out = jagged_attention(q, k, v, offs, offs, causal=True)
            out.backward(torch.randn_like(out))
            torch.cuda.synchronize()
            verdict = "fits"
        except torch.OutOfMemoryError as e:
            verdict = f"out of memory: {str(e).splitlines()[0]}"
        _rows_out(rows, rank, probe="long-one-gpu", tokens=n, peak_gib=torch.cuda.max_memory_allocated() / 2**30, verdict=verdict)
        q = k = v = out = None
        torch.cuda.empty_cache()
    dist.barrier()
    torch.cuda.reset_peak_memory_stats()
    layout = cp.balanced_layout(offs, world)
    rows_here = layout.rows(rank)
    ql, dl = (torch.randn(rows_here, w.heads, w.head_dim, device=device, dtype=dtype) for _ in range(2))
    kl, vl = (torch.randn(rows_here, w.hkv, w.head_dim, device=device, dtype=dtype) for _ in range(2))
    _time_ring(rows, rank, world, device, layout, ql, kl, vl, dl, True, f"one sequence x{n}", gather=False)
    _rows_out(rows, rank, probe="long-ring", tokens=n, world=world, peak_gib_rank0=torch.cuda.max_memory_allocated() / 2**30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["train", "cp", "all"])
    parser.add_argument("--workload", default="jagged-lognormal-causal-d128", help="a bench workload (jagflash.bench.workloads)")
    parser.add_argument("--check-seqs", type=int, default=16, help="sequences of the correctness checks")
    parser.add_argument("--train-tokens", type=int, default=65536, help="tokens a rank in the timed training step")
    parser.add_argument("--cp-tokens", type=int, default=262144, help="tokens of the timed ring (whole batch)")
    parser.add_argument("--long-tokens", type=int, default=0, help="one sequence this long through the ring (0: skip)")
    parser.add_argument("--csv", default=None, help="rank 0 writes the rows here")
    parser.add_argument("--smoke", action="store_true", help="the workload's tiny fp32 version")
    parser.add_argument("--cpu", action="store_true", help="gloo on the CPU (with --smoke and TRITON_INTERPRET=1): a dry run")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.cpu:  # a dry run of the script's logic: gloo, the kernels under TRITON_INTERPRET=1
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    global SMOKE
    SMOKE = args.smoke
    rows: list[dict] = []
    try:
        if args.what in ("train", "all"):
            run_train(args, rows, rank, world, device)
        if args.what in ("cp", "all"):
            run_cp(args, rows, rank, world, device)
    finally:
        dist.destroy_process_group()
    if rank == 0 and args.csv:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
