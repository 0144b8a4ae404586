"""Where does a dense causal forward call's time go? (H200 probe, 2026-11-30)

Times, for dense B4 H16 N4096 D128 bf16 causal and the jagged lognormal causal batch:
kernel-only launches on a prebuilt plan (static vs none schedule), the public function with and
without grad-requiring inputs, and the GPU-busy time of one public call (torch.profiler), so
that host overhead and tile order can be told apart."""

import torch
from triton.testing import do_bench

from jagflash.core import tlx_attention
from jagflash.core.jagged import offsets_from_lengths, visible_pairs
from jagflash.core.schedule import make_plan
from jagflash.variants.dense import dense_attention
from jagflash.variants.jagged import jagged_attention
from jagflash.variants.jagged import kernels_portable as pk

H, D = 16, 128
gen = torch.Generator().manual_seed(0)
lognormal = torch.clamp((torch.exp(torch.randn(128, generator=gen)) * 512).round(), 1, 4096).long().tolist()


def gpu_ms(fn, n=5):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in p.key_averages()) / 1e3 / n


def row(name, fn, flops):
    ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
    print(f"  {name:46s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s  gpu-busy {gpu_ms(fn):7.3f} ms", flush=True)


for label, lens in (("dense 4x4096", [4096] * 4), ("lognormal128", lognormal)):
    total, longest = sum(lens), max(lens)
    q, k, v = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    offs = offsets_from_lengths(lens, "cuda")
    lt = torch.tensor(lens)
    for causal in (True, False):
        right = 0 if causal else -1
        flops = 4 * int(visible_pairs(lt, lt, -1, right).sum()) * D * H
        print(f"{label} causal={causal}")
        for sched in ("static", "none"):
            plan = make_plan(offs, offs, total_q=total, total_kv=total, heads_q=H, heads_kv=H, causal=causal,
                             block_m=128, block_n=128, schedule=sched, backward=False)
            for pipe in (False, True):
                row(f"tlx kernel, plan {sched}, v{2 if pipe else 1}",
                    lambda: tlx_attention.forward(q, k, v, offs, offs, longest, left=-1, right=right, scale=D**-0.5, pipeline=pipe, plan=plan), flops)
            pplan = make_plan(offs, offs, total_q=total, total_kv=total, heads_q=H, heads_kv=H, causal=causal,
                              block_m=128, block_n=64, schedule=sched, backward=False)
            row(f"portable kernel, plan {sched}",
                lambda: pk.forward(q, k, v, offs, offs, pplan, left=-1, right=right, scale=D**-0.5, backend="portable"), flops)
        for backend in ("tlx-sm90", "portable"):
            if label.startswith("dense"):
                b = len(lens)
                q4, k4, v4 = (t.view(b, lens[0], H, D) for t in (q, k, v))
                row(f"dense_attention {backend}, no grad",
                    lambda: dense_attention(q4, k4, v4, causal=causal, backend=backend), flops)
                qg, kg, vg = (t.detach().requires_grad_() for t in (q4, k4, v4))
                row(f"dense_attention {backend}, grad inputs",
                    lambda: dense_attention(qg, kg, vg, causal=causal, backend=backend), flops)
            else:
                row(f"jagged_attention {backend}, no grad",
                    lambda: jagged_attention(q, k, v, offs, offs, causal=causal, max_seqlen_q=longest, max_seqlen_kv=longest, backend=backend), flops)


def breakdown(fn, n=3):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    for e in sorted(p.key_averages(), key=lambda e: -e.self_device_time_total)[:6]:
        print(f"    {e.key[:60]:60s} {e.self_device_time_total / 1e3 / n:8.3f} ms")


print("backward breakdown, lognormal128 (portable dQ pass + dK/dV pass; TLX dK/dV alone)")
total, longest = sum(lognormal), max(lognormal)
q, k, v, do = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
offs = offsets_from_lengths(lognormal, "cuda")
lt = torch.tensor(lognormal)
for causal in (False, True):
    right = 0 if causal else -1
    flops = 2.5 * 4 * int(visible_pairs(lt, lt, -1, right).sum()) * D * H
    plan = make_plan(offs, offs, total_q=total, total_kv=total, heads_q=H, heads_kv=H, causal=causal,
                     block_m=128, block_n=64, dq_blocks=(64, 64), dkdv_blocks=(32, 128), schedule="none")
    out, lse = pk.forward(q, k, v, offs, offs, plan, left=-1, right=right, scale=D**-0.5, backend="portable")
    print(f"  causal={causal}: portable backward ({flops / 1e12:.2f} TFLOP)")
    breakdown(lambda: pk.backward(do, q, k, v, out, lse, offs, offs, plan, left=-1, right=right, scale=D**-0.5, backend="portable"))
    delta = (out.float() * do.float()).sum(-1).transpose(0, 1).contiguous()
    try:
        row("tlx dK/dV pass alone (rate at 4/5 of bwd FLOPs)", lambda: tlx_attention.backward_dkdv(do, q, k, v, lse, delta, offs, offs, left=-1, right=right, scale=D**-0.5, plan=plan), flops * 0.8)
    except Exception as e:  # noqa: BLE001
        print(f"  tlx dK/dV failed: {type(e).__name__}: {e}")
