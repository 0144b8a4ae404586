"""Dense attention in stock Triton: the persistent kernels of ``jagflash.core.portable`` (the
same walker and main loops as the jagged variant; a dense batch is a jagged one of equal
lengths) on ``[B, N, H, D]`` tensors, each tile's sequence found by
``mainloop.dense_sequence`` (batch strides; LSE ``[B, Hq, Nq]``). The kernels are handed the
plan's offsets, which they never read.

Forward and dQ tiles are (batch, q head, q-tile), dK/dV tiles (batch, kv head, kv-tile). With
a causal mask the tiles' costs differ, and the static and dynamic schedules hand the longest out
first; without one every tile costs the same and the schedule only sets the launch shape.

- ``forward(q, k, v, plan, *, left, right, scale, backend)``: O ``[B, Nq, Hq, D]`` (q's
  dtype) and LSE ``[B, Hq, Nq]`` fp32.
- ``backward_dq(dout, q, k, v, out, lse, plan, ...)``: the dQ pass: dQ (fp32 under the
  interpreter, else q's dtype) and delta = rowsum(dO * O) ``[B, Hq, Nq]`` fp32, which the
  dK/dV pass (portable or TLX) reads.
- ``backward(dout, q, k, v, out, lse, plan, ...)``: dQ, dK, dV in the inputs' dtypes.
  Deterministic: no atomics on data.
"""

from __future__ import annotations

import functools

from jagflash.core.portable import persistent
from jagflash.core.portable.mainloop import dense_sequence


def _dense(fn):
    """``fn`` of ``portable.persistent`` for dense tensors: the plan (the last positional
    argument) lends its offsets."""

    @functools.wraps(fn)
    def run(*args, **kw):
        *tensors, plan = args
        return fn(dense_sequence, *tensors, plan.q_offsets, plan.kv_offsets, plan, **kw)

    return run


forward = _dense(persistent.forward)
backward_dq = _dense(persistent.backward_dq)
backward = _dense(persistent.backward)
