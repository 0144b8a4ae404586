"""Probe (CPU, no GPU needed): the PTX of named TLX configurations of the declared space
(``jagflash.core.tlx.configs``), compiled for sm_90a, with a hash of each, so two trees' kernels
can be compared: the same hash is the same GPU code.

    TRITON_INTERPRET=0 python bench/probes/tlx_ptx.py --out DIR "tlx_fwd_dynamic fp16 d128 causal" ...
    TRITON_INTERPRET=0 python bench/probes/tlx_ptx.py -k sparse          # every name containing "sparse"

The hash is taken with the debug info removed (``.loc`` / ``.file`` directives, the ``$L__tmp``
labels of inlined scopes and the ``.debug_*`` sections), which moves with every edit of a
kernel's source file (``code_of``; ``bench/probes/portable_ptx.py``'s files compare through it too).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re

_DEBUG_LINE = re.compile(r"^\s*\.(loc|file)\s|^\$L__tmp\d+:$")


def code_of(ptx: str) -> str:
    """``ptx`` without its debug info."""
    head = ptx.split("\n\t.section\t.debug", 1)[0]
    return "\n".join(line for line in head.splitlines() if not _DEBUG_LINE.match(line))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", help="configuration names (compile_check's table)")
    ap.add_argument("-k", default=None, help="every configuration whose name contains this")
    ap.add_argument("--out", default=None, help="write each configuration's PTX (debug lines removed) here")
    a = ap.parse_args()

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from jagflash.core.compile_check import launch_attrs
    from jagflash.core.tlx.configs import compile_configs

    configs = {c[0]: c for c in compile_configs()}
    names = list(a.names) + ([n for n in configs if a.k in n] if a.k else [])
    for name in names:
        _, kernel, signature, constexprs, options, _ = configs[name]
        sig, attrs = launch_attrs(getattr(kernel, "fn", kernel), signature)
        compiled = triton.compile(ASTSource(kernel, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32), options=options)
        code = code_of(compiled.asm["ptx"])
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, name.replace(" ", "_") + ".ptx"), "w") as f:
                f.write(code)
        print(f"{hashlib.sha256(code.encode()).hexdigest()[:16]}  {name}", flush=True)


if __name__ == "__main__":
    main()
