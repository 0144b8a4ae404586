"""Block-sparse attention in stock Triton: the jagged layout's persistent kernels of
``jagflash.core.portable`` with a block list. Every pass tiles by the mask's blocks; a q-tile
visits the listed kv-blocks of its band (forward, dQ), a kv-tile the q-blocks of the
transposed lists (dK/dV), both through ``jagflash.core.mask``'s block iterator; unlisted blocks
are never loaded. ``forward(q, k, v, q_offsets, kv_offsets, plan, *, left, right, scale,
backend, blocks)`` and ``backward(dout, q, k, v, out, lse, q_offsets, kv_offsets, plan, ...)``
(``blocks``: the ``BlockMask``) are ``portable.persistent``'s ``sparse_*``."""

from __future__ import annotations

from jagflash.core.portable.persistent import sparse_backward as backward
from jagflash.core.portable.persistent import sparse_forward as forward

__all__ = ["backward", "forward"]
