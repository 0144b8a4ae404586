"""What both drop-ins share: FlashAttention's window conventions and the call to the front door."""

from __future__ import annotations

import math

import torch

from jagflash.core import attention
from jagflash.core.capability import InvalidInput


def fa_mask(
    who: str, causal: bool, window_size: tuple[int, int], max_seqlen_k: int
) -> tuple[bool, tuple[int, int]]:
    """``(causal, window)`` in jagflash's terms for FlashAttention's ``causal`` and
    ``window_size=(left, right)``, normalised as FlashAttention 2 does before its kernels run:
    a negative side is unbounded (-1); ``causal`` sets ``right = 0``; a side of at least
    ``max_seqlen_k`` is unbounded. ``(-1, 0)`` is then plain causal attention and ``(-1, -1)``
    none, which every variant runs; any other window is passed on as ``window=(left, right)``
    (the same bottom-right aligned band: query ``i`` of ``Lq`` sees keys in
    ``[i + Lk - Lq - left, i + Lk - Lq + right]``)."""
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise InvalidInput(who, [f"window_size must be two ints (left, right), got {window_size!r}"]) from None
    left, right = max(left, -1), max(right, -1)
    if causal:
        right = 0
    if left >= max_seqlen_k:
        left = -1
    if right >= max_seqlen_k:
        right = -1
    if (left, right) == (-1, 0):
        return True, (-1, -1)
    return right == 0, (left, right)


def run(
    who: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    causal: bool,
    window: tuple[int, int],
    scale: float | None,
    deterministic: bool,
    backend: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [Tq, Hq, D], lse [Hq, Tq])`` from the front door, with FlashAttention's LSE
    convention: a query row that sees no key has LSE ``+inf`` (jagflash's own is ``-inf``), so
    that ``exp(s - lse)`` is 0 there as in FlashAttention's kernels."""
    if not (isinstance(max_q, int | torch.SymInt) and isinstance(max_k, int | torch.SymInt)):
        raise InvalidInput(who, [f"max_seqlen_q and max_seqlen_k must be ints, got {type(max_q).__name__} and {type(max_k).__name__}"])
    call = {"causal": causal, "scale": scale, "deterministic": deterministic, "backend": backend}
    if window != (-1, -1):
        call["window"] = window
    out, lse = attention(
        q, k, v, q_offsets=cu_q, kv_offsets=cu_k, max_seqlen_q=max_q, max_seqlen_kv=max_k,
        return_lse=True, **call,
    )
    return out, torch.where(lse == -math.inf, math.inf, lse)
