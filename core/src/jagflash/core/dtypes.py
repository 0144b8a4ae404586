"""Element types of the attention kernels, as one part every kernel asks (``@triton.jit``,
portable): the accumulator type (:data:`ACC`, fp32: scores, the running max and sum, O, dK, dV,
dQ), the operand a probability or gradient tile becomes before the next matmul
(:func:`mma_operand`: P for P V and P^T dO, dS for dS^T Q and dS K), and the type an output is
stored in (:func:`output`).

The inputs' type (Q, K, V, dO) is the kernel's: TMA descriptors and pointers carry it. Today
every operand is the inputs' type (fp16 or bf16) and every output too, so the hooks are plain
casts; a lower-precision variant (FP8: e4m3 operands with per-tensor descale factors) changes
these functions and the config that selects them, not a kernel body.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["ACC", "mma_operand", "output"]

#: The accumulator type of every matmul and of the online softmax's state.
ACC = tl.constexpr(tl.float32)


@triton.jit
def mma_operand(x, DTYPE: tl.constexpr):
    """An fp32 tile (P, dS) as the operand of the next matmul, in the inputs' type ``DTYPE``."""
    return x.to(DTYPE)


@triton.jit
def output(x, DTYPE: tl.constexpr):
    """An fp32 result tile (O, dK, dV) in the type it is stored in, the inputs' ``DTYPE``."""
    return x.to(DTYPE)
