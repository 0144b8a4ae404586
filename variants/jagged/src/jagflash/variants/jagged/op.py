"""The jagged attention ``torch.library`` ops: ``jagflash::jagged_fwd`` / ``jagged_bwd``
(``jagflash.core.ops.attention_ops``: the op plumbing; here only what is jagged about them).

The ops are opaque to ``torch.compile``: backend selection and the checks that read offsets'
values happen inside them, at run time, so a compiled graph has no break and no host sync of
its own. ``max_seqlen_* = -1`` means "not given": the op reads it from the offsets (one host
synchronisation on a GPU, which also validates the offsets' values).

The Plan (``jagflash.core.plan``) crosses the ops as ``plan_tiles``, ``plan_meta`` and
``plan_info``; the forward's autograd context saves them, so the backward runs on the plan the
forward ran on. Called without a plan (only code that calls an op directly does), an op builds
one for the passes it runs. ``deterministic`` is saved the same way and matters to the backward
alone: the TLX backward takes it (ordered two passes instead of dQ reduce-adds); the portable
and reference backwards are always deterministic and do not need it.
"""

from __future__ import annotations

import torch

from jagflash.core.checks import raise_if, resolve_max_seqlen, same_batch
from jagflash.core.ops import attention_ops
from jagflash.core.reference import reference_backward, reference_forward
from jagflash.variants.jagged.spec import SPEC


def _lengths(
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    tq: int,
    tk: int,
    max_seqlen_q: int,
    max_seqlen_kv: int,
) -> tuple[int, int]:
    """Validate the offsets' values where that costs no extra sync, and fill in unknown maxima."""
    reasons = same_batch(q_offsets, kv_offsets)
    rq, max_q = resolve_max_seqlen(q_offsets, tq, "q_offsets", max_seqlen_q, "q")
    rk, max_k = resolve_max_seqlen(kv_offsets, tk, "kv_offsets", max_seqlen_kv, "kv")
    reasons += rq + rk
    raise_if("jagged_attention", reasons)
    return max_q, max_k


def _check(c) -> None:
    # Invalid offsets are the caller's error whatever backend would run: check them first.
    c.max_q, c.max_k = _lengths(c.q_offsets, c.kv_offsets, c.q.shape[0], c.k.shape[0], c.max_seqlen_q, c.max_seqlen_kv)


def _plan(c, passes):
    return c.plan(
        "jagged_attention", passes, q_offsets=c.q_offsets, kv_offsets=c.kv_offsets, check_offsets=True,
        total_q=c.q.shape[0], total_kv=c.k.shape[0], max_seqlen_q=c.max_q, max_seqlen_kv=c.max_k,
    )



def _reference(fn, *grad):
    return lambda c, **given: fn(
        *(getattr(c, n) for n in grad), c.q, c.k, c.v, c.q_offsets, c.kv_offsets, causal=c.causal,
        window=(c.left, c.right), scale=c.scale, **given,
    )


FORWARD = {
    "reference": _reference(reference_forward),
    "tlx-sm90": lambda c: c.kernels.forward(
        c.q, c.k, c.v, c.q_offsets, c.kv_offsets, c.max_q, **c.mask, plan=_plan(c, ("fwd",))
    ),
    "portable": lambda c: c.kernels.forward(
        c.q, c.k, c.v, c.q_offsets, c.kv_offsets, _plan(c, ("fwd",)), **c.mask, backend=c.ran
    ),
}

BACKWARD = {
    "reference": lambda c: _reference(reference_backward, "dout")(c, out=c.out, lse=c.lse),
    "tlx-sm90": lambda c: c.kernels.backward(
        c.dout, c.q, c.k, c.v, c.out, c.lse, c.q_offsets, c.kv_offsets, _plan(c, ("dq", "dkdv")),
        **c.mask, deterministic=c.deterministic,
    ),
    # Always deterministic (no atomics): ``deterministic`` asks nothing more of it.
    "portable": lambda c: c.kernels.backward(
        c.dout, c.q, c.k, c.v, c.out, c.lse, c.q_offsets, c.kv_offsets, _plan(c, ("dq", "dkdv")),
        **c.mask, backend=c.ran,
    ),
}

jagged_fwd, jagged_bwd, call_fwd = attention_ops(
    "jagged", SPEC, __package__, "Tensor q_offsets, Tensor kv_offsets, SymInt max_seqlen_q, SymInt max_seqlen_kv, bool causal",
    check=_check, forward=FORWARD, backward=BACKWARD,
    fake_forward=lambda c: (torch.empty_like(c.q), c.q.new_empty((c.q.shape[1], c.q.shape[0]), dtype=torch.float32)),
    fake_backward=lambda c: (torch.empty_like(c.q), torch.empty_like(c.k), torch.empty_like(c.v)),
)
