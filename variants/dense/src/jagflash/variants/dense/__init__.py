"""Flash attention over dense batches: ``dense_attention``.

>>> from jagflash.variants.dense import dense_attention
>>> out = dense_attention(q, k, v, causal=True)
"""

from __future__ import annotations

import torch

from jagflash.core.ops import call_problem, check_qkv, default_scale, raise_if
from jagflash.core.registry import Variant
from jagflash.variants.dense import op
from jagflash.variants.dense.spec import SPEC

__all__ = ["SPEC", "VARIANT", "dense_attention"]


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention over a dense batch.

    Args:
        q: ``[B, Nq, Hq, D]``.
        k, v: ``[B, Nk, Hkv, D]`` with ``Hq % Hkv == 0`` (GQA/MQA: query head ``h`` reads kv
            head ``h // (Hq // Hkv)``). Nq != Nk is legal.
        causal: bottom-right aligned: query ``i`` sees keys ``j <= i + Nk - Nq``::

                Nq=3, Nk=5
                q0  x x x . .
                q1  x x x x .
                q2  x x x x x

            A query that sees no key (Nq > Nk) outputs 0 with LSE -inf and zero gradients.
        scale: softmax scale, default ``1/sqrt(D)``.
        return_lse: also return LSE ``[B, Hq, Nq]`` fp32, natural log (no gradient).
        backend: ``"portable"``, ``"interpreter"``, ``"reference"`` or ``None`` for the fastest
            that runs the problem; ``jagflash.core.backend.last_choice("dense")`` tells which ran.

    Inputs whose last dimension is not contiguous are copied. Invalid inputs raise
    :class:`~jagflash.core.capability.InvalidInput`, unimplemented ones
    :class:`~jagflash.core.capability.UnsupportedProblem`, each listing every reason.
    """
    reasons = check_qkv(q, k, v, rank=4, layout_doc="[B, N, H, D]")
    if not reasons and q.shape[0] != k.shape[0]:
        reasons.append(f"q and k batch sizes differ: {q.shape[0]} vs {k.shape[0]}")
    raise_if("dense_attention", reasons)
    out, lse = op.dense_fwd(
        q, k, v, bool(causal), default_scale(scale, q.shape[-1]), bool(return_lse), backend or ""
    )
    return (out, lse) if return_lse else out


VARIANT = Variant(spec=SPEC, problem=call_problem("dense"), run=dense_attention, priority=0)
