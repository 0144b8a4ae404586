"""What the broadcast-Q variant runs, per backend (see ``jagflash.core.capability``).

No ``causal`` feature: a causal mask relates a query's position to a key's position inside one
sequence, and the shared queries belong to no K/V sequence, so a causal call is refused.
"""

from __future__ import annotations

import dataclasses

from jagflash.core.backend import portable_family, tlx_sm90_backend
from jagflash.core.capability import DEFAULT_ATOL, VariantSpec

# The family's note says "deterministic backward" (true of the jagged and dense kernels); here
# dQ sums over sequences through atomics unless the caller asks for the ordered reduction.
_PORTABLE_NOTES = "stock Triton; dQ summed over sequences by fp32 atomics, in order with deterministic=True"

SPEC = VariantSpec(
    name="broadcast_q",
    layouts=frozenset({"broadcast_q"}),
    backends=(
        dataclasses.replace(
            tlx_sm90_backend(frozenset({"gqa", "lse"})),
            notes="TLX forward and backward over the shared Q: one pass with dQ summed over the sequences by TMA reduce-adds; deterministic: the portable dQ pass (in order) and the TLX dK/dV pass",
        ),
        *(
            dataclasses.replace(b, notes=_PORTABLE_NOTES) if b.name == "portable" else b
            for b in portable_family(frozenset({"gqa", "lse"}))
        ),
    ),
    atol=DEFAULT_ATOL,
)
