"""Compile every TLX kernel configuration for sm_90a on a machine without a GPU, and report.

    python -m jagflash.core.compile_check            # all installed variants
    python -m jagflash.core.compile_check --max-spill-bytes 256 -k d128

Each variant with a ``kernels_tlx_sm90`` module lists its launch configurations in
``compile_configs()`` as ``(name, kernel, signature, constexprs, options)``, optionally with a
sixth element: the spilled bytes that configuration is known to need (printed in the table, so
a known spill stays visible; a configuration that spills more fails). Each is compiled
with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)``; the PTX is assembled again with the
wheel's ``ptxas -arch=sm_90a -v`` for registers and spills. The table shows registers, spilled
bytes, shared memory, and whether wgmma, setmaxnreg and TMA (cp.async.bulk.tensor) made it into
the PTX. Exit status 1 when a configuration fails to compile, spills (unless allowed), or needs
more shared memory than an sm_90 block can have.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

#: Largest shared memory one block can take on sm_90 (227 KiB).
SM90_MAX_SHARED = 232448


@dataclass
class Report:
    name: str
    registers: int = -1
    spill_bytes: int = -1
    shared: int = -1
    wgmma: bool = False
    setmaxnreg: bool = False
    tma: bool = False
    error: str = ""
    known_spill: int = 0

    def problems(self, max_spill_bytes: int) -> list[str]:
        if self.error:
            return [f"{self.name}: {self.error}"]
        out = []
        allowed = max(max_spill_bytes, self.known_spill)
        if self.spill_bytes > allowed:
            out.append(f"{self.name}: {self.spill_bytes} bytes spilled (allowed: {allowed})")
        if self.shared > SM90_MAX_SHARED:
            out.append(f"{self.name}: {self.shared} bytes of shared memory > {SM90_MAX_SHARED}")
        for feat in ("wgmma", "setmaxnreg", "tma"):
            if not getattr(self, feat):
                out.append(f"{self.name}: no {feat} in the PTX")
        return out


def _ptxas() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def compile_one(name, kernel, signature, constexprs, options, known_spill: int = 0) -> Report:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rep = Report(name, known_spill=known_spill)
    try:
        fn = getattr(kernel, "fn", kernel)
        jit = kernel if hasattr(kernel, "fn") else None
        src = ASTSource(jit or fn, signature, constexprs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    except Exception as e:  # a compile error is the report, not a crash of the whole table
        chain = [e]
        while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
            chain.append(chain[-1].__cause__ or chain[-1].__context__)
        where = [str(x).strip() for x in chain if str(x).strip()]
        rep.error = "compile failed:\n" + "\n---\n".join(where[-2:])
        return rep
    ptx = compiled.asm["ptx"]
    rep.shared = int(compiled.metadata.shared)
    rep.wgmma = "wgmma.mma_async" in ptx
    rep.setmaxnreg = "setmaxnreg" in ptx
    rep.tma = "cp.async.bulk.tensor" in ptx
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        res = subprocess.run(
            [_ptxas(), "-arch=sm_90a", "-v", path, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True, text=True, check=False,
        )
    log = res.stdout + res.stderr
    if res.returncode != 0:
        rep.error = "ptxas failed: " + log.strip().splitlines()[-1]
        return rep
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    rep.registers = max(map(int, regs)) if regs else -1
    rep.spill_bytes = sum(map(int, spills)) if spills else 0
    return rep


def variant_configs() -> list[tuple]:
    """Every TLX configuration of every installed variant."""
    from jagflash.core.registry import variants

    out = []
    for name in sorted(variants()):
        try:
            mod = importlib.import_module(f"jagflash.variants.{name}.kernels_tlx_sm90")
        except ModuleNotFoundError as e:
            if e.name == f"jagflash.variants.{name}.kernels_tlx_sm90":
                continue
            raise
        out.extend(mod.compile_configs())
    # Variants that launch the same core kernel list the same configurations: compile each once.
    seen, unique = set(), []
    for cfg in out:
        key = (id(cfg[1]), tuple(sorted(cfg[2].items())), tuple(sorted(cfg[3].items())))
        if key not in seen:
            seen.add(key)
            unique.append(cfg)
    return unique


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--max-spill-bytes", type=int, default=0,
        help="spilled bytes a configuration may have before it fails (default 0)",
    )
    parser.add_argument("-k", default="", help="only configurations whose name contains this")
    args = parser.parse_args(argv)
    configs = [c for c in variant_configs() if args.k in c[0]]
    if not configs:
        print("compile_check: no TLX kernel configurations found", file=sys.stderr)
        return 1
    reports = []
    print(f"{'configuration':40s} {'regs':>5s} {'spill B':>8s} {'shared B':>9s}  wgmma setmaxnreg tma")
    for cfg in configs:
        r = compile_one(*cfg)
        reports.append(r)
        if r.error:
            print(f"{r.name:40s} {r.error}")
        else:
            known = f"  (known spill: {r.known_spill} B)" if r.known_spill else ""
            print(f"{r.name:40s} {r.registers:5d} {r.spill_bytes:8d} {r.shared:9d}  "
                  f"{'yes' if r.wgmma else 'NO':5s} {'yes' if r.setmaxnreg else 'NO':10s} {'yes' if r.tma else 'NO'}{known}")
        sys.stdout.flush()
    problems = [p for r in reports for p in r.problems(args.max_spill_bytes)]
    for p in problems:
        print("FAIL", p)
    print(f"{len(reports)} configurations, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
