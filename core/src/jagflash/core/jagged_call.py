"""What every variant on the jagged layout (``values [T, H, D]`` + ``offsets [B+1]`` per side)
shares between its public function and its ops: nested tensors in and out (:func:`unnest`), the
plan a call builds for itself (:func:`own_plan`), and the ops' jagged semantics
(:func:`jagged_ops`: the offsets' value checks, the plan check, the reference and kernel tables).

A variant on this layout is then its spec, its public function's arguments and its mask: the
jagged variant (causal or not) and the sliding-window variant (``int left, int right`` in its
ops' schema) register their ops here under their own names.
"""

from __future__ import annotations

import torch

from jagflash.core.backend import plan_backend, record_path
from jagflash.core.block_mask import BlockMask, mask_features
from jagflash.core.block_tiles import plan_grid
from jagflash.core.checks import raise_if, resolve_max_seqlen, same_batch
from jagflash.core.memo import TensorMemo
from jagflash.core.ops import attention_ops, call_plan_layout, make_problem
from jagflash.core.plan.build import build_plan
from jagflash.core.plan.model import PTR_SAME_CALL, plan_info
from jagflash.core.reference import reference_backward, reference_forward
from jagflash.core.tuning import use_decode

__all__ = ["DECODE_ARG", "JAGGED_ARGS", "PLAN_MEMO", "SPARSE_ARGS", "WINDOW_ARGS", "jagged_ops", "op_lengths", "op_plan", "own_plan", "renest", "unnest"]

#: The schema of the jagged ops' own arguments (``jagflash.core.ops.attention_ops``' ``args``).
JAGGED_ARGS = "Tensor q_offsets, Tensor kv_offsets, SymInt max_seqlen_q, SymInt max_seqlen_kv, bool causal"
#: What a windowed variant's ops add to :data:`JAGGED_ARGS`: the band's bounds, -1 unbounded.
WINDOW_ARGS = "int left, int right"
#: What a block-sparse variant's ops add after :data:`WINDOW_ARGS`: a
#: ``jagflash.core.block_mask.BlockMask``'s lists and block size.
SPARSE_ARGS = "Tensor kv_counts, Tensor kv_indices, Tensor q_counts, Tensor q_indices, int block_m, int block_n"
#: The last argument of the ops of a jagged variant without a block mask, after the shared tail:
#: the forward's path (``None``: ``jagflash.core.tuning.use_decode``'s rule; ``True``: the decode
#: kernel, ``jagflash.core.portable.decode``; ``False``: the tile kernels).
DECODE_ARG = "bool? decode=None"


