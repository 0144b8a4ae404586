"""``varlen_attn``: ``torch.nn.attention.varlen.varlen_attn``'s call, computed by jagflash."""

from __future__ import annotations

from typing import Any

import torch

from jagflash.compat._call import fa_mask, run
from jagflash.core.capability import InvalidInput, UnsupportedProblem

WHO = "jagflash.compat.varlen_attn"


def varlen_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    *,
    return_aux: Any | None = None,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    enable_gqa: bool = False,
    seqused_k: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """torch's ``varlen_attn`` (torch 2.13's signature) with its semantics.

    Args:
        query: ``[T_q, H_q, D]``; key, value: ``[T_k, H_kv, D]``.
        cu_seq_q, cu_seq_k: ``[N + 1]`` cumulative sequence positions (int32; int64 taken);
            zero-length sequences are legal. ``cu_seq_k`` may not be None (that form needs a
            paged cache).
        max_q, max_k: ints, the longest query / key sequence.
        return_aux: ``torch.nn.attention.varlen.AuxRequest(lse=True)`` (any object with a true
            ``lse`` attribute) also returns the LSE.
        scale: default ``1 / sqrt(D)``.
        window_size: ``(left, right)``, -1 unbounded: ``(-1, -1)`` full, ``(-1, 0)`` causal
            (bottom-right aligned: query ``i`` of ``Lq`` sees keys ``j <= i + Lk - Lq``),
            ``(W, 0)`` causal with a window of W keys to the left, which runs on a variant that
            claims the ``window`` feature. A side of at least ``max_k`` counts as unbounded.
        enable_gqa: must be True when ``H_q != H_kv`` (then ``H_q % H_kv == 0``).
        seqused_k, block_table: must be None (no KV-cache decoding or paged KV in jagflash).
        num_splits: None or 1: jagflash never splits a sequence's keys, so its output for a
            sequence does not depend on the rest of the batch; more splits are refused.

    Returns:
        ``out [T_q, H_q, D]``; with ``return_aux.lse``, ``(out, lse)``, ``lse [H_q, T_q]``
        fp32 natural-log, ``+inf`` on a row that sees no key (FlashAttention's convention).
        ``[H_q, T_q]`` is what torch's function returns (FlashAttention 2's ``softmax_lse``,
        passed through: measured with torch 2.11 on an H200, and so in torch 2.13's source),
        although its docstring says ``(T_q, H_q)``.

    Raises:
        UnsupportedProblem, InvalidInput: each listing every reason.
    """
    reasons = []
    if seqused_k is not None:
        reasons.append("seqused_k: jagflash has no KV-cache decoding (pass None)")
    if block_table is not None:
        reasons.append("block_table: jagflash has no paged KV cache (pass None)")
    if num_splits is not None and num_splits != 1:
        reasons.append(f"num_splits={num_splits}: jagflash has no split-KV (pass None or 1)")
    if reasons:
        raise UnsupportedProblem(WHO, reasons)
    invalid = []
    if cu_seq_k is None:
        invalid.append("cu_seq_k is None (only a paged cache, which jagflash lacks, goes without it)")
    hq, hkv = query.shape[1], key.shape[1]
    if not enable_gqa and hq != hkv:
        invalid.append(f"H_q={hq} != H_kv={hkv} without enable_gqa=True")
    if invalid:
        raise InvalidInput(WHO, invalid)
    causal, window = fa_mask(WHO, False, window_size, max_k)
    out, lse = run(
        WHO, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, causal=causal, window=window,
        scale=scale, deterministic=False, backend=None,
    )
    if return_aux is not None and getattr(return_aux, "lse", False):
        return out, lse
    return out
