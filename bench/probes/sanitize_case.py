"""A small forward + backward of every TLX path the backends pick (jagged short and long
sequences: tile ring and dynamic walk; causal; GQA; the one-pass and the deterministic two-pass
backward; plans of every schedule: static, dynamic, grouped, none; sliding windows; dense; broadcast-Q;
block-sparse on 128 x 128 masks: per-head lists, causal, one pass and deterministic), and the
decode forward (``jagflash.core.portable.decode``, plain Triton: packed sequences, keys split and
merged) that the TLX backend hands short-query batches, with the TLX backward at its LSE, for
compute-sanitizer's tools (``bench/gpu.sh sanitize`` runs all four):

    python bench/probes/sanitize_case.py                       # warm Triton's cache first
    python bench/probes/sanitize_case.py --part 0/8            # ... or an eighth of it (parallel)
    compute-sanitizer --tool racecheck python bench/probes/sanitize_case.py
"""

from __future__ import annotations

import argparse

import torch


def _cases():
    """The calls, one closure each (``--part`` runs every N-th of them)."""
    from jagflash.variants.broadcast_q import broadcast_q_attention
    from jagflash.variants.dense import dense_attention
    from jagflash.variants.jagged import jagged_attention, make_plan

    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(shape, generator=gen).to(torch.bfloat16).cuda().requires_grad_()

    def offsets(lens):
        return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32).cuda()

    def grad(out, *leaves):
        torch.autograd.grad(out, leaves, torch.ones_like(out))

    cases = []
    for lens, hq, hkv, dim in (((1, 37, 0, 64, 65, 129), 4, 2, 128), ((300, 700, 5), 4, 4, 64)):
        t = sum(lens)
        for causal in (False, True):
            for det in (False, True):
                def jagged(lens=lens, t=t, hq=hq, hkv=hkv, dim=dim, causal=causal, det=det):
                    offs, (q, k, v) = offsets(lens), (rand(t, hq, dim), rand(t, hkv, dim), rand(t, hkv, dim))
                    grad(jagged_attention(q, k, v, offs, offs, causal=causal, deterministic=det), q, k, v)
                cases.append(jagged)
        # every deal a plan can give the passes (the default above is the policy's pick)
        for schedule, det in (("static", False), ("dynamic", True), ("grouped", False), ("none", True)):
            def planned(lens=lens, t=t, hq=hq, hkv=hkv, dim=dim, schedule=schedule, det=det):
                offs, (q, k, v) = offsets(lens), (rand(t, hq, dim), rand(t, hkv, dim), rand(t, hkv, dim))
                plan = make_plan(q, k, offs, offs, causal=True, schedule=schedule, backward_schedule=schedule)
                grad(jagged_attention(q, k, v, offs, offs, causal=True, deterministic=det, plan=plan), q, k, v)
            cases.append(planned)
    # the decode path: at most 16 queries a sequence (packed, a 900-key sequence split), GQA
    for causal in (False, True):
        def decode(causal=causal):
            q_lens, k_lens = (1, 3, 0, 16, 2, 1), (40, 0, 900, 70, 1, 0)
            q, k, v = rand(sum(q_lens), 8, 128), rand(sum(k_lens), 2, 128), rand(sum(k_lens), 2, 128)
            grad(jagged_attention(q, k, v, offsets(q_lens), offsets(k_lens), causal=causal), q, k, v)
        cases.append(decode)
    # sliding windows: the one pass with a bounded left side, the deterministic two passes, GQA
    for window, det in (((64, 0), False), ((200, 17), True)):
        def windowed(window=window, det=det):
            from jagflash.variants.sliding_window import sliding_window_attention

            offs = offsets((37, 0, 263, 700))
            q, k, v = rand(1000, 4, 128), rand(1000, 2, 128), rand(1000, 2, 128)
            grad(sliding_window_attention(q, k, v, offs, offs, window=window, deterministic=det), q, k, v)
        cases.append(windowed)

    def dense():
        q, k, v = rand(2, 200, 4, 128), rand(2, 200, 4, 128), rand(2, 200, 4, 128)
        grad(dense_attention(q, k, v, causal=True), q, k, v)
    cases.append(dense)
    for det in (False, True):
        def broadcast(det=det):
            q, k, v = rand(70, 4, 128), rand(350, 2, 128), rand(350, 2, 128)
            grad(broadcast_q_attention(q, k, v, offsets((100, 0, 250)), deterministic=det), q, k, v)
        cases.append(broadcast)
    # block-sparse: the TLX walk through a block list (q-tiles) and its transpose (kv-tiles)
    for causal, det in ((False, False), (True, True)):
        def sparse(causal=causal, det=det):
            from jagflash.variants.block_sparse import BlockMask, block_sparse_attention

            offs = offsets((1, 299, 0, 700))
            grid = (torch.rand(4, 4, 8, 8, generator=torch.Generator().manual_seed(1)) < 0.4).cuda()
            mask = BlockMask.from_dense(grid, offs, offs, (128, 128))
            q, k, v = rand(1000, 4, 128), rand(1000, 2, 128), rand(1000, 2, 128)
            out = block_sparse_attention(q, k, v, offs, offs, mask, causal=causal, deterministic=det, backend="tlx-sm90")
            grad(out, q, k, v)
        cases.append(sparse)
    return cases


def main(part: str) -> None:
    index, count = (int(x) for x in part.split("/"))
    cases = _cases()
    for case in cases[index::count]:
        case()
    torch.cuda.synchronize()
    print(f"sanitize_case: done ({len(cases[index::count])} of {len(cases)} cases, part {part})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", default="0/1", help="I/N: every N-th case from the I-th (parallel warm-ups)")
    main(parser.parse_args().part)
