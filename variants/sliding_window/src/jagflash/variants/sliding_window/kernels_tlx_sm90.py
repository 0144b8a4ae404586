"""Sliding-window attention on Hopper with TLX: the warp-specialised kernels of
``jagflash.core.tlx`` with a bounded band (``BOUNDED_LEFT`` / ``BOUNDED_RIGHT`` of their
configs), on the jagged tensors as they are. The producer and the consumers walk the same
kv-blocks of ``jagflash.core.mask``'s ranges, so blocks outside the band are never loaded. The
backward: ``jagflash.core.tlx.bwd_sm90.jagged_backward`` (one pass or two, as
``jagflash.core.tuning.use_one_pass`` says for this window)."""

from __future__ import annotations

from jagflash.core.tlx.bwd_sm90 import jagged_backward as backward
from jagflash.core.tlx.fwd_sm90 import forward

__all__ = ["backward", "forward"]
