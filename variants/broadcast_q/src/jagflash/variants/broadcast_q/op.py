"""The broadcast-Q ``torch.library`` ops: ``jagflash::broadcast_q_fwd`` / ``broadcast_q_bwd``
(``jagflash.core.ops.attention_ops``: the op plumbing; here only what is broadcast-Q about them).

The ops are opaque to ``torch.compile``: backend selection and the checks that read the
offsets' values happen inside them, at run time. ``max_seqlen_kv = -1`` means "not given": the
op reads it from the offsets (one host synchronisation on a GPU, which also validates them).
Only the backward's dK/dV grid needs it; the forward grid depends on Lq alone.
"""

from __future__ import annotations

import torch

from jagflash.core.checks import raise_if, resolve_max_seqlen
from jagflash.core.jagged import lse_by_sequence
from jagflash.core.ops import attention_ops, stepped_arange
from jagflash.core.reference import reference_backward, reference_forward
from jagflash.variants.broadcast_q.spec import SPEC

WHO = "broadcast_q_attention"


def _max_seqlen_kv(kv_offsets: torch.Tensor, tk: int, max_seqlen_kv: int) -> int:
    """Validate the offsets' values where that costs no extra sync; fill in an unknown maximum."""
    reasons, longest = resolve_max_seqlen(kv_offsets, tk, "kv_offsets", max_seqlen_kv, "kv")
    raise_if(WHO, reasons)
    return longest


def output_offsets(q: torch.Tensor, kv_offsets: torch.Tensor) -> torch.Tensor:
    """Offsets of the output rows ``[B*Lq]``: sequence ``b`` owns rows ``b*Lq`` to ``(b+1)*Lq``
    (as do its expanded queries, its LSE row block and its dO).

    Every call with a plan needs them (the TLX kernels read a sequence's first output row
    there), and they depend on (B, Lq, device, dtype) alone: in plain eager mode they are kept
    (``core.ops.stepped_arange``), so a call does not launch kernels to make them again."""
    return stepped_arange(kv_offsets.numel(), q.shape[0], q.device, kv_offsets.dtype, (q, kv_offsets))


def _expanded(q: torch.Tensor, kv_offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q repeated once per K/V sequence as a jagged ``[B*Lq, Hq, D]`` and its offsets: the
    problem the reference backend solves (dQ is then the sum over the copies)."""
    b, lq = kv_offsets.numel() - 1, q.shape[0]
    qx = q.unsqueeze(0).expand(b, *q.shape).reshape(b * lq, *q.shape[1:])
    return qx, output_offsets(q, kv_offsets)


def _check(c) -> None:
    c.max_k = _max_seqlen_kv(c.kv_offsets, c.k.shape[0], c.max_seqlen_kv)  # invalid input first, then backends


def _plan(c, passes, max_seqlen_kv: int):
    """The Plan a call passed, checked against it (``None`` if it passed none: the TLX kernels
    then lay out their own; the portable broadcast-Q kernels take a plain grid and no plan).
    ``max_seqlen_kv``: the forward's as given (-1: unknown), the backward's as resolved."""
    if c.plan_tiles is None or c.plan_meta is None or c.plan_info is None:
        return None
    return c.plan(
        WHO, passes, q_offsets=output_offsets(c.q, c.kv_offsets), kv_offsets=c.kv_offsets,
        check_offsets=True, derived_q=True, total_q=(c.kv_offsets.numel() - 1) * c.q.shape[0],
        total_kv=c.k.shape[0], max_seqlen_q=c.q.shape[0],
        max_seqlen_kv=None if max_seqlen_kv < 0 else max_seqlen_kv,
    )


def _reference_forward(c):
    b, (lq, hq, dim) = c.kv_offsets.numel() - 1, c.q.shape
    qx, q_offsets = _expanded(c.q, c.kv_offsets)
    out, lse = reference_forward(
        qx, c.k, c.v, q_offsets, c.kv_offsets, causal=False, window=(c.left, c.right), scale=c.scale
    )
    return out.view(b, lq, hq, dim), lse_by_sequence(lse, b)


def _reference_backward(c):
    b, (lq, hq, dim) = c.kv_offsets.numel() - 1, c.q.shape
    qx, q_offsets = _expanded(c.q.float(), c.kv_offsets)  # dQ summed in fp32 below
    dqx, dk, dv = reference_backward(
        c.dout.reshape(b * lq, hq, dim), qx, c.k, c.v, q_offsets, c.kv_offsets,
        causal=False, window=(c.left, c.right), scale=c.scale,
    )
    return dqx.view(b, lq, hq, dim).sum(0).to(c.q.dtype), dk, dv


def _portable_forward(c):
    _plan(c, ("fwd",), c.max_seqlen_kv)  # a plan given is checked, though the portable kernels take none
    return c.kernels.forward(c.q, c.k, c.v, c.kv_offsets, **c.mask, backend=c.ran)



FORWARD = {
    "reference": _reference_forward,
    "tlx-sm90": lambda c: c.kernels.forward(c.q, c.k, c.v, c.kv_offsets, **c.mask, plan=_plan(c, ("fwd",), c.max_seqlen_kv)),
    "portable": _portable_forward,
}

BACKWARD = {
    "reference": _reference_backward,
    "tlx-sm90": lambda c: c.kernels.backward(
        c.dout, c.q, c.k, c.v, c.out, c.lse, c.kv_offsets, **c.mask, deterministic=c.deterministic,
        plan=_plan(c, ("dkdv",), c.max_k),
    ),
    "portable": lambda c: c.kernels.backward(
        c.dout, c.q, c.k, c.v, c.out, c.lse, c.kv_offsets, c.max_k, **c.mask,
        deterministic=c.deterministic, backend=c.ran,
    ),
}


def _fake_forward(c):
    b, (lq, hq, dim) = c.kv_offsets.shape[0] - 1, c.q.shape
    return c.q.new_empty((b, lq, hq, dim)), c.q.new_empty((b, hq, lq), dtype=torch.float32)


broadcast_q_fwd, broadcast_q_bwd, call_fwd = attention_ops(
    "broadcast_q", SPEC, __package__, "Tensor kv_offsets, SymInt max_seqlen_kv", check=_check, forward=FORWARD,
    backward=BACKWARD, fake_forward=_fake_forward,
    fake_backward=lambda c: (c.q.new_empty(c.q.shape), c.k.new_empty(c.k.shape), c.v.new_empty(c.v.shape)),
)
