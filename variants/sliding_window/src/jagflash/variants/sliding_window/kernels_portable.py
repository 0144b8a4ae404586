"""Sliding-window attention in stock Triton: the jagged layout's persistent kernels of
``jagflash.core.portable`` with a bounded band. Each q-tile visits only the kv-blocks that
``jagflash.core.mask.kv_tile_range`` hands out for its band (each kv-tile of the dK/dV pass
the q-blocks of ``dkdv_q_range``): blocks wholly inside run unmasked, the edge blocks masked,
blocks outside the band are never loaded. Same arguments as the jagged variant's."""

from __future__ import annotations

from jagflash.core.portable.persistent import jagged_backward as backward
from jagflash.core.portable.persistent import jagged_backward_dq as backward_dq
from jagflash.core.portable.persistent import jagged_forward as forward

__all__ = ["backward", "backward_dq", "forward"]
