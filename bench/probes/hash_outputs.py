"""Hash the outputs and gradients of a fixed set of problems through the public variant calls, so
that two trees (before and after a refactor) can be compared bit for bit on the GPU:

    PYTHONPATH=<tree's src dirs> python bench/probes/hash_outputs.py --out hashes-new.json
    python bench/probes/hash_outputs.py --compare hashes-old.json hashes-new.json

Problems: jagged, dense and broadcast-Q; causal and not; GQA; D 64 and 128; fp16 and bf16;
deterministic and not. Inputs are drawn from fixed seeds on the CPU, so both trees see the same
values. The one-pass backward's dQ is summed in a varying order (its TMA reduce-adds), so where
``deterministic`` is off dQ is recorded with its max |difference| against a second run of the same
tree instead of a hash; everything else must be bitwise equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


def _problems():
    """(variant, dtype, head dim, causal, Hq, Hkv, deterministic): every axis covered, not their
    full product (each distinct kernel configuration compiles once per tree, ~10 s)."""
    bf16, fp16 = torch.bfloat16, torch.float16
    for dim in (64, 128):
        for causal in (False, True):
            for det in (False, True):
                yield "jagged", bf16, dim, causal, 8, 2 if dim == 128 else 8, det
    yield "jagged", fp16, 128, True, 8, 8, False
    yield "jagged", fp16, 64, False, 8, 2, True
    for causal in (False, True):
        for det in (False, True):
            yield "dense", bf16, 128, causal, 8, 8, det
    yield "dense", fp16, 64, True, 8, 2, False
    for dim, det in ((128, False), (128, True), (64, False)):
        yield "broadcast_q", bf16, dim, False, 8, 2, det


def _inputs(variant, dtype, dim, hq, hkv, seed):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.clamp(torch.exp(torch.randn(24, generator=gen) + 5.0), 1, 1500).long()
    lens[3] = 0
    if variant == "dense":
        b, n = 3, 700
        shape_q, shape_k = (b, n, hq, dim), (b, n, hkv, dim)
        offs = None
    elif variant == "broadcast_q":
        shape_q, shape_k = (130, hq, dim), (int(lens.sum()), hkv, dim)
        offs = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32)
    else:
        shape_q = shape_k = (int(lens.sum()), hq, dim)
        shape_k = (shape_k[0], hkv, dim)
        offs = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32)
    q, k, v = (torch.randn(s, generator=gen).to(dtype) for s in (shape_q, shape_k, shape_k))
    return q, k, v, offs, gen


def run_one(variant, dtype, dim, causal, hq, hkv, det, seed):
    q, k, v, offs, gen = _inputs(variant, dtype, dim, hq, hkv, seed)
    q, k, v = (x.cuda().requires_grad_() for x in (q, k, v))
    if variant == "jagged":
        from jagflash.variants.jagged import jagged_attention

        o = offs.cuda()
        out, lse = jagged_attention(q, k, v, o, o, causal=causal, return_lse=True, deterministic=det)
    elif variant == "dense":
        from jagflash.variants.dense import dense_attention

        out, lse = dense_attention(q, k, v, causal=causal, return_lse=True, deterministic=det)
    else:
        from jagflash.variants.broadcast_q import broadcast_q_attention

        out, lse = broadcast_q_attention(q, k, v, offs.cuda(), return_lse=True, deterministic=det)
    dout = torch.randn(out.shape, generator=gen).to(dtype).cuda()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out")
    parser.add_argument("--compare", nargs=2)
    args = parser.parse_args(argv)
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        same = differ = 0
        for key in sorted(a):
            for name, h in a[key].items():
                if name.startswith("dq") and "dq_vary" in a[key]:
                    continue  # a varying summation order: compared by size below
                g = b.get(key, {}).get(name)
                ok = g == h
                same += ok
                differ += not ok
                if not ok:
                    print(f"DIFFER {key} {name}: {h} vs {g}")
        for key in sorted(a):
            if "dq_vary" in a[key]:
                print(f"dq (varying order) {key}: old run-to-run {a[key]['dq_vary']:.3g}, new {b.get(key, {}).get('dq_vary', float('nan')):.3g}, old-new {abs(a[key].get('dq_ref', 0) - b.get(key, {}).get('dq_ref', 0)):.3g} (sum)")
        print(f"{same} equal, {differ} differ")
        return 1 if differ else 0
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {}
    for i, (variant, dtype, dim, causal, hq, hkv, det) in enumerate(_problems()):
        key = f"{variant} {str(dtype)[6:]} d{dim} {'causal' if causal else 'full'} {hq}:{hkv} {'det' if det else 'fast'}"
        got = run_one(variant, dtype, dim, causal, hq, hkv, det, seed=i)
        entry = {name: _digest(t) for name, t in got.items()}
        if not det:
            again = run_one(variant, dtype, dim, causal, hq, hkv, det, seed=i)
            entry["dq_vary"] = float((again["dq"].float() - got["dq"].float()).abs().max())
            entry["dq_ref"] = float(got["dq"].double().sum())
            if entry["dq"] != _digest(again["dq"]):
                del entry["dq"]  # the order varies within one tree: not comparable bit for bit
        result[key] = entry
        print(key, entry, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
