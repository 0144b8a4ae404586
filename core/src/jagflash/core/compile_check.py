"""Compile every TLX kernel configuration for sm_90a on a machine without a GPU, and report.

    python -m jagflash.core.compile_check            # every configuration, 2 processes on 2 cores
    python -m jagflash.core.compile_check --max-spill-bytes 256 -k d128
    python -m jagflash.core.compile_check -k "bf16 d128" --loops   # + the SASS of each inner loop

The configurations are the declared TLX space of ``jagflash.core.tlx.configs``, each
``(name, kernel, signature, constexprs, options, known_spill)``: ``known_spill`` the spilled
bytes it is known to need (printed in the table, so a known spill stays visible; more fails). Each is compiled
with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` (always compiled, never taken from the
cache), and its registers and spills are read from that compile's own ``ptxas -v`` log: the
figures are those of the cubin that runs (Triton's ptxas options, ``--regAllocOptLevel=2`` among
them), for one ptxas run a configuration. The table shows registers, spilled
bytes, shared memory, and whether wgmma, setmaxnreg and TMA (cp.async.bulk.tensor) made it into
the PTX. Exit status 1 when a configuration fails to compile, spills (unless allowed), or needs
more shared memory than an sm_90 block can have.

``--loops`` also disassembles each cubin (the wheel's ``nvdisasm``) and lists its innermost loops
(found by their backward branches): instructions per iteration, HGMMA (wgmma) instructions,
spill loads and stores (LDL / STL), and the opcodes that dominate. That is how the TLX forward's
kv loop was found 100 instructions longer than the uTLX tutorial's (bench/NOTES.md).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field

#: Largest shared memory one block can take on sm_90 (227 KiB).
SM90_MAX_SHARED = 232448


@dataclass
class SassLoop:
    """One innermost loop of a disassembled kernel: ``[start, end]`` byte addresses and the
    count of each opcode (its first dot-separated part) in one iteration's instructions."""

    start: int
    end: int
    opcodes: Counter = field(default_factory=Counter)

    @property
    def instructions(self) -> int:
        return sum(self.opcodes.values())

    def describe(self, top: int = 6) -> str:
        o = self.opcodes
        common = ", ".join(f"{k} {n}" for k, n in o.most_common(top))
        return (
            f"loop {self.start:#07x}-{self.end:#07x}: {self.instructions} instructions, "
            f"{o['HGMMA']} HGMMA, {o['LDL']} LDL, {o['STL']} STL ({common})"
        )


_SASS_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
_SASS_LABEL = re.compile(r"^\s*\.(L_x_\d+):")
_SASS_BRANCH = re.compile(r"\bBRA\b.*?\.(L_x_\d+)")


def sass_loops(sass: str) -> list[SassLoop]:
    """The innermost loops of ``nvdisasm -c`` output: every backward branch ``BRA .L_x_n`` to
    an earlier label closes a loop from that label to the branch; loops that contain another
    are dropped, so what is left is what runs per iteration of the innermost levels."""
    labels: dict[str, int] = {}
    instrs: list[tuple[int, str]] = []
    pending: list[str] = []
    edges = []
    for line in sass.splitlines():
        m = _SASS_LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _SASS_INSTR.search(line)
        if not m:
            continue
        addr = int(m.group(1), 16)
        for name in pending:
            labels[name] = addr
        pending = []
        instrs.append((addr, m.group(2)))
        b = _SASS_BRANCH.search(line)
        if b and b.group(1) in labels and labels[b.group(1)] <= addr:
            edges.append((labels[b.group(1)], addr))
    spans = sorted(set(edges))
    inner = [
        (lo, hi) for lo, hi in spans
        if not any((lo, hi) != (a, b) and lo <= a and b <= hi for a, b in spans)
    ]
    return [SassLoop(lo, hi, Counter(op for a, op in instrs if lo <= a <= hi)) for lo, hi in inner]


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
    loops: list[SassLoop] = field(default_factory=list)

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


