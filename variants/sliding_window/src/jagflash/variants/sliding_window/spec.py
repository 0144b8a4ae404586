"""What the sliding-window variant runs, per backend (see ``jagflash.core.capability``): core's
kernels with a bounded band (``window``), on jagged and dense batches."""

from __future__ import annotations

from jagflash.core.backend import kernel_backends
from jagflash.core.capability import DEFAULT_ATOL, VariantSpec

SPEC = VariantSpec(
    name="sliding_window",
    layouts=frozenset({"jagged", "dense"}),
    backends=kernel_backends(frozenset({"causal", "window", "gqa", "lse"})),
    atol=DEFAULT_ATOL,
)
