"""What the block-sparse variant runs, per backend (see ``jagflash.core.capability``).

Every call poses the feature ``block_sparse`` (its ops: ``jagflash.core.jagged_call.jagged_ops``
with ``sparse=True``). The portable kernels, the interpreter and the reference take it; the TLX
kernels are declared without it: their producer and consumers loop over the band's kv-blocks
and do not read block lists yet, so ``backend="tlx-sm90"`` is refused with the reason
``forward with block_sparse not supported`` (and on a Hopper GPU the automatic choice is the
portable kernels).
"""

from __future__ import annotations

from jagflash.core.backend import portable_family, tlx_sm90_backend
from jagflash.core.capability import DEFAULT_ATOL, VariantSpec

#: What every backend but TLX implements.
FEATURES = frozenset({"causal", "window", "gqa", "lse", "block_sparse"})

SPEC = VariantSpec(
    name="block_sparse",
    layouts=frozenset({"jagged"}),
    backends=(tlx_sm90_backend(FEATURES - {"block_sparse"}), *portable_family(FEATURES)),
    atol=DEFAULT_ATOL,
)
