"""Probe (CPU, no GPU needed): compile the portable kernels of a jagged or block-sparse call for
sm_90a and print each launch's registers, spills and shared memory, and a hash of its PTX.

    TRITON_INTERPRET=0 python bench/probes/portable_ptx.py [--sparse] [--out DIR]

Runs the call's host side (checks, plan, launch arguments) on CPU tensors with every launch
replaced by ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` with the arguments the launch
would bind; ``ptxas -arch=sm_90a -v`` gives registers and spills. Two trees' PTX hashes for the
same call (``--out``) compare their kernels: the same hash is the same GPU code.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import tempfile

import torch


def _compile(kernel, args, kwargs):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, options)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def _ptxas(ptx: str) -> str:
    import triton

    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        res = subprocess.run([exe, "-arch=sm_90a", "-v", path, "-o", os.path.join(tmp, "k.cubin")], capture_output=True, text=True, check=False)
    return " ".join(line.split("ptxas info    : ")[-1] for line in (res.stdout + res.stderr).splitlines() if "Used" in line or "spill" in line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sparse", action="store_true", help="a block-sparse call (else the jagged variant's)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--out", default=None, help="write each launch's PTX here")
    a = ap.parse_args()

    import jagflash.core.portable.persistent as persistent
    from jagflash.core.plan.model import PASSES
    from jagflash.core.tile_scheduler import deal_flags, tile_counter

    reports = []

    def compile_launch(kernel, plan, pass_, tensors, scalars, **kw):
        dynamic, zigzag = deal_flags(plan.info, pass_)
        head = (*tensors, plan.section(pass_), plan.meta[PASSES.index(pass_) :], tile_counter(plan, pass_), *scalars)
        compiled = _compile(kernel, (*head, 4), {"DYNAMIC": dynamic, "ZIGZAG": zigzag, **kw})
        ptx = compiled.asm["ptx"]
        digest = hashlib.sha256(ptx.encode()).hexdigest()[:16]
        name = f"{pass_}-{kw['PROGRAM'].__name__ if 'PROGRAM' in kw else 'fwd'}"
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, name + ".ptx"), "w") as f:
                f.write(ptx)
        reports.append(f"{name:24s} ptx {digest} shared {compiled.metadata.shared:6d} | {_ptxas(ptx)}")

    persistent.launch = compile_launch
    d, h = a.head_dim, 4
    lens = [300, 0, 129]
    qo = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(qo[-1]), h, d, dtype=torch.bfloat16)
    k = torch.randn(int(qo[-1]), 2, d, dtype=torch.bfloat16)
    blocks = None
    if a.sparse:
        from jagflash.core.block_mask import local_global

        blocks = local_global(qo, qo, before=1, block_size=(a.block, a.block))
        plan_blocks = {p: (a.block, a.block) for p in ("fwd", "dq", "dkdv")}
    else:
        from jagflash.core.tuning import plan_blocks as pb

        plan_blocks = pb("portable", d)
    from jagflash.core.plan.build import make_plan

    plan = make_plan(
        qo, qo, total_q=q.shape[0], total_kv=k.shape[0], heads_q=h, heads_kv=2, causal=True,
        block_m=plan_blocks["fwd"][0], block_n=plan_blocks["fwd"][1], dq_blocks=plan_blocks["dq"],
        dkdv_blocks=plan_blocks["dkdv"], workers=4, schedule="static",
    )
    kw = {"left": -1, "right": 0, "scale": d**-0.5, "backend": "portable"}
    if a.sparse:  # a tree without block masks has no blocks= (the probe compares trees)
        kw["blocks"] = blocks
    fwd = persistent.sparse_forward if a.sparse else persistent.jagged_forward
    bwd = persistent.sparse_backward if a.sparse else persistent.jagged_backward
    out, lse = fwd(q, k, k, qo, qo, plan, **kw)
    bwd(q, q, k, k, out, lse, qo, qo, plan, **kw)
    print("\n".join(reports))


if __name__ == "__main__":
    main()
