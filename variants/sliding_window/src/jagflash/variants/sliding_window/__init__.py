"""Sliding-window (local) flash attention over jagged and dense batches:
``sliding_window_attention``.

>>> from jagflash.variants.sliding_window import sliding_window_attention
>>> out = sliding_window_attention(q, k, v, q_offsets, kv_offsets, window=(256, 0))  # last 257 keys
>>> out = sliding_window_attention(q4, k4, v4, window=(1024, -1), causal=True)       # dense [B, N, H, D]

Several layers over one batch share a load-balancing Plan, built once for the window:

>>> plan = make_plan(q, k, q_offsets, kv_offsets, window=(256, 0))
>>> out = sliding_window_attention(q, k, v, q_offsets, kv_offsets, window=(256, 0), plan=plan)
"""

from __future__ import annotations

import torch

from jagflash.core.capability import InvalidInput, Problem
from jagflash.core.checks import (
    check_dense_call,
    check_jagged_call,
    check_qkv,
    check_window,
    raise_if,
)
from jagflash.core.jagged import lse_by_sequence
from jagflash.core.jagged_call import op_lengths, op_plan, renest, unnest
from jagflash.core.ops import (
    call_problem,
    call_result,
    jagged_rows,
    op_tail,
    plan_maker,
    stepped_arange,
)
from jagflash.core.options import JaggedOptions, JaggedPlanOptions, Unpack, resolve, takes
from jagflash.core.plan.model import Plan
from jagflash.core.registry import Variant
from jagflash.variants.sliding_window import op
from jagflash.variants.sliding_window.spec import SPEC

__all__ = ["SPEC", "VARIANT", "make_plan", "sliding_window_attention"]

_WHO = "sliding_window_attention"


def _dense_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """A dense batch ``[B, N, H, D]`` as the jagged batch of B sequences of N rows the kernels
    walk: q, k, v as rows ``[B*N, H, D]`` (views where the strides allow) and their offsets."""
    b, nq, nk = q.shape[0], q.shape[1], k.shape[1]
    qo = stepped_arange(b + 1, nq, q.device, torch.int64, (q, k))
    ko = stepped_arange(b + 1, nk, q.device, torch.int64, (q, k))
    rows = (t.reshape(t.shape[0] * t.shape[1], *t.shape[2:]) for t in (q, k, v))
    return (*rows, qo, ko)


def _checked(reasons: list[str], check, *args, **kw) -> bool:
    """``check(_WHO, *args, **kw)`` (a ``jagflash.core.checks.check_*_call``: whether the call
    needs gradients), refusing with its reasons and ``reasons`` (the window's) together."""
    try:
        needs_grad = check(_WHO, *args, **kw)
    except InvalidInput as e:
        raise InvalidInput(_WHO, reasons + e.reasons) from None
    raise_if(_WHO, reasons)
    return needs_grad


def _dense_max(given: object, n: int, name: str) -> list[str]:
    if given is not None and not isinstance(given, bool) and hasattr(given, "__index__") and given < n:
        return [f"{name}={given} is below the dense length {n}"]
    return []


