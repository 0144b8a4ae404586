"""Block-sparse flash attention over jagged batches: ``block_sparse_attention``.

>>> from jagflash.variants.block_sparse import BlockMask, block_sparse_attention
>>> mask = BlockMask.from_mask_mod(lambda b, h, qi, kj: (qi // 256) == (kj // 256), q_offsets, kv_offsets,
...                                block_size=(64, 64), max_seqlen_q=4096, max_seqlen_kv=4096)
>>> out = block_sparse_attention(q, k, v, q_offsets, kv_offsets, mask, causal=True)
"""

from __future__ import annotations

import torch

from jagflash.core.block_mask import BlockMask, local_global, sessions, strided, top_k
from jagflash.core.capability import InvalidInput
from jagflash.core.checks import check_jagged_call, check_window, raise_if
from jagflash.core.jagged_call import op_lengths, op_plan
from jagflash.core.ops import call_problem, call_result, jagged_rows, op_tail, plan_maker
from jagflash.core.options import MaskedOptions, MaskedPlanOptions, Unpack, resolve, takes
from jagflash.core.plan.model import Plan
from jagflash.core.registry import Variant
from jagflash.variants.block_sparse import op
from jagflash.variants.block_sparse.spec import SPEC

__all__ = [
    "SPEC", "VARIANT", "BlockMask", "block_sparse_attention", "local_global", "make_plan", "sessions", "strided",
    "top_k",
]

_WHO = "block_sparse_attention"


def _mask_reasons(block_mask: object, q_offsets: object, kv_offsets: object, q: object) -> list[str]:
    if not isinstance(block_mask, BlockMask):
        return [f"block_mask must be a jagflash BlockMask, got {type(block_mask).__name__}"]
    if not all(isinstance(t, torch.Tensor) for t in (q_offsets, kv_offsets, q)) or q.dim() != 3:  # type: ignore[union-attr]
        return []  # the call's own checks name these
    return block_mask.call_reasons(q_offsets, kv_offsets, q.shape[1])  # type: ignore[arg-type, union-attr]


