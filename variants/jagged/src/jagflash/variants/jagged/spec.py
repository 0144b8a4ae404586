"""What the jagged variant runs, per backend (see ``jagflash.core.capability``)."""

from __future__ import annotations

from jagflash.core.backend import portable_family, tlx_sm90_backend
from jagflash.core.capability import DEFAULT_ATOL, VariantSpec

SPEC = VariantSpec(
    name="jagged",
    layouts=frozenset({"jagged"}),
    # tlx-sm90 first: on the H200 its forward beats the portable one on every bench workload
    # but the many-tiny-sequence one, and its D 128 backward too (bench/NOTES.md).
    backends=(
        tlx_sm90_backend(frozenset({"causal", "gqa", "lse"})),
        *portable_family(frozenset({"causal", "gqa", "lse"})),
    ),
    atol=DEFAULT_ATOL,
)
