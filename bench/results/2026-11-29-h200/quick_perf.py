import sys, time, math, torch, triton
from triton.testing import do_bench
from jagflash.core.jagged import visible_pairs, offsets_from_lengths
from jagflash.variants.jagged import jagged_attention
from jagflash.variants.jagged import kernels_tlx_sm90 as tlxk
from jagflash.variants.jagged import kernels_portable as pk
from torch.nn.attention.varlen import varlen_attn
torch.manual_seed(0)
dev = "cuda"
def lognormal(n, median, sigma, cap, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.clamp((torch.exp(torch.randn(n, generator=g) * sigma) * median).round(), 1, cap).long().tolist()
work = {
  "lognormal128": lognormal(128, 512, 1.0, 4096, 0),
  "dense4x4096": [4096] * 4,
  "tiny2048": torch.randint(1, 64, (2048,), generator=torch.Generator().manual_seed(1)).tolist(),
}
H, D = 16, 128
print(f"{'workload':14s} {'causal':6s} {'provider':10s} {'ms':>8s} {'TFLOP/s':>8s} {'maxdiff':>9s}")
for wname, lens in work.items():
    T = sum(lens); maxl = max(lens)
    q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
    off = offsets_from_lengths(lens, dev)
    lt = torch.tensor(lens)
    for causal in (False, True):
        right = 0 if causal else -1
        flops = 4 * int(visible_pairs(lt, lt, -1, right).sum()) * D * H
        ref = varlen_attn(q, k, v, off, off, maxl, maxl, window_size=(-1, 0) if causal else (-1, -1))
        provs = {
          "varlen": lambda: varlen_attn(q, k, v, off, off, maxl, maxl, window_size=(-1, 0) if causal else (-1, -1)),
          "portable": lambda: pk.forward(q, k, v, off, off, maxl, left=-1, right=right, scale=D**-0.5, backend="portable")[0],
          "tlx": lambda: tlxk.forward(q, k, v, off, off, maxl, left=-1, right=right, scale=D**-0.5)[0],
        }
        for pname, fn in provs.items():
            try:
                o = fn(); torch.cuda.synchronize()
                diff = (o.float() - ref.float()).abs().max().item()
                ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
                print(f"{wname:14s} {str(causal):6s} {pname:10s} {ms:8.3f} {flops/ms/1e9:8.1f} {diff:9.2e}", flush=True)
            except Exception as e:
                print(f"{wname:14s} {str(causal):6s} {pname:10s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
