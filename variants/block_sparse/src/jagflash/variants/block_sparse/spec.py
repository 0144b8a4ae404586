"""What the block-sparse variant runs, per backend (see ``jagflash.core.capability``).

Every call poses the feature ``block_sparse`` and its mask's block size (``block_size_64x64`` or
``block_size_128x128``: ``jagflash.core.block_mask.mask_features``). The portable kernels, the
interpreter and the reference take both block sizes; the TLX kernels take 128 x 128 masks
(``jagflash.core.tuning.TLX_BLOCK_SIZES``: their forward q-tile and dK/dV kv-tile are one block),
so a 64 x 64 mask on a Hopper GPU runs on the portable kernels and ``backend="tlx-sm90"`` is
refused with the reason ``forward with block_size_64x64 not supported``. The TLX kernels walk a
64 x 64 mask as 128 x 128 tiles with each tile's four bits (``jagflash.core.block_tiles``); the
spec routes such masks to them once their GPU tests (``test_tlx_kernels_on_64_masks_match_reference``)
have passed on a Hopper GPU, not before.
"""

from __future__ import annotations

from jagflash.core.backend import portable_family, tlx_sm90_backend
from jagflash.core.block_mask import BLOCK_SIZE_FEATURES, mask_features
from jagflash.core.capability import DEFAULT_ATOL, VariantSpec
from jagflash.core.tuning import TLX_BLOCK_SIZES

#: What every backend implements but the block sizes.
FEATURES = frozenset({"causal", "window", "gqa", "lse"})

SPEC = VariantSpec(
    name="block_sparse",
    layouts=frozenset({"jagged"}),
    backends=(
        tlx_sm90_backend(FEATURES.union(*(mask_features(b) for b in TLX_BLOCK_SIZES))),
        *portable_family(FEATURES | BLOCK_SIZE_FEATURES),
    ),
    atol=DEFAULT_ATOL,
)
