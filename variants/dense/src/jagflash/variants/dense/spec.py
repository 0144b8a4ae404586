"""What the dense variant runs, per backend (see ``jagflash.core.capability``)."""

from __future__ import annotations

from jagflash.core.backend import portable_family, tlx_sm90_backend
from jagflash.core.capability import DEFAULT_ATOL, VariantSpec

SPEC = VariantSpec(
    name="dense",
    layouts=frozenset({"dense"}),
    # tlx-sm90 comes after the portable backends: it is opt-in (backend="tlx-sm90") until its
    # GPU tests have passed on an H200; see bench/NOTES.md.
    backends=(
        *portable_family(frozenset({"causal", "gqa", "lse"})),
        tlx_sm90_backend(frozenset({"causal", "gqa", "lse"})),
    ),
    atol=DEFAULT_ATOL,
)
