"""What the jagged variant runs, per backend (see ``jagflash.core.capability``)."""

from __future__ import annotations

import torch

from jagflash.core.backend import interpreter_reasons, portable_reasons
from jagflash.core.capability import BackendSpec, VariantSpec

_HEAD_DIMS = frozenset({16, 32, 64, 96, 128, 256})
_FEATURES = frozenset({"causal", "gqa", "lse"})

SPEC = VariantSpec(
    name="jagged",
    layouts=frozenset({"jagged"}),
    backends=(
        BackendSpec(
            name="portable",
            devices=frozenset({"cuda"}),
            min_capability=(8, 0),
            dtypes=frozenset({torch.float16, torch.bfloat16}),
            head_dims_fwd=_HEAD_DIMS,
            # dK and dV of a 256-wide head do not fit in registers beside K and V.
            head_dims_bwd=_HEAD_DIMS - {256},
            features_fwd=_FEATURES,
            features_bwd=_FEATURES | {"deterministic"},
            available=portable_reasons,
            notes="stock Triton; the backward is deterministic (no atomics)",
        ),
        BackendSpec(
            name="interpreter",
            devices=frozenset({"cpu"}),
            # bf16 is upcast to fp32 before the kernel: the interpreter computes bf16 wrongly.
            dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16}),
            head_dims_fwd=_HEAD_DIMS,
            head_dims_bwd=_HEAD_DIMS,
            features_fwd=_FEATURES,
            features_bwd=_FEATURES | {"deterministic"},
            available=interpreter_reasons,
            notes="the portable kernels under TRITON_INTERPRET=1; bf16 runs as fp32",
        ),
        BackendSpec(
            name="reference",
            devices=frozenset({"cpu", "cuda"}),
            dtypes=frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16}),
            head_dims_fwd=frozenset(range(1, 513)),
            head_dims_bwd=frozenset(range(1, 513)),
            features_fwd=_FEATURES,
            features_bwd=_FEATURES | {"deterministic"},
            notes="plain PyTorch, one sequence at a time, fp32 math",
        ),
    ),
    atol={torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2},
)
