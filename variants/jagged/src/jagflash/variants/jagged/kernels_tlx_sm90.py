"""Jagged attention on Hopper with TLX: the warp-specialised forward of
``jagflash.core.tlx_attention`` on the jagged tensors as they are. (Backward: portable kernels.)"""

from __future__ import annotations

from jagflash.core import tlx_attention
from jagflash.core.tlx_attention import forward

__all__ = ["compile_configs", "forward"]


def compile_configs():
    return tlx_attention.compile_configs()
