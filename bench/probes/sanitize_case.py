"""A small forward + backward of every TLX path the backends pick (jagged short and long
sequences: tile ring and dynamic walk; causal; GQA; the one-pass and the deterministic two-pass
backward; plans of every schedule: static, dynamic, grouped, none; sliding windows; dense; broadcast-Q;
block-sparse on 128 x 128 masks: per-head lists, causal, one pass and deterministic), and the
decode forward (``jagflash.core.portable.decode``, plain Triton: packed sequences, keys split and
merged) that the TLX backend hands short-query batches, with the TLX backward at its LSE, for
compute-sanitizer's tools (``bench/gpu.sh sanitize`` runs all four):

    python bench/probes/sanitize_case.py                       # warm Triton's cache first
    compute-sanitizer --tool racecheck python bench/probes/sanitize_case.py
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    from jagflash.variants.broadcast_q import broadcast_q_attention
    from jagflash.variants.dense import dense_attention
    from jagflash.variants.jagged import jagged_attention, make_plan

    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(shape, generator=gen).to(torch.bfloat16).cuda().requires_grad_()

    for lens, hq, hkv, dim in (((1, 37, 0, 64, 65, 129), 4, 2, 128), ((300, 700, 5), 4, 4, 64)):
        offs = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32).cuda()
        t = int(offs[-1])
        for causal in (False, True):
            for det in (False, True):
                q, k, v = rand(t, hq, dim), rand(t, hkv, dim), rand(t, hkv, dim)
                out = jagged_attention(q, k, v, offs, offs, causal=causal, deterministic=det)
                torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        # every deal a plan can give the passes (the default above is the policy's pick)
        for schedule, det in (("static", False), ("dynamic", True), ("grouped", False), ("none", True)):
            q, k, v = rand(t, hq, dim), rand(t, hkv, dim), rand(t, hkv, dim)
            plan = make_plan(q, k, offs, offs, causal=True, schedule=schedule, backward_schedule=schedule)
            out = jagged_attention(q, k, v, offs, offs, causal=True, deterministic=det, plan=plan)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    # the decode path: at most 16 queries a sequence (packed, a 900-key sequence split), GQA
    q_lens, k_lens = (1, 3, 0, 16, 2, 1), (40, 0, 900, 70, 1, 0)
    q_offs, k_offs = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32).cuda() for n in (q_lens, k_lens))
    for causal in (False, True):
        q, k, v = rand(sum(q_lens), 8, 128), rand(sum(k_lens), 2, 128), rand(sum(k_lens), 2, 128)
        out = jagged_attention(q, k, v, q_offs, k_offs, causal=causal)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    # sliding windows: the one pass with a bounded left side, the deterministic two passes, GQA
    from jagflash.variants.sliding_window import sliding_window_attention

    offs = torch.tensor([0, 37, 37, 300, 1000], dtype=torch.int32).cuda()
    for window, det in (((64, 0), False), ((200, 17), True)):
        q, k, v = rand(1000, 4, 128), rand(1000, 2, 128), rand(1000, 2, 128)
        out = sliding_window_attention(q, k, v, offs, offs, window=window, deterministic=det)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    q, k, v = rand(2, 200, 4, 128), rand(2, 200, 4, 128), rand(2, 200, 4, 128)
    out = dense_attention(q, k, v, causal=True)
    torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    offs = torch.tensor([0, 100, 100, 350], dtype=torch.int32).cuda()
    q, k, v = rand(70, 4, 128), rand(350, 2, 128), rand(350, 2, 128)
    for det in (False, True):
        out = broadcast_q_attention(q, k, v, offs, deterministic=det)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    # block-sparse: the TLX walk through a block list (q-tiles) and its transpose (kv-tiles)
    from jagflash.variants.block_sparse import BlockMask, block_sparse_attention

    offs = torch.tensor([0, 1, 300, 300, 1000], dtype=torch.int32).cuda()
    grid = (torch.rand(4, 4, 8, 8, generator=gen) < 0.4).cuda()
    mask = BlockMask.from_dense(grid, offs, offs, (128, 128))
    for causal, det in ((False, False), (True, True)):
        q, k, v = rand(1000, 4, 128), rand(1000, 2, 128), rand(1000, 2, 128)
        out = block_sparse_attention(q, k, v, offs, offs, mask, causal=causal, deterministic=det, backend="tlx-sm90")
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    torch.cuda.synchronize()
    print("sanitize_case: done")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    main()