@takes(JaggedOptions, order="window causal scale max_seqlen_q max_seqlen_kv return_lse deterministic plan backend")
def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor | None = None,
    kv_offsets: torch.Tensor | None = None,
    *,
    window: tuple[int, int] = (-1, -1),
    **options: Unpack[JaggedOptions],
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of every query over a band of keys around its bottom-right diagonal.

    Query ``i`` of a sequence with Lq queries and Lk keys sees keys
    ``[i + Lk - Lq - left, i + Lk - Lq + right]`` (clipped to ``[0, Lk)``)::

        window=(2, 0), Lq=Lk=6      window=(1, 1), Lq=3, Lk=5      window=(0, 0), Lq=4, Lk=2
             keys 0 1 2 3 4 5            keys 0 1 2 3 4                 keys 0 1
        q0        x . . . . .       q0        . x x x .           q0        . .  <- no key
        q1        x x . . . .       q1        . . x x x           q1        . .  <- no key
        q2        x x x . . .       q2        . . . x x           q2        x .
        q3        . x x x . .                                     q3        . x
        q4        . . x x x .
        q5        . . . x x x

    A query that sees no key outputs 0 with LSE -inf and gets zero gradients. A window at
    least as wide as the sequences is full (or causal) attention, with the jagged variant's
    result; its cost is the band's: kv-blocks outside it are never visited.

    Args:
        q: ``[Tq, Hq, D]`` queries of all sequences back to back (with offsets), a nested
            tensor ``[B, j, Hq, D]`` with ``layout=torch.jagged`` (offsets then come from it;
            the output is nested too), or dense ``[B, Nq, Hq, D]`` when no offsets are given.
        k, v: ``[Tk, Hkv, D]`` (nested ``[B, j, Hkv, D]``; dense ``[B, Nk, Hkv, D]``),
            ``Hq % Hkv == 0`` (GQA/MQA: query head ``h`` reads kv head ``h // (Hq // Hkv)``).
        q_offsets, kv_offsets: ``[B+1]`` int32/int64, both or neither, as for
            ``jagflash.variants.jagged.jagged_attention``; zero-length sequences produce no
            rows; Lq != Lk is legal.
        window: ``(left, right)``, ints >= -1; -1 leaves that side unbounded, so ``(-1, -1)``
            is full attention and ``(-1, 0)`` causal.
        causal: ``right = 0`` (bottom-right aligned, like the jagged variant's); an explicit
            ``right > 0`` beside it is refused, ``right`` 0 or -1 is accepted.
        max_seqlen_q, max_seqlen_kv: upper bounds of the jagged lengths (given both, no host
            sync on a GPU); dense calls know them (a value below N is refused).
        return_lse: also return LSE, fp32, natural log, without gradient: ``[Hq, Tq]``
            (dense: ``[B, Hq, Nq]``).

    Returns:
        ``out`` in q's layout and dtype, and LSE if asked.

    Invalid inputs (a window that is not two ints >= -1, a bool among them, causal with
    ``right > 0``, wrong shapes or offsets) raise :class:`~jagflash.core.capability.InvalidInput`
    and problems no backend implements :class:`~jagflash.core.capability.UnsupportedProblem`,
    each listing every reason, before any kernel runs.
    """
    o = resolve(_WHO, JaggedOptions, options)
    causal, plan, max_seqlen_q, max_seqlen_kv = o["causal"], o["plan"], o["max_seqlen_q"], o["max_seqlen_kv"]
    reasons = check_window(window, causal)
    q, k, v, q_offsets, kv_offsets, nested_offsets = unnest(_WHO, q, k, v, q_offsets, kv_offsets)
    dense = q_offsets is None and kv_offsets is None
    if dense:
        if all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k)):
            reasons += _dense_max(max_seqlen_q, q.shape[1], "max_seqlen_q")
            reasons += _dense_max(max_seqlen_kv, k.shape[1], "max_seqlen_kv")
        needs_grad = _checked(reasons, check_dense_call, q, k, v, plan=plan)
        shape_q, batch = q.shape, q.shape[0]
        max_seqlen_q, max_seqlen_kv = q.shape[1], k.shape[1]
        q, k, v, q_offsets, kv_offsets = _dense_rows(q, k, v)
    else:
        if (q_offsets is None) != (kv_offsets is None):
            raise_if(_WHO, [*reasons, "pass both q_offsets and kv_offsets (jagged) or neither (dense)"])
        needs_grad = _checked(
            reasons, check_jagged_call, q, k, v, q_offsets, kv_offsets, max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv, plan=plan,
        )
    left, right = (int(x) for x in window)
    plan_args = op_plan(
        SPEC, plan, q, k, q_offsets, kv_offsets, causal=bool(causal), window=(left, right),
        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, backward=needs_grad, backend=o["backend"],
    )
    out, lse = op.call_fwd(
        q, k, v, q_offsets, kv_offsets, *op_lengths(max_seqlen_q, max_seqlen_kv), bool(causal), left, right,
        *op_tail(o, q), *plan_args,
    )
    if dense:
        out = out.view(shape_q)
        lse = lse_by_sequence(lse, batch) if o["return_lse"] else lse
    else:
        out = renest(out, nested_offsets)
    return call_result(out, lse, o)


@takes(
    JaggedPlanOptions,
    order="window causal schedule backward_schedule workers max_seqlen_q max_seqlen_kv backward backend",
)
def make_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    q_offsets: torch.Tensor | None = None,
    kv_offsets: torch.Tensor | None = None,
    *,
    window: tuple[int, int] = (-1, -1),
    **options: Unpack[JaggedPlanOptions],
) -> Plan:
    """The load-balancing :class:`~jagflash.core.plan.model.Plan` of a batch for
    :func:`sliding_window_attention` with this ``window`` and ``causal``: its tables hold every
    tile once, each costed by the blocks of its band (``jagflash.core.plan.cost``); no host sync.
    ``q`` ``[Tq, Hq, D]`` and ``k`` with offsets, or dense ``[B, N, H, D]`` without (only
    shapes and device are read); the default schedules are the ones measured for the window's
    mask."""
    return _make_plan(q, k, q_offsets, kv_offsets, options, window=window)


def _rows(q, k, q_offsets, kv_offsets, o: dict, *, window) -> tuple[list[str], dict]:
    """The rows a plan lays out: a jagged batch as it is, a dense one as B sequences of N rows."""
    reasons = check_window(window, o["causal"])
    if q_offsets is None and kv_offsets is None:
        reasons += check_qkv(q, k, k, rank=4, layout_doc="[B, N, H, D]")
        if reasons:
            return reasons, {}
        lengths = {"max_seqlen_q": q.shape[1], "max_seqlen_kv": k.shape[1]}
        q, k, _, q_offsets, kv_offsets = _dense_rows(q, k, k)
        lay = {"q": q, "k": k, "q_offsets": q_offsets, "kv_offsets": kv_offsets, "total_q": q.shape[0], **lengths}
    else:
        more, lay = jagged_rows(q, k, q_offsets, kv_offsets, o)
        reasons += more
    if reasons:
        return reasons, {}
    return [], {**lay, "causal": bool(o["causal"]), "window": (int(window[0]), int(window[1]))}


_make_plan = plan_maker(
    SPEC, layout="jagged", who="jagflash.variants.sliding_window.make_plan", options=JaggedPlanOptions, rows=_rows
)


def _problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **call: object) -> Problem:
    """The front door's problem: jagged with offsets (or nested tensors), else dense."""
    layout = "dense" if call.get("q_offsets") is None and not getattr(q, "is_nested", False) else "jagged"
    return call_problem(layout)(q, k, v, **call)


#: Below the jagged and dense variants (priority 0): a call without a window goes to them.
VARIANT = Variant(spec=SPEC, problem=_problem, run=sliding_window_attention, priority=-1)
