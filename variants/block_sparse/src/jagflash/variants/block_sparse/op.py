"""The block-sparse ``torch.library`` ops: ``jagflash::block_sparse_fwd`` / ``block_sparse_bwd``,
the jagged layout's ops (``jagflash.core.jagged_call.jagged_ops``) with the band's bounds
``int left, int right`` and a ``jagflash.core.block_mask.BlockMask``'s lists and block size
(``jagflash.core.jagged_call.SPARSE_ARGS``) after them. Like the jagged variant's, the ops are
opaque to ``torch.compile`` and carry the Plan as ``plan_tiles``, ``plan_meta``, ``plan_info``.
"""

from __future__ import annotations

from jagflash.core.jagged_call import jagged_ops
from jagflash.variants.block_sparse.spec import SPEC

block_sparse_fwd, block_sparse_bwd, call_fwd = jagged_ops(
    "block_sparse", SPEC, __package__, "block_sparse_attention", sparse=True
)
