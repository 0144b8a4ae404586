"""The sliding-window ``torch.library`` ops: ``jagflash::sliding_window_fwd`` /
``sliding_window_bwd``, the jagged layout's ops (``jagflash.core.jagged_call.jagged_ops``)
with the band's bounds ``int left, int right`` after ``causal`` (-1: unbounded; causal clips
``right`` to 0). Dense calls reach them as jagged batches of equal lengths.

Like the jagged variant's, the ops are opaque to ``torch.compile``, read ``max_seqlen_* = -1``
as "not given" (one host synchronisation on a GPU), and carry the Plan as ``plan_tiles``,
``plan_meta``, ``plan_info``; a plan built for another window is refused.
"""

from __future__ import annotations

from jagflash.core.jagged_call import jagged_ops
from jagflash.variants.sliding_window.spec import SPEC

sliding_window_fwd, sliding_window_bwd, call_fwd = jagged_ops(
    "sliding_window", SPEC, __package__, "sliding_window_attention", windowed=True
)
