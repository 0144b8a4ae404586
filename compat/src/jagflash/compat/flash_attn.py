"""``flash_attn_varlen_func``: FlashAttention 2's varlen call, computed by jagflash."""

from __future__ import annotations

import torch

from jagflash.compat._call import fa_mask, run
from jagflash.core.capability import UnsupportedProblem

WHO = "jagflash.compat.flash_attn_varlen_func"


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
    *,
    return_lse: bool = False,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention 2's ``flash_attn.flash_attn_varlen_func`` with its semantics.

    Args:
        q: ``[total_q, nheads, headdim]``; k, v: ``[total_k, nheads_k, headdim]`` with
            ``nheads % nheads_k == 0`` (MQA/GQA: query head ``h`` reads kv head
            ``h // (nheads // nheads_k)``).
        cu_seqlens_q, cu_seqlens_k: ``[batch + 1]`` int32 (int64 also taken), cumulative
            lengths starting at 0; zero-length sequences are legal and produce no rows.
        max_seqlen_q, max_seqlen_k: ints, the longest query / key sequence (upper bounds).
        dropout_p: must be 0.0 (jagflash has no attention dropout).
        softmax_scale: default ``1 / sqrt(headdim)``.
        causal: bottom-right aligned, as FlashAttention 2.1+: with ``Lq`` queries and ``Lk``
            keys, query ``i`` sees keys ``j <= i + Lk - Lq``; a row that sees no key outputs 0::

                Lq=2, Lk=5: 1 1 1 1 0      Lq=5, Lk=2: 0 0
                            1 1 1 1 1                  0 0
                                                       0 0
                                                       1 0
                                                       1 1

        window_size: ``(left, right)``, -1 unbounded; query ``i`` sees keys in
            ``[i + Lk - Lq - left, i + Lk - Lq + right]``. ``causal`` sets ``right = 0``; a side
            of at least ``max_seqlen_k`` counts as unbounded (as FlashAttention does). Windows
            other than none and causal run on a variant that claims the ``window`` feature
            (the front door lists every installed variant's reasons when none does).
        softcap: must be 0.0; alibi_slopes: must be None; block_table: must be None (paged KV).
        deterministic: a bitwise-repeatable backward.
        return_attn_probs: must be False: jagflash never materialises the attention
            probabilities (FlashAttention 2 returns them only with dropout, for testing).
        return_lse: (jagflash, keyword only) also return ``softmax_lse``, as FlashAttention 3/4
            spell it.
        backend: (jagflash, keyword only) as for :func:`jagflash.core.attention`.

    Returns:
        ``out [total_q, nheads, headdim]`` in q's dtype; with ``return_lse=True``,
        ``(out, softmax_lse)``, ``softmax_lse [nheads, total_q]`` fp32 natural-log, ``+inf``
        on a row that sees no key (FlashAttention's convention). LSE carries no gradient.

    Raises:
        UnsupportedProblem: listing every requested feature jagflash does not compute, or
            every installed variant's reasons when none runs the problem.
        InvalidInput: offsets, shapes or dtypes that break the semantics, all listed.
    """
    reasons = []
    if dropout_p != 0.0:
        reasons.append(f"dropout_p={dropout_p}: jagflash has no attention dropout (pass 0.0)")
    if softcap != 0.0:
        reasons.append(f"softcap={softcap}: jagflash has no logit softcapping (pass 0.0)")
    if alibi_slopes is not None:
        reasons.append("alibi_slopes: jagflash has no ALiBi bias (pass None)")
    if return_attn_probs:
        reasons.append(
            "return_attn_probs=True: jagflash never materialises attention probabilities "
            "(return_lse=True returns (out, softmax_lse))"
        )
    if block_table is not None:
        reasons.append("block_table: jagflash has no paged KV cache (pass None)")
    if reasons:
        raise UnsupportedProblem(WHO, reasons)
    mask_causal, window = fa_mask(WHO, causal, window_size, max_seqlen_k)
    out, lse = run(
        WHO, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=mask_causal,
        window=window, scale=softmax_scale, deterministic=deterministic, backend=backend,
    )
    return (out, lse) if return_lse else out
