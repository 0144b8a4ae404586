"""Demo: causal attention over a batch of user histories of lognormal length, forward and
backward, on the best backend here, checked against the reference.

    python -m jagflash.variants.jagged.demo            # full size on a GPU, small on a CPU
    python -m jagflash.variants.jagged.demo --small    # the small batch anywhere

On a CPU the stock-Triton kernels run under Triton's interpreter (this sets TRITON_INTERPRET=1
itself, before any kernel is imported); bf16 cannot be interpreted, so the CPU batch is fp32.
On a GPU it also times torch's own ``varlen_attn`` (FlashAttention 2) on the same inputs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _lognormal_lengths(n: int, median: float, sigma: float, cap: int, seed: int) -> list[int]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    raw = torch.exp(torch.randn(n, generator=gen) * sigma) * median
    return torch.clamp(raw.round(), 1, cap).long().tolist()


def _time_ms(fn, device: str, reps: int) -> float:
    import torch

    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=max(100, reps * 10), return_mode="median"))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    del torch
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the small CPU-sized batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default=None, help="force a backend (portable, interpreter, reference)")
    args = parser.parse_args(argv)

    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")

    from jagflash.core.backend import last_choice
    from jagflash.core.jagged import offsets_from_lengths
    from jagflash.core.mask import visible_pairs
    from jagflash.core.reference import attention_reference
    from jagflash.core.tolerance import assert_close_all
    from jagflash.variants.jagged import SPEC, jagged_attention

    device = "cuda" if on_gpu else "cpu"
    small = args.small or not on_gpu
    if small:
        batch, median, cap, hq, hkv, dim, dtype = 8, 24, 96, 2, 1, 32, torch.float32
    else:
        batch, median, cap, hq, hkv, dim, dtype = 64, 512, 4096, 16, 16, 128, torch.bfloat16
    lengths = _lognormal_lengths(batch, median, 1.0, cap, args.seed)
    gen = torch.Generator(device).manual_seed(args.seed)
    total = sum(lengths)
    q, k, v = (
        torch.randn(total, h, dim, generator=gen, device=device, dtype=dtype).requires_grad_()
        for h in (hq, hkv, hkv)
    )
    dout = torch.randn(total, hq, dim, generator=gen, device=device, dtype=dtype)
    qo = ko = offsets_from_lengths(lengths, device)
    max_len = max(lengths)
    lens = torch.tensor(lengths)
    pairs = int(visible_pairs(lens, lens, -1, 0).sum())
    fwd_flops = 4 * pairs * dim * hq

    def fwd():
        return jagged_attention(q, k, v, qo, ko, causal=True, max_seqlen_q=max_len,
                                max_seqlen_kv=max_len, backend=args.backend)

    out = fwd()
    choice = last_choice("jagged")
    grads = torch.autograd.grad(out, (q, k, v), dout)

    print(f"jagflash demo on {torch.cuda.get_device_name() if on_gpu else 'CPU (Triton interpreter)'}")
    print(choice.explain())
    print(f"batch: {batch} causal histories, lengths {min(lengths)}..{max_len} "
          f"(median {int(statistics.median(lengths))}), {sum(lengths)} tokens; "
          f"q {tuple(q.shape)} k/v {tuple(k.shape)} {str(dtype).removeprefix('torch.')}")

    # Correctness against the fp64 reference (and the rule of PyTorch's own error in dtype).
    ref_in = [x.detach().to(torch.float64).requires_grad_() for x in (q, k, v)]
    low_in = [x.detach().requires_grad_() for x in (q, k, v)]
    checks = []
    for inputs, dt in ((ref_in, torch.float64), (low_in, dtype)):
        o, _ = attention_reference(*inputs, qo, ko, causal=True, compute_dtype=dt)
        checks.append([o.detach(), *torch.autograd.grad(o, inputs, dout.to(dt))])
    names = ["out", "dq", "dk", "dv"]
    errors = {n: float((g.detach().double() - r).abs().max()) for n, g, r in zip(names, [out, *grads], checks[0])}
    assert_close_all(names, [out, *grads], checks[0], checks[1], SPEC.atol[dtype])
    print("max |error| vs fp64 reference: " + ", ".join(f"{n} {e:.2e}" for n, e in errors.items())
          + "  (within the tolerance rule)")

    reps = 3 if not on_gpu else 20
    f_ms = _time_ms(fwd, device, reps)
    o = fwd()
    b_ms = _time_ms(lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True), device, reps)
    rows = [("jagflash " + choice.name, f_ms, b_ms)]
    if on_gpu:
        from torch.nn.attention.varlen import varlen_attn

        def peer():
            return varlen_attn(q, k, v, qo, ko, max_len, max_len, window_size=(-1, 0))

        po = peer()
        perr = float((po.double() - checks[0][0]).abs().max())
        pf = _time_ms(peer, device, reps)
        pb = _time_ms(lambda: torch.autograd.grad(po, (q, k, v), dout, retain_graph=True), device, reps)
        rows.append((f"torch varlen_attn (max err {perr:.1e})", pf, pb))
    print(f"\n{'provider':44s} {'fwd ms':>9s} {'bwd ms':>9s} {'fwd TFLOP/s':>12s} {'bwd TFLOP/s':>12s}")
    for name, fm, bm in rows:
        print(f"{name:44s} {fm:9.3f} {bm:9.3f} {fwd_flops / fm / 1e9:12.4g} {2.5 * fwd_flops / bm / 1e9:12.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