@takes(MaskedOptions, order="causal window scale return_lse deterministic plan backend")
def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    block_mask: BlockMask,
    *,
    window: tuple[int, int] | None = None,
    **options: Unpack[MaskedOptions],
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of each query over the keys of the blocks its q-block lists.

    Query ``i`` of sequence ``b`` sees key ``j`` iff block ``(i // bm, j // bn)`` is listed in
    ``block_mask`` (for its head) and the element mask allows it: causal (bottom-right, as the
    jagged variant's) and ``window`` cut inside the listed blocks::

        block_size (2, 2), Lq = Lk = 6, listed blocks (0,0) (1,0) (2,1) (2,2), causal=True
             keys 0 1 2 3 4 5
        q0        x . . . . .
        q1        x x . . . .
        q2        x x . . . .      q-block 1 lists kv-block 0 only
        q3        x x . . . .
        q4        . . x x x .      q-block 2 lists kv-blocks 1, 2; causal cuts block 2
        q5        . . x x x x

    A query that sees no key (its q-block lists nothing visible) outputs 0 with LSE -inf and
    gets zero gradients. Only listed blocks are loaded and computed.

    Args:
        q: ``[Tq, Hq, D]`` queries of all sequences back to back.
        k, v: ``[Tk, Hkv, D]``, ``Hq % Hkv == 0`` (GQA/MQA).
        q_offsets, kv_offsets: ``[B+1]`` int32/int64 offsets (zero-length sequences produce no
            rows; Lq != Lk is legal).
        block_mask: a :class:`~jagflash.core.block_mask.BlockMask` built for these offsets
            (1 head or Hq heads); the kernels tile by its ``block_size``.
        causal, window: element masks as for the jagged and sliding-window variants.
        return_lse: also return LSE ``[Hq, Tq]``, fp32, natural log.
        plan: a load-balancing Plan with the mask's block sizes (a call without one builds its
            own, costed by the listed blocks).
        backend: ``"tlx-sm90"`` (128 x 128 masks, D 64 and 128), ``"portable"``,
            ``"interpreter"``, ``"reference"`` or ``None`` (the fastest that runs).

    Invalid inputs raise :class:`~jagflash.core.capability.InvalidInput` (a mask for other
    offsets or heads, a non-BlockMask, the jagged checks) and problems no backend implements
    :class:`~jagflash.core.capability.UnsupportedProblem`, each listing every reason.
    """
    o = resolve(_WHO, MaskedOptions, options)
    causal, plan = o["causal"], o["plan"]
    window = (-1, -1) if window is None else window
    reasons = check_window(window, causal) + _mask_reasons(block_mask, q_offsets, kv_offsets, q)
    nq, nk = block_mask.grid if isinstance(block_mask, BlockMask) else (0, 0)
    bm, bn = block_mask.block_size if isinstance(block_mask, BlockMask) else (0, 0)
    max_q, max_k = nq * bm, nk * bn  # the grid covers every sequence (checked when it was built)
    try:
        needs_grad = check_jagged_call(
            _WHO, q, k, v, q_offsets, kv_offsets, max_seqlen_q=max_q, max_seqlen_kv=max_k, plan=plan
        )
    except InvalidInput as e:  # refuse with the mask's and window's reasons too
        raise InvalidInput(_WHO, reasons + e.reasons) from None
    raise_if(_WHO, reasons)
    left, right = (int(x) for x in window)
    plan_args = op_plan(
        SPEC, plan, q, k, q_offsets, kv_offsets, causal=bool(causal), window=(left, right),
        max_seqlen_q=max_q, max_seqlen_kv=max_k, backward=needs_grad, backend=o["backend"], block_mask=block_mask,
    )
    m = block_mask
    out, lse = op.call_fwd(
        q, k, v, q_offsets, kv_offsets, *op_lengths(max_q, max_k), bool(causal), left, right,
        m.kv_counts, m.kv_indices, m.q_counts, m.q_indices, bm, bn, *op_tail(o, q), *plan_args,
    )
    return call_result(out, lse, o)


@takes(MaskedPlanOptions, order="causal window schedule backward_schedule workers backward backend")
def make_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    block_mask: BlockMask,
    *,
    window: tuple[int, int] | None = None,
    **options: Unpack[MaskedPlanOptions],
) -> Plan:
    """The load-balancing :class:`~jagflash.core.plan.model.Plan` of a batch for
    :func:`block_sparse_attention` with this ``block_mask``, ``causal`` and ``window``: tiles of
    the mask's blocks, each costed by its listed blocks; no host sync. ``q [Tq, Hq, D]`` and
    ``k`` are read for shapes and device only; the offsets, ``block_mask`` and ``window`` as
    for :func:`block_sparse_attention`. Layers that share the batch and the mask share it."""
    return _make_plan(q, k, q_offsets, kv_offsets, options, block_mask=block_mask, window=window)


def _rows(q, k, q_offsets, kv_offsets, o: dict, *, block_mask, window) -> tuple[list[str], dict]:
    """The rows of a plan: the jagged batch's, tiled and costed by ``block_mask``'s blocks."""
    window = (-1, -1) if window is None else window
    reasons, lay = jagged_rows(q, k, q_offsets, kv_offsets, o)
    reasons = check_window(window, o["causal"]) + reasons + _mask_reasons(block_mask, q_offsets, kv_offsets, q)
    if reasons:
        return reasons, {}
    (nq, nk), (bm, bn) = block_mask.grid, block_mask.block_size
    return [], {
        **lay, "causal": bool(o["causal"]), "window": (int(window[0]), int(window[1])), "max_seqlen_q": nq * bm,
        "max_seqlen_kv": nk * bn, "block_mask": block_mask,
    }


_make_plan = plan_maker(
    SPEC, layout="jagged", who="jagflash.variants.block_sparse.make_plan", options=MaskedPlanOptions, rows=_rows
)


#: Below the other jagged variants; a front-door call with ``block_mask=`` poses
#: ``block_sparse``, which only this variant takes (``jagflash.core.ops.call_problem``).
VARIANT = Variant(spec=SPEC, problem=call_problem("jagged"), run=block_sparse_attention, priority=-2)
