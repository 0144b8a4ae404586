"""A/B of the forward's tile order on the H200 (2026-11-30): schedules static (cost-sorted),
grouped (sequences cost-sorted, their tiles together) and none (batch order) for the TLX
forward (its default consumer version per mask) and the portable forward, kernels alone on
prebuilt plans; bf16, H16, D128."""

import torch
from triton.testing import do_bench

from jagflash.core import tlx_attention
from jagflash.core.jagged import offsets_from_lengths, visible_pairs
from jagflash.core.schedule import make_plan
from jagflash.variants.jagged import kernels_portable as pk

H, D = 16, 128
gen = torch.Generator().manual_seed(0)
lognormal = torch.clamp((torch.exp(torch.randn(128, generator=gen)) * 512).round(), 1, 4096).long().tolist()
heavy = [4096, 4096] + torch.randint(32, 768, (120,), generator=gen).tolist()
for label, lens in (("lognormal128", lognormal), ("heavytail", heavy), ("dense 4x4096", [4096] * 4)):
    total, longest = sum(lens), max(lens)
    q, k, v = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    offs = offsets_from_lengths(lens, "cuda")
    lt = torch.tensor(lens)
    for causal in (True, False):
        right = 0 if causal else -1
        flops = 4 * int(visible_pairs(lt, lt, -1, right).sum()) * D * H
        cells = []
        for sched in ("static", "grouped", "none"):
            plan = make_plan(offs, offs, total_q=total, total_kv=total, heads_q=H, heads_kv=H, causal=causal,
                             block_m=128, block_n=128, schedule=sched, backward=False)
            pplan = make_plan(offs, offs, total_q=total, total_kv=total, heads_q=H, heads_kv=H, causal=causal,
                              block_m=128, block_n=64, schedule=sched, backward=False)
            ref = tlx_attention.forward(q, k, v, offs, offs, longest, left=-1, right=right, scale=D**-0.5, plan=plan)[0]
            if sched == "static":
                base = ref
            diff = (ref.float() - base.float()).abs().max().item()
            t = do_bench(lambda: tlx_attention.forward(q, k, v, offs, offs, longest, left=-1, right=right, scale=D**-0.5, plan=plan), warmup=25, rep=300, return_mode="median")
            p = do_bench(lambda: pk.forward(q, k, v, offs, offs, pplan, left=-1, right=right, scale=D**-0.5, backend="portable"), warmup=25, rep=300, return_mode="median")
            cells.append(f"{sched}: tlx {t:.3f} ms {flops / t / 1e9:5.0f} | portable {p:.3f} ms {flops / p / 1e9:5.0f} (diff {diff:.1e})")
        print(f"{label} causal={causal}")
        for c in cells:
            print("   ", c, flush=True)
