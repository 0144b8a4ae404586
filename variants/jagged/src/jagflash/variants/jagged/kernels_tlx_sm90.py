"""Jagged attention on Hopper with TLX: the warp-specialised kernels of
``jagflash.core.tlx`` on the jagged tensors as they are. The backward runs the
portable dQ pass (which also computes delta) and then the TLX dK/dV pass: deterministic. The
one-pass ``jagflash.core.tlx.bwd_sm90.backward`` (dQ added from every kv-tile) runs instead, without
``deterministic``, where ``jagflash.core.tuning.use_one_pass`` says so (D 64 and 128, any mask): ``jagflash.core.tlx.bwd_sm90.jagged_backward``."""

from __future__ import annotations

from jagflash.core.tlx import fwd_sm90
from jagflash.core.tlx.bwd_sm90 import jagged_backward as backward

__all__ = ["backward", "forward"]

forward = fwd_sm90.forward
