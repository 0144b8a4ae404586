"""Probe (H200): does a TMA reduce-add work at all with this toolchain (triton 3.8.0 +
triton-utlx 3.8.0.post16)? The one-pass TLX backward's staged dQ reduce-add stopped with an
illegal instruction (bench/NOTES.md, 2026-12-01); this isolates it in one-warpgroup kernels:

  A  stock Triton, host TensorDescriptor, ``desc.store``          (TMA store, no reduce)
  B  stock Triton, ``desc.atomic_add``                            (TMA reduce-add)
  C  TLX: local_store + fence + async_descriptor_store             (TMA store)
  D  TLX: the same with ``store_reduce="add"``                    (TMA reduce-add)
  E  TLX: D inside async_tasks (a producer + one consumer warpgroup, as the backward)

each for fp32 and bf16 tiles of [128, 32] and [64, 64], each case in its own process (an illegal
instruction kills the CUDA context). Prints ok / WRONG / the error per case.

Run on the GPU: ``PROBE=bench/probes/probe_tma_reduce.py bash bench/gpu.sh probe``."""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

CASES = [c + dt + shp for c in "ABCDE" for dt in ("f32", "bf16") for shp in ("", "-64x64")]


@triton.jit
def _tile(X, R: tl.constexpr, C: tl.constexpr):
    rows = tl.arange(0, R)
    cols = tl.arange(0, C)
    return tl.load(X + rows[:, None] * C + cols[None, :])


@triton.jit
def _stock(desc, X, R: tl.constexpr, C: tl.constexpr, REDUCE: tl.constexpr):
    x = _tile(X, R, C)
    if REDUCE:
        desc.atomic_add([0, 0], x)
    else:
        desc.store([0, 0], x)


@triton.jit
def _tlx_store(desc, buf, X, R: tl.constexpr, C: tl.constexpr, REDUCE: tl.constexpr):
    """Stage the tile in ``buf``, then one TMA store (or reduce-add) and wait for it."""
    tlx.local_store(buf, _tile(X, R, C))
    tlx.fence("async_shared")
    if REDUCE:
        tlx.async_descriptor_store(desc, buf, [0, 0], store_reduce="add")
    else:
        tlx.async_descriptor_store(desc, buf, [0, 0])
    tlx.async_descriptor_store_wait(0)


@triton.jit
def _tlx(desc, X, R: tl.constexpr, C: tl.constexpr, REDUCE: tl.constexpr, WS: tl.constexpr):
    buf = tlx.local_alloc((R, C), tlx.dtype_of(desc), 1)
    if WS:
        with tlx.async_tasks():
            with tlx.async_task("default", registers=24):
                pass
            with tlx.async_task(num_warps=4, registers=240, replicate=1):
                _tlx_store(desc, buf[0], X, R, C, REDUCE)
    else:
        _tlx_store(desc, buf[0], X, R, C, REDUCE)


def run(case: str) -> str:
    from triton.tools.tensor_descriptor import TensorDescriptor

    kind = case[0]
    dtype = torch.float32 if "f32" in case else torch.bfloat16
    r, c = (64, 64) if case.endswith("64x64") else (128, 32)
    x = torch.randn(r, c, device="cuda").to(dtype)
    out = torch.ones(2 * r, 2 * c, device="cuda", dtype=dtype)
    desc = TensorDescriptor(out, shape=list(out.shape), strides=[out.stride(0), 1], block_shape=[r, c])
    reduce = kind in "BDE"
    if kind in "AB":
        _stock[(1,)](desc, x, r, c, reduce, num_warps=4)
    else:
        _tlx[(1,)](desc, x, r, c, reduce, kind == "E", num_warps=4)
    torch.cuda.synchronize()
    want = torch.ones_like(out)
    want[:r, :c] = (x.float() + 1).to(dtype) if reduce else x
    return "ok" if torch.equal(out, want) else f"WRONG (max diff {(out.float() - want.float()).abs().max().item():.3g})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("case", nargs="?", choices=CASES, help="run this one, here")
    args = parser.parse_args(argv)
    if args.case:
        print(run(args.case))
        return
    from concurrent.futures import ThreadPoolExecutor

    def one(case: str) -> str:
        try:
            p = subprocess.run([sys.executable, __file__, case], capture_output=True, text=True, timeout=150)
        except subprocess.TimeoutExpired:
            return "timeout"
        lines = (p.stdout + p.stderr).strip().splitlines()
        err = [ln for ln in lines if "Error" in ln or "error" in ln]
        return lines[-1] if p.returncode == 0 and lines else (err[-1] if err else f"exit {p.returncode}")

    with ThreadPoolExecutor(8) as pool:
        for case, msg in zip(CASES, pool.map(one, CASES)):
            print(f"{case:12s} {msg[:160]}", flush=True)


if __name__ == "__main__":
    main()