def launch_attrs(fn, signature: dict[str, str]) -> tuple[dict[str, str], dict]:
    """The signature without its ``:16`` marks and the attributes a launch would give: every
    pointer 16-byte aligned (as torch allocates) and each integer typed ``"i32:16"`` divisible by
    16, which Triton's launcher infers from the values (``tt.divisibility``); without them the
    compiled code is not what runs (no paired loads, for one)."""
    names = list(getattr(fn, "arg_names", None) or fn.__code__.co_varnames[: fn.__code__.co_argcount])
    plain, attrs = {}, {}
    for name, kind in signature.items():
        parts = kind if isinstance(kind, tuple) else (kind,)  # a tuple argument: its members' types
        for j, part in enumerate(parts):
            if part.startswith("*") or part.endswith(":16"):
                path = (names.index(name), j) if isinstance(kind, tuple) else (names.index(name),)
                attrs[path] = [["tt.divisibility", 16]]
        plain[name] = tuple(p.removesuffix(":16") for p in parts) if isinstance(kind, tuple) else kind.removesuffix(":16")
    return plain, attrs


def compile_one(name, kernel, signature, constexprs, options, known_spill: int = 0, *, loops: bool = False) -> Report:
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rep = Report(name, known_spill=known_spill)
    log = io.StringIO()
    try:
        fn = getattr(kernel, "fn", kernel)
        jit = kernel if hasattr(kernel, "fn") else None
        signature, attrs = launch_attrs(fn, signature)
        src = ASTSource(jit or fn, signature, constexprs, attrs)
        # Triton prints its ptxas run's -v log when asked: compiled here, not read from the
        # cache (a cached kernel has no log), and that log is the report's registers and spills.
        with knobs.compilation.scope(), knobs.nvidia.scope(), contextlib.redirect_stdout(log):
            knobs.compilation.always_compile = True
            knobs.nvidia.dump_ptxas_log = True
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
    regs = re.findall(r"Used (\d+) registers", log.getvalue())
    if not regs:
        rep.error = "no ptxas -v log from the compile (knobs.nvidia.dump_ptxas_log printed nothing)"
        return rep
    rep.registers = max(map(int, regs))
    rep.spill_bytes = sum(map(int, re.findall(r"(\d+) bytes spill stores", log.getvalue())))
    if loops:
        with tempfile.TemporaryDirectory() as tmp:
            cubin = os.path.join(tmp, "k.cubin")
            with open(cubin, "wb") as f:
                f.write(compiled.asm["cubin"])
            nvdisasm = os.path.join(os.path.dirname(_ptxas()), "nvdisasm")
            dis = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=False)
        rep.loops = sass_loops(dis.stdout)
    return rep


def all_configs() -> list[tuple]:
    """Every configuration of the declared TLX space (``jagflash.core.tlx.configs``)."""
    from jagflash.core.tlx.configs import compile_configs

    return compile_configs()


def _compile(name: str) -> Report:
    """Compile the configuration called ``name`` (in a worker process: kernels do not pickle)."""
    return compile_one(*next(c for c in all_configs() if c[0] == name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--max-spill-bytes", type=int, default=0,
        help="spilled bytes a configuration may have before it fails (default 0)",
    )
    parser.add_argument("-k", default="", help="only configurations whose name contains this")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="configurations compiled at once (processes)")
    parser.add_argument(
        "--loops", action="store_true",
        help="also list each kernel's innermost SASS loops (instructions, HGMMA, LDL/STL spills)",
    )
    args = parser.parse_args(argv)
    configs = [c for c in all_configs() if args.k in c[0]]
    if not configs:
        print("compile_check: no TLX kernel configurations found", file=sys.stderr)
        return 1
    reports = []
    print(f"{'configuration':40s} {'regs':>5s} {'spill B':>8s} {'shared B':>9s}  wgmma setmaxnreg tma")
    if args.loops or args.jobs <= 1:
        results = (compile_one(*cfg, loops=args.loops) for cfg in configs)
    else:
        import multiprocessing

        pool = multiprocessing.get_context("spawn").Pool(args.jobs)
        results = pool.imap(_compile, [c[0] for c in configs])
    for r in results:
        reports.append(r)
        if r.error:
            print(f"{r.name:40s} {r.error}")
        else:
            known = f"  (known spill: {r.known_spill} B)" if r.known_spill else ""
            print(f"{r.name:40s} {r.registers:5d} {r.spill_bytes:8d} {r.shared:9d}  "
                  f"{'yes' if r.wgmma else 'NO':5s} {'yes' if r.setmaxnreg else 'NO':10s} {'yes' if r.tma else 'NO'}{known}")
            for loop in r.loops:
                if loop.instructions >= 32:  # not the barrier-wait and register-handoff spins
                    print("    " + loop.describe())
        sys.stdout.flush()
    problems = [p for r in reports for p in r.problems(args.max_spill_bytes)]
    for p in problems:
        print("FAIL", p)
    print(f"{len(reports)} configurations, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
