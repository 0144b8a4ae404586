"""What the dense variant runs, per backend (see ``jagflash.core.capability``)."""

from __future__ import annotations

from jagflash.core.backend import kernel_backends
from jagflash.core.capability import DEFAULT_ATOL, VariantSpec

SPEC = VariantSpec(
    name="dense",
    layouts=frozenset({"dense"}),
    backends=kernel_backends(frozenset({"causal", "gqa", "lse"})),
    atol=DEFAULT_ATOL,
)