def _values(who: str, name: str, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if t.layout != torch.jagged:
        raise_if(who, [f"{name} is a nested tensor of layout {t.layout}; use layout=torch.jagged"])
    if t.dim() != 4 or t._ragged_idx != 1:  # type: ignore[attr-defined]
        raise_if(
            who,
            [f"{name} must be a nested tensor [B, j, H, D] ragged in dim 1, got {t.dim()}-D ragged in dim {t._ragged_idx}"],  # type: ignore[attr-defined]
        )
    return t.values(), t.offsets()


def unnest(who: str, q, k, v, q_offsets, kv_offsets):
    """``(q, k, v, q_offsets, kv_offsets, nested_offsets)``: the arguments as they are when q is
    not a nested tensor (``nested_offsets`` None), else the values ``[T, H, D]`` and offsets of
    nested tensors ``[B, j, H, D]`` with ``layout=torch.jagged`` (``nested_offsets``: q's, for
    :func:`renest`). Refuses (``InvalidInput``) offsets passed beside nested tensors, a mix of
    nested and plain tensors, other layouts or raggedness, and k, v of different offsets."""
    if not (isinstance(q, torch.Tensor) and q.is_nested):
        return q, k, v, q_offsets, kv_offsets, None
    if q_offsets is not None or kv_offsets is not None:
        raise_if(who, ["pass offsets only with plain tensors, not nested ones"])
    parts = []
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not (isinstance(t, torch.Tensor) and t.is_nested):
            raise_if(who, [f"q is nested but {name} is not"])
        parts.append(_values(who, name, t))
    (q, q_offsets), (k, kv_offsets), (v, v_offsets) = parts
    if v_offsets is not kv_offsets and not torch.equal(v_offsets, kv_offsets):
        raise_if(who, ["k and v are nested with different offsets"])
    return q, k, v, q_offsets, kv_offsets, q_offsets


def renest(out: torch.Tensor, nested_offsets: torch.Tensor | None) -> torch.Tensor:
    """``out`` ``[Tq, Hq, D]`` as a nested tensor on ``nested_offsets`` (:func:`unnest`'s), or as
    it is where the call's q was not nested."""
    if nested_offsets is None:
        return out
    return torch.nested.nested_tensor_from_jagged(out, offsets=nested_offsets)


#: Plans calls without ``plan=`` built for themselves, by offsets (storage and version: an
#: in-place write to the offsets makes the next call build a fresh one) and plan ints: a
#: model's layers that share one offsets tensor build its plan once. A few batches' worth.
PLAN_MEMO = TensorMemo(8)


def own_plan(
    spec, q, k, q_offsets, kv_offsets, *, causal: bool, window: tuple[int, int], max_seqlen_q,
    max_seqlen_kv, backward: bool, backend: str | None, block_mask=None, planned: str | None = None,
):
    """The plan ``(tiles, meta, info ints)`` a call without ``plan=`` builds for itself: ints on
    the host, tensors by one opaque op, laid out for the backend the call will pick (with the
    schedules measured for its mask; with a ``block_mask``, tiles of its blocks costed by its
    listed blocks). The same offsets (same storage, same version counter; and the same block
    lists) with the same ints get the tensors built before (:data:`PLAN_MEMO`; never while
    traced, under a mode or during a CUDA graph capture: ``jagflash.core.memo``); nothing writes
    them. Traced by ``torch.compile`` (which cannot follow the backend choice), none: the
    forward and backward ops each build their own. ``planned``: the backend the plan is for
    (``jagflash.core.backend.plan_backend``'s), where the caller has already asked."""
    if torch.compiler.is_compiling():
        return None, None, None
    blocks, schedule, backward_schedule = call_plan_layout(
        spec, "jagged", q, k, causal=causal, backend=backend, window=window, block_mask=block_mask, planned=planned,
        batch=q_offsets.numel() - 1,
    )
    ints = plan_info(
        batch=q_offsets.numel() - 1, total_q=q.shape[0], total_kv=k.shape[0],
        heads_q=q.shape[1], heads_kv=k.shape[1], causal=causal, window=window, blocks=blocks,
        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, schedule=schedule,
        backward_schedule=backward_schedule, backward=backward, q_ptr=PTR_SAME_CALL, kv_ptr=PTR_SAME_CALL,
    ).to_ints()
    offsets = (q_offsets, kv_offsets)
    if block_mask is not None:  # the plan costs its tiles by the listed blocks
        offsets += (block_mask.kv_counts, block_mask.kv_indices)
    # tensors made in inference mode are inference tensors, which autograd may not save
    key = PLAN_MEMO.key(offsets, (tuple(ints), torch.is_inference_mode_enabled()))
    hit = PLAN_MEMO.get(key)
    if hit is not None:
        return (*hit, ints)
    tiles, meta = build_plan(q_offsets, kv_offsets, ints, plan_grid(block_mask, blocks["fwd"]))
    PLAN_MEMO.put(key, offsets, (tiles, meta))
    return tiles, meta, ints


def op_plan(
    spec, plan, q, k, q_offsets, kv_offsets, *, causal: bool, window: tuple[int, int], max_seqlen_q,
    max_seqlen_kv, backward: bool, backend: str | None, block_mask=None, decode: bool | None = None,
):
    """The ``plan_tiles, plan_meta, plan_info`` a public function passes its op: those of the
    ``plan=`` it was given, none where no plan is needed (``backend="reference"``; a forward
    that will take the decode path, both ways, known from ``max_seqlen_q``: ``decode``
    as the op gets it, :data:`DECODE_ARG`) or the op will refuse the offsets (different batch
    sizes), else :func:`own_plan`'s."""
    if plan is not None:
        return plan.op_args()
    if backend == "reference" or q_offsets.shape != kv_offsets.shape or torch.compiler.is_compiling():
        return None, None, None  # traced: the ops build their own (own_plan)
    name = None  # the look-ahead's backend, which the plan is laid out for (asked once)
    if max_seqlen_q is not None and decode is not False and block_mask is None:
        name = plan_backend(spec, make_problem("jagged", q, k, causal=causal, window=window), q.device, backend)
        if name != "reference" and use_decode(
            name, max_seqlen_q=int(max_seqlen_q), group=q.shape[1] // max(k.shape[1], 1), head_dim=q.shape[-1],
            requested=decode,
        )[0]:
            return None, None, None
    return own_plan(
        spec, q, k, q_offsets, kv_offsets, causal=causal, window=window, max_seqlen_q=max_seqlen_q,
        max_seqlen_kv=max_seqlen_kv, backward=backward, backend=backend, block_mask=block_mask, planned=name,
    )


def op_lengths(max_seqlen_q, max_seqlen_kv) -> tuple[int, int]:
    """``max_seqlen_q, max_seqlen_kv`` as the ops take them: ints, -1 for "not given"."""
    return tuple(-1 if m is None else int(m) for m in (max_seqlen_q, max_seqlen_kv))  # type: ignore[return-value]


def _lengths(who, q_offsets, kv_offsets, tq, tk, max_seqlen_q, max_seqlen_kv) -> tuple[int, int]:
    """Validate the offsets' values where that costs no extra sync, and fill in unknown maxima."""
    reasons = same_batch(q_offsets, kv_offsets)
    rq, max_q = resolve_max_seqlen(q_offsets, tq, "q_offsets", max_seqlen_q, "q")
    if kv_offsets is q_offsets and (tk, max_seqlen_kv) == (tq, max_seqlen_q) and not rq:
        return max_q, max_q  # self-attention: the same question about the same tensor, answered
    rk, max_k = resolve_max_seqlen(kv_offsets, tk, "kv_offsets", max_seqlen_kv, "kv")
    raise_if(who, reasons + rq + rk)
    return max_q, max_k


def jagged_ops(name: str, spec, package: str, who: str, *, windowed: bool = False, sparse: bool = False):
    """Register a jagged-layout variant's ops ``jagflash::<name>_fwd`` / ``<name>_bwd``
    (``jagflash.core.ops.attention_ops``, layout ``jagged``) and return ``(fwd_op, bwd_op,
    call_fwd)``. Their own arguments are :data:`JAGGED_ARGS` (``max_seqlen_* = -1``: not given,
    read from the offsets: one host synchronisation on a GPU, which also validates the
    offsets' values), followed by :data:`WINDOW_ARGS` where ``windowed`` and then
    :data:`SPARSE_ARGS` where ``sparse`` (a block mask: its problems pose the features of
    ``jagflash.core.block_mask.mask_features``, its kernels get the ``jagflash.core.block_mask.BlockMask`` as ``blocks=``,
    its plans tile by its blocks). The kernels are the variant's ``kernels_portable`` /
    ``kernels_tlx_sm90`` (``package``), called with the jagged tensors as they are; ``who``
    names the public function in refusals. Without ``sparse`` the ops end with
    :data:`DECODE_ARG`: their forward and backward on the ``tlx-sm90`` and ``portable``
    backends run the decode kernels where ``jagflash.core.tuning.use_decode`` says so (the
    choice shows in ``last_choice(...).explain()``: "forward path" / "backward path"; the
    backward at the out and LSE it is given, whichever forward made them). The reference
    backend ignores ``decode``."""

    def check(c) -> None:
        # Invalid offsets are the caller's error whatever backend would run: check them first.
        c.max_q, c.max_k = _lengths(
            who, c.q_offsets, c.kv_offsets, c.q.shape[0], c.k.shape[0], c.max_seqlen_q, c.max_seqlen_kv
        )
        c.blocks = None
        if sparse:
            c.blocks = BlockMask(
                c.kv_counts, c.kv_indices, c.q_counts, c.q_indices, c.q_offsets, c.kv_offsets, (c.block_m, c.block_n)
            )

    def plan(c, passes):
        return c.plan(
            who, passes, q_offsets=c.q_offsets, kv_offsets=c.kv_offsets, check_offsets=True,
            total_q=c.q.shape[0], total_kv=c.k.shape[0], max_seqlen_q=c.max_q, max_seqlen_kv=c.max_k,
            block_mask=c.blocks,
        )

    def listed(c) -> dict[str, object]:
        return {"blocks": c.blocks} if sparse else {}

    def path(tiles, direction="forward"):
        """The ``tiles`` kernels of a pass, or the decode kernels where ``use_decode`` says so
        (the same rule both ways; the choice added to ``last_choice``); a ``plan=`` is checked
        either way."""
        if sparse:
            return tiles

        def run(c):
            take, why = use_decode(
                c.ran, max_seqlen_q=c.max_q, group=c.q.shape[1] // c.k.shape[1], head_dim=c.q.shape[-1],
                requested=c.decode,
            )
            record_path(spec.name, "decode" if take else "tiles", why, direction)
            if not take:
                return tiles(c)
            if c.plan_tiles is not None:
                plan(c, ("fwd",) if direction == "forward" else ("dq", "dkdv"))
            from jagflash.core.portable import decode

            kw = dict(
                max_seqlen_q=c.max_q, max_seqlen_kv=c.max_k, **c.mask,
                backend="interpreter" if c.ran == "interpreter" else "portable",
            )
            if direction == "forward":
                return decode.forward(c.q, c.k, c.v, c.q_offsets, c.kv_offsets, **kw)
            return decode.backward(c.dout, c.q, c.k, c.v, c.out, c.lse, c.q_offsets, c.kv_offsets, **kw)

        return run

    def reference(fn, *grad):
        return lambda c, **given: fn(
            *(getattr(c, n) for n in grad), c.q, c.k, c.v, c.q_offsets, c.kv_offsets, causal=c.causal,
            window=(c.left, c.right), scale=c.scale, **({"block_mask": c.blocks} if sparse else {}), **given,
        )

    forward = {
        "reference": reference(reference_forward),
        "tlx-sm90": path(lambda c: c.kernels.forward(
            c.q, c.k, c.v, c.q_offsets, c.kv_offsets, c.max_q, **c.mask, plan=plan(c, ("fwd",)), **listed(c)
        )),
        "portable": path(lambda c: c.kernels.forward(
            c.q, c.k, c.v, c.q_offsets, c.kv_offsets, plan(c, ("fwd",)), **c.mask, backend=c.ran, **listed(c)
        )),
    }
    backward = {
        # at the out/LSE the op is given (those of a larger attention, merged: context parallelism)
        "reference": lambda c: reference(reference_backward, "dout")(c, out=c.out, lse=c.lse),
        "tlx-sm90": path(lambda c: c.kernels.backward(
            c.dout, c.q, c.k, c.v, c.out, c.lse, c.q_offsets, c.kv_offsets, plan(c, ("dq", "dkdv")),
            **c.mask, deterministic=c.deterministic, **listed(c),
        ), "backward"),
        # Always deterministic (no atomics), as the decode backward: ``deterministic`` asks
        # nothing more of them.
        "portable": path(lambda c: c.kernels.backward(
            c.dout, c.q, c.k, c.v, c.out, c.lse, c.q_offsets, c.kv_offsets, plan(c, ("dq", "dkdv")),
            **c.mask, backend=c.ran, **listed(c),
        ), "backward"),
    }
    args = JAGGED_ARGS + (", " + WINDOW_ARGS if windowed or sparse else "") + (", " + SPARSE_ARGS if sparse else "")
    return attention_ops(
        name, spec, package, args, check=check,
        forward=forward, backward=backward, layout="jagged",
        fake_forward=lambda c: (torch.empty_like(c.q), c.q.new_empty((c.q.shape[1], c.q.shape[0]), dtype=torch.float32)),
        fake_backward=lambda c: (torch.empty_like(c.q), torch.empty_like(c.k), torch.empty_like(c.v)),
        features=(lambda c: mask_features((c.block_m, c.block_n))) if sparse else frozenset(),
        tail="" if sparse else DECODE_ARG,
    )
