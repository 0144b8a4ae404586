"""The dense attention ``torch.library`` ops: ``jagflash::dense_fwd`` / ``dense_bwd``
(``jagflash.core.ops.attention_ops``: the op plumbing; here only what is dense about them).

The Plan (``jagflash.core.plan``) crosses the ops as ``plan_tiles``, ``plan_meta`` and
``plan_info``; the backward runs on the plan the forward saved. Called without one (only code
that calls an op directly does), an op builds one for the passes it runs. ``deterministic`` is
saved the same way and matters to the backward alone: the TLX backward takes it (ordered two
passes instead of dQ reduce-adds); the portable and reference backwards are always
deterministic and do not need it.
"""

from __future__ import annotations

import torch

from jagflash.core.jagged import lse_by_sequence
from jagflash.core.ops import attention_ops, stepped_arange
from jagflash.core.reference import reference_backward, reference_forward
from jagflash.variants.dense.spec import SPEC


def _as_jagged(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets that view ``[B, N, H, D]`` as jagged ``[B*N, H, D]`` (the plan check of every
    call, the reference): kept per shape in plain eager mode (``core.ops.stepped_arange``)."""
    b, nq, nk = q.shape[0], q.shape[1], k.shape[1]
    return (
        stepped_arange(b + 1, nq, q.device, torch.int64, (q, k)),
        stepped_arange(b + 1, nk, q.device, torch.int64, (q, k)),
    )


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])


def _plan(c, passes):
    b, nq, nk = c.q.shape[0], c.q.shape[1], c.k.shape[1]
    q_offsets, kv_offsets = _as_jagged(c.q, c.k)
    return c.plan(
        "dense_attention", passes, q_offsets=q_offsets, kv_offsets=kv_offsets, check_offsets=False,
        total_q=b * nq, total_kv=b * nk, max_seqlen_q=nq, max_seqlen_kv=nk,
    )


def _reference_forward(c):
    out, lse = reference_forward(
        _flat(c.q), _flat(c.k), _flat(c.v), *_as_jagged(c.q, c.k), causal=c.causal,
        window=(c.left, c.right), scale=c.scale,
    )
    return out.view(c.q.shape), lse_by_sequence(lse, c.q.shape[0])


def _reference_backward(c):
    dq, dk, dv = reference_backward(
        _flat(c.dout), _flat(c.q), _flat(c.k), _flat(c.v), *_as_jagged(c.q, c.k), causal=c.causal,
        window=(c.left, c.right), scale=c.scale,
    )
    return dq.view(c.q.shape), dk.view(c.k.shape), dv.view(c.v.shape)



FORWARD = {
    "reference": _reference_forward,
    "tlx-sm90": lambda c: c.kernels.forward(c.q, c.k, c.v, _plan(c, ("fwd",)), **c.mask),
    "portable": lambda c: c.kernels.forward(c.q, c.k, c.v, _plan(c, ("fwd",)), **c.mask, backend=c.ran),
}

BACKWARD = {
    "reference": _reference_backward,
    "tlx-sm90": lambda c: c.kernels.backward(
        c.dout, c.q, c.k, c.v, c.out, c.lse, _plan(c, ("dq", "dkdv")), **c.mask,
        deterministic=c.deterministic,
    ),
    # Always deterministic (no atomics): ``deterministic`` asks nothing more of it.
    "portable": lambda c: c.kernels.backward(
        c.dout, c.q, c.k, c.v, c.out, c.lse, _plan(c, ("dq", "dkdv")), **c.mask, backend=c.ran
    ),
}


def _fake_forward(c):
    b, nq, hq, _ = c.q.shape
    return torch.empty_like(c.q), c.q.new_empty((b, hq, nq), dtype=torch.float32)


dense_fwd, dense_bwd, call_fwd = attention_ops(
    "dense", SPEC, __package__, "bool causal", check=lambda c: None, forward=FORWARD, backward=BACKWARD,
    fake_forward=_fake_forward,
    fake_backward=lambda c: (torch.empty_like(c.q), torch.empty_like(c.k), torch.empty_like(c.v)),
)
