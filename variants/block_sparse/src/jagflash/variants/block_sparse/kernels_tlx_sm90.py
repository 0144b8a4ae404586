"""Block-sparse attention on Hopper with TLX: the warp-specialised kernels of
``jagflash.core.tlx`` with a block mask (``blocks=``, a ``jagflash.core.block_mask.BlockMask``
of 128 x 128 blocks). The forward's q-tiles walk their rows of the lists, the dK/dV kernel's
kv-tiles the transposed rows (two 64-query steps per listed q-block), both through
``jagflash.core.mask``'s block iterator; the backward is one pass (dQ reduce-added) or, with
``deterministic``, the portable block-sparse dQ pass then the TLX dK/dV pass, as
``jagflash.core.tuning.use_one_pass`` says: ``jagflash.core.tlx.bwd_sm90.jagged_backward``.
Given a 64 x 64 mask they walk its 128 x 128 tiles, each step masked by its tile's bits
(``jagflash.core.block_tiles``; not yet routed here by the spec)."""

from __future__ import annotations

from jagflash.core.tlx.bwd_sm90 import jagged_backward as backward
from jagflash.core.tlx.fwd_sm90 import forward

__all__ = ["backward", "forward"]
