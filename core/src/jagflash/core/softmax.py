"""The online softmax, shared by every attention kernel (``@triton.jit``, portable: the
interpreter runs it on the CPU, and the stock-Triton and TLX kernels call the same code).

Scores are kept in the log2 domain: ``s2 = (q . k) * scale * log2(e)``, so the softmax uses
``exp2``. The LSE handed to callers is in natural log (``lse = lse2 * ln 2``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = [
    "LN2",
    "LOG2E",
    "attn_delta",
    "finish_softmax",
    "lse_to_log2",
    "merge_partial_rows",
    "merge_partials",
    "online_softmax_step",
    "online_softmax_step_scaled",
]

LOG2E = tl.constexpr(1.4426950408889634)


LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def online_softmax_step(s2, m_i, l_i):
    """One step of the online softmax over a tile of log2-domain scores ``s2 [M, N]``.

    Returns ``(p, alpha, m_new, l_new)``: the tile's unnormalised probabilities, the factor that
    rescales the running accumulator, and the new running max and sum. A row that has seen only
    masked (-inf) scores keeps ``m = -inf`` and ``l = 0`` without producing NaN.
    """
    return online_softmax_step_scaled(s2, 1.0, m_i, l_i)


@triton.jit
def online_softmax_step_scaled(s, scale2, m_i, l_i):
    """:func:`online_softmax_step` over raw scores ``s`` (masked ones -inf) whose log2-domain
    scale ``scale2`` must be positive: the scale rides in the exponent, one fused multiply-add
    per score instead of a multiply and a subtract, and on the row maxima."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale2)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s * scale2 - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new


@triton.jit
def finish_softmax(acc, m_i, l_i):
    """Normalised output and natural-log LSE; a row with no visible key gives 0 and -inf. One
    reciprocal a row, then a multiply an element: a division an element costs four instructions
    of range handling each (``div.full.f32``: ~190 a thread at D 128 in the TLX epilogue)."""
    seen = l_i > 0.0
    out = acc * (1.0 / tl.where(seen, l_i, 1.0))[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
    return out, lse


@triton.jit
def lse_to_log2(lse):
    """Natural-log LSE -> log2 domain for the backward; -inf (no key seen) -> +inf, so that
    ``exp2(s2 - lse2)`` is 0 for that row instead of NaN."""
    return tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)


@triton.jit
def attn_delta(o, do):
    """delta = rowsum(dO * O) in fp32 over ``[rows, D]`` tiles: the backward's dS = P (dP - delta)."""
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)


@triton.jit
def merge_partial_rows(out, lse, part, part_lse):
    """:func:`merge_partials` in a kernel, on ``[M, D]`` fp32 normalised outputs and ``[M]``
    natural-log LSE: ``(out', lse')`` over the union of the two key sets; rows -inf on both
    sides stay 0 and -inf, a side at -inf contributes nothing (its output must be finite)."""
    top = tl.maximum(lse, part_lse)
    top_safe = tl.where(top == float("-inf"), 0.0, top)
    total = tl.exp(lse - top_safe) + tl.exp(part_lse - top_safe)
    merged = tl.where(total > 0.0, top_safe + tl.log(tl.where(total > 0.0, total, 1.0)), float("-inf"))
    base = tl.where(merged == float("-inf"), 0.0, merged)
    w = tl.exp(lse - base)
    w_part = tl.exp(part_lse - base)
    return out * w[:, None] + part * w_part[:, None], merged


def merge_partials(
    out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two attentions of the same queries over disjoint key sets into the attention over
    their union (torch, not ``@jit``: it runs between kernel calls, e.g. context parallelism).

    ``out``, ``part``: ``[T, H, D]`` normalised outputs; ``lse``, ``part_lse``: ``[H, T]`` fp32,
    natural log, as the kernels return them. Returns ``(out', lse')`` with
    ``lse' = log(e^lse + e^part_lse)`` and ``out' = e^(lse - lse') out + e^(part_lse - lse') part``,
    ``out'`` in fp32. A row that saw no key in either (both LSE -inf) stays output 0 and LSE
    -inf, without NaN; a row with -inf on one side takes the other side unchanged. Such a side's
    output must be finite (the kernels write 0 there).
    """
    merged = torch.logaddexp(lse, part_lse)
    base = torch.where(merged == float("-inf"), 0.0, merged)
    w = torch.exp(lse - base).transpose(0, 1).unsqueeze(-1)
    w_part = torch.exp(part_lse - base).transpose(0, 1).unsqueeze(-1)
    return w * out.float() + w_part * part.float(), merged
