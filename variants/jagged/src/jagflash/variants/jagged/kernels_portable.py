"""Jagged attention in stock Triton: the persistent kernels of ``jagflash.core.portable`` on
``[T, H, D]`` tensors, each tile's sequence found from the offsets by
``mainloop.jagged_sequence`` (LSE ``[Hq, Tq]``).

Each pass (forward, dQ, dK/dV) is one launch of W programs (static or dynamic schedule) or of
one program per table row (``schedule="none"``); the tile count is read on the device, so no
grid depends on a value that lives on the GPU. Forward and dQ tiles are (sequence, q head,
q-tile); dK/dV tiles are (sequence, kv head, kv-tile), summed over the GQA group in-program.
A worker resolves tiles two ahead of the one it runs (``portable.persistent.walk``).

``forward(q, k, v, q_offsets, kv_offsets, plan, *, left, right, scale, backend)``,
``backward_dq(dout, q, k, v, out, lse, q_offsets, kv_offsets, plan, ...)`` and ``backward``
(same arguments) are ``portable.persistent``'s with this layout: O and LSE ``[Hq, Tq]``; dQ
and delta; dQ, dK, dV (deterministic: a dynamic schedule changes which program runs a tile,
never what the tile computes).
"""

from __future__ import annotations

from jagflash.core.portable.persistent import jagged_backward as backward
from jagflash.core.portable.persistent import jagged_backward_dq as backward_dq
from jagflash.core.portable.persistent import jagged_forward as forward

__all__ = ["backward", "backward_dq", "forward"]
