"""Input validation of every variant: q/k/v, offsets, max lengths and plans.

Every refusal is :class:`~jagflash.core.capability.InvalidInput` listing *every* reason found
(a problem that is valid but that no backend implements is
:class:`~jagflash.core.capability.UnsupportedProblem`, from ``jagflash.core.backend``). Nothing
here uses ``assert`` for user input.

Two stages, both before any kernel runs:

- structure (types, ranks, dtypes, devices, shapes, heads, layouts, plans): host-known facts,
  checked by the public functions (:func:`check_jagged_call`, :func:`check_dense_call`,
  :func:`check_broadcast_q_call`) before a plan is built;
- values of the offsets (start 0, non-decreasing, end at T, lengths within ``max_seqlen_*``):
  checked inside the ops (:func:`resolve_max_seqlen`), at run time. On the CPU they are read
  directly; on a GPU with the max lengths given they are checked on the device by
  ``torch._assert_async`` (no host sync; a broken check fails the stream), and without them
  one sync reads them.

Memory: the ops never write their inputs and always allocate their outputs, so an output
never aliases an input, and q, k, v may share memory (views of one packed QKV tensor).
A q, k or v whose elements overlap each other (``expand``-ed, a stride 0 over a dimension of
size > 1) is copied before the kernels (:func:`readable`), as is one whose last dimension is
not contiguous (``jagflash.core.ops.for_kernel``); every other stride is taken as it is.
NaN and inf in q, k, v are not refused: they propagate as in
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import weakref

import torch

from jagflash.core.capability import InvalidInput
from jagflash.core.memo import storage_key

__all__ = [
    "INT32_MAX",
    "check_broadcast_q_call",
    "check_dense_call",
    "check_jagged_call",
    "check_max_seqlen",
    "check_offsets",
    "check_plan_arg",
    "check_qkv",
    "check_window",
    "raise_if",
    "readable",
    "resolve_max_seqlen",
    "same_batch",
]

#: The largest row index the kernels address: they load offsets as int32 (TMA coordinates are
#: 32-bit), so no offset, and no row count, may exceed it.
INT32_MAX = 2**31 - 1


def raise_if(who: str, reasons: list[str]) -> None:
    """Raise :class:`InvalidInput` naming ``who`` and every reason, if there is any."""
    if reasons:
        raise InvalidInput(who, reasons)


def check_qkv(q: object, k: object, v: object, *, rank: int, layout_doc: str) -> list[str]:
    """Every structural problem of q, k, v for a ``rank``-D layout ``layout_doc`` (e.g.
    ``"[T, H, D]"``): types, layouts, ranks, dtypes, devices, head dims, head counts (GQA
    ratio), matching k/v. The shape checks need every tensor to be of the right rank, so
    they are skipped (not guessed) while one is not."""
    if _qkv_valid(q, k, v, rank):  # every call's case, told without building a reason
        return []
    reasons: list[str] = []
    named = {"q": q, "k": k, "v": v}
    tensors = {n: t for n, t in named.items() if isinstance(t, torch.Tensor)}
    for name, t in named.items():
        if name not in tensors:
            reasons.append(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in tensors.items():
        if t.layout != torch.strided:
            reasons.append(f"{name} must be a strided (dense) tensor, got layout {t.layout}")
            continue
        if t.dim() != rank:
            reasons.append(f"{name} must be {rank}-D {layout_doc}, got shape {tuple(t.shape)}")
        if not t.dtype.is_floating_point:
            reasons.append(f"{name} must be a floating-point tensor, got {t.dtype}")
    if reasons:
        return reasons
    if not (q.dtype == k.dtype == v.dtype):
        reasons.append(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        reasons.append(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        reasons.append(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        reasons.append(f"head dims differ: q has {q.shape[-1]}, k has {k.shape[-1]}")
    if q.shape[-1] < 1:
        reasons.append("head dim must be at least 1, got 0")
    hq, hkv = q.shape[-2], k.shape[-2]
    if hq < 1:
        reasons.append("q must have at least one head, got Hq=0")
    if hkv == 0 or hq % hkv != 0:
        reasons.append(f"Hq ({hq}) must be a multiple of Hkv ({hkv})")
    return reasons


def _qkv_valid(q: object, k: object, v: object, rank: int) -> bool:
    """Whether :func:`check_qkv` would find nothing wrong (the same checks, without reasons)."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return False
    if not (q.layout == k.layout == v.layout == torch.strided and q.dim() == k.dim() == v.dim() == rank):
        return False
    if not (q.dtype == k.dtype == v.dtype and q.dtype.is_floating_point and q.device == k.device == v.device):
        return False
    hq, hkv = q.shape[-2], k.shape[-2]
    return k.shape == v.shape and q.shape[-1] == k.shape[-1] >= 1 and hq >= 1 and hkv >= 1 and hq % hkv == 0


def check_offsets(
    offsets: object,
    total: int,
    name: str,
    device: torch.device,
    *,
    check_values: bool,
) -> tuple[list[str], int | None]:
    """Reasons ``offsets`` is not a valid offsets tensor for ``total`` rows, and its max length.

    Structure (type, rank, dtype, device, requires_grad, a row count that int32 indexing
    reaches) is always checked. Values (start at 0, non-decreasing, end at ``total``, within
    int32) are checked only with ``check_values``; on a GPU that costs one host
    synchronisation, which also yields the max sequence length (returned, else ``None``).
    """
    if not isinstance(offsets, torch.Tensor):
        return [f"{name} must be a torch.Tensor, got {type(offsets).__name__}"], None
    reasons = []
    if offsets.layout != torch.strided:
        return [f"{name} must be a strided (dense) tensor, got layout {offsets.layout}"], None
    if offsets.dim() != 1:
        reasons.append(f"{name} must be 1-D, got shape {tuple(offsets.shape)}")
    if offsets.dtype not in (torch.int32, torch.int64):
        reasons.append(f"{name} must be int32 or int64, got {offsets.dtype}")
    if offsets.requires_grad:
        reasons.append(f"{name} must not require grad (offsets are indices, not data)")
    if offsets.device != device:
        reasons.append(f"{name} is on {offsets.device} but q is on {device}")
    if offsets.dim() == 1 and offsets.numel() < 1:
        reasons.append(f"{name} must have at least one element (B+1 with B >= 0)")
    if total > INT32_MAX:
        reasons.append(f"{name} indexes {total} rows, more than int32 indexing reaches ({INT32_MAX})")
    if reasons or not check_values:
        return reasons, None
    o = offsets.to(torch.int64)
    if o.numel() == 1:
        first, last, min_step, max_step, top = int(o[0]), int(o[0]), 0, 0, int(o[0])
    else:
        steps = o[1:] - o[:-1]
        first, last, min_step, max_step, top = torch.stack(
            [o[0], o[-1], steps.min(), steps.max(), o.abs().max()]
        ).tolist()
    if first != 0:
        reasons.append(f"{name}[0] must be 0, got {first}")
    if min_step < 0:
        reasons.append(f"{name} must be non-decreasing (a sequence has length {min_step})")
    if last != total:
        reasons.append(f"{name}[-1] must equal the number of rows {total}, got {last}")
    if top > INT32_MAX:
        reasons.append(f"{name} holds {top}, beyond int32 ({INT32_MAX}): the kernels index rows in int32")
    return reasons, (None if reasons else max(int(max_step), 0))


def check_max_seqlen(value: object, name: str) -> list[str]:
    """Reasons a ``max_seqlen_*`` argument (``None``: not given) is not a length."""
    if value is None:
        return []
    # int first: under torch.compile a symbolic int is an int, and hasattr on it does not trace.
    if isinstance(value, bool | float) or not (isinstance(value, int | torch.SymInt) or hasattr(value, "__index__")):
        return [f"{name} must be an int or None, got {type(value).__name__}"]
    if value < 0:
        return [f"{name} must be >= 0, got {value}"]
    return []


def check_window(window: object, causal: object) -> list[str]:
    """Every reason ``window`` is not a sliding window ``(left, right)`` for a call with
    ``causal``: a pair (tuple or list) of ints (``bool`` is not one), each >= -1 (-1:
    unbounded); ``causal=True`` means ``right = 0``, so an explicit ``right > 0`` beside it is
    refused (the two ask for different masks)."""
    if not isinstance(window, tuple | list) or len(window) != 2:
        return [f"window must be a pair (left, right) of ints, got {window!r}"]
    reasons = []
    for side, value in zip(("left", "right"), window):
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            reasons.append(f"window {side} must be an int, got {type(value).__name__} {value!r}")
        elif value < -1:
            reasons.append(f"window {side} must be >= -1 (-1: unbounded), got {value}")
    if not isinstance(causal, bool):
        reasons.append(f"causal must be a bool, got {type(causal).__name__}")
    elif causal and not reasons and window[1] > 0:
        reasons.append(
            f"causal=True means right = 0, but window right is {window[1]}: pass causal=False "
            "with the window, or right 0 or -1"
        )
    return reasons


def check_plan_arg(plan: object, needs_grad: bool) -> list[str]:
    """Reasons ``plan=`` is not a plan a call can use (what it was built for is checked by
    ``jagflash.core.plan.check.check_plan`` in the op)."""
    from jagflash.core.plan.model import Plan

    if plan is None:
        return []
    if not isinstance(plan, Plan):
        return [f"plan must be a jagflash.core.plan.model.Plan, got {type(plan).__name__}"]
    if needs_grad and not plan.info.backward:
        return ["the plan has no backward passes: build it with backward=True"]
    return []


def _needs_grad(*ts: object) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in ts)


def same_batch(q_offsets: torch.Tensor, kv_offsets: torch.Tensor) -> list[str]:
    """The reason two offsets tensors do not describe the same number of sequences, if so."""
    if q_offsets.shape != kv_offsets.shape:
        return [
            f"q_offsets and kv_offsets must both have B+1 entries, got {q_offsets.numel()} and "
            f"{kv_offsets.numel()}"
        ]
    return []


def check_jagged_call(
    who: str, q, k, v, q_offsets, kv_offsets, *, max_seqlen_q, max_seqlen_kv, plan
) -> bool:
    """Refuse (:class:`InvalidInput`, every reason) a jagged call whose structure is wrong;
    returns whether the call needs gradients. The offsets' values, and whether both describe
    the same B (:func:`same_batch`, reported with the values' problems), are the op's to
    check."""
    reasons = check_qkv(q, k, v, rank=3, layout_doc="[T, H, D]")
    shaped = not reasons
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    for name, offs, t in (("q_offsets", q_offsets, q), ("kv_offsets", kv_offsets, k)):
        total = t.shape[0] if shaped else 0
        reasons += check_offsets(offs, total, name, device, check_values=False)[0]
    reasons += check_max_seqlen(max_seqlen_q, "max_seqlen_q") + check_max_seqlen(max_seqlen_kv, "max_seqlen_kv")
    needs_grad = _needs_grad(q, k, v)
    reasons += check_plan_arg(plan, needs_grad)
    raise_if(who, reasons)
    return needs_grad


def check_dense_call(who: str, q, k, v, *, plan, plan_only: bool = False) -> bool:
    """Refuse a dense ``[B, N, H, D]`` call (or, ``plan_only``, a ``make_plan`` of one: k
    stands for v) whose structure is wrong; returns whether the call needs gradients."""
    reasons = check_qkv(q, k, v, rank=4, layout_doc="[B, N, H, D]")
    if not reasons and q.shape[0] != k.shape[0]:
        reasons.append(f"q and k batch sizes differ: {q.shape[0]} vs {k.shape[0]}")
    needs_grad = False if plan_only else _needs_grad(q, k, v)
    reasons += check_plan_arg(plan, needs_grad)
    raise_if(who, reasons)
    return needs_grad


def check_broadcast_q_call(who: str, q, k, v, kv_offsets, *, max_seqlen_kv, plan) -> bool:
    """Refuse a broadcast-Q call (q ``[Lq, Hq, D]``, k/v ``[Tk, Hkv, D]``) whose structure is
    wrong; returns whether the call needs gradients."""
    reasons = check_qkv(q, k, v, rank=3, layout_doc="[rows, H, D]")
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    total = k.shape[0] if not reasons else 0
    reasons += check_offsets(kv_offsets, total, "kv_offsets", device, check_values=False)[0]
    reasons += check_max_seqlen(max_seqlen_kv, "max_seqlen_kv")
    needs_grad = _needs_grad(q, k, v)
    reasons += check_plan_arg(plan, needs_grad)
    raise_if(who, reasons)
    return needs_grad


def readable(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy when its elements overlap each other (a stride 0 over a
    dimension of size > 1, as ``expand`` makes): the kernels' TMA descriptors and tile loads
    assume distinct rows. Read-only sharing between tensors (packed QKV) is kept as is."""
    if torch._debug_has_internal_overlap(t) == 1:
        return t.contiguous()
    return t


def resolve_max_seqlen(
    offsets: torch.Tensor, total: int, name: str, given: int, kind: str
) -> tuple[list[str], int]:
    """Check ``offsets``' values where that costs no extra host sync, and the max length.

    With ``given >= 0`` on a GPU nothing is read back: the checks (start 0, end ``total``,
    non-decreasing, no length above ``given``) run on the device and fail the stream if broken.
    Otherwise the values are read once (one sync on a GPU) and every problem is returned as a
    reason, with the max length (``given`` if set, else the longest sequence). ``kind`` names
    the argument in messages (``max_seqlen_<kind>``). Checks that passed are remembered for
    the same tensor at the same version (``_CHECKED``): calls that share an offsets tensor pay
    for them once."""
    known = _checked_bound(offsets, total)
    if known is not None:  # these very values passed before: no device work, no sync
        bound, exact = known
        if given >= bound:
            return [], given
        if exact:
            if given >= 0:
                return [f"max_seqlen_{kind}={given} is below the longest sequence ({bound})"], given
            return [], bound
    if offsets.device.type != "cpu" and given >= 0:
        if total > INT32_MAX:  # host-known; with the checks below it bounds every value
            return [f"{name} indexes {total} rows, more than int32 indexing reaches ({INT32_MAX})"], given
        o = offsets.to(torch.int64)
        steps = o[1:] - o[:-1]
        ok = (o[0] == 0) & (o[-1] == total)
        if steps.numel():
            ok = ok & (steps.min() >= 0) & (steps.max() <= given)
        torch._assert_async(ok, f"invalid {name} or max_seqlen_{kind} below a length")
        _remember_checked(offsets, total, given, exact=False)  # a failed check kills the stream
        return [], given
    reasons, longest = check_offsets(offsets, total, name, offsets.device, check_values=True)
    if longest is not None:
        _remember_checked(offsets, total, longest, exact=True)
    if longest is not None and 0 <= given < longest:
        reasons.append(f"max_seqlen_{kind}={given} is below the longest sequence ({longest})")
    return reasons, (given if given >= 0 else (longest or 0))


# Offsets tensors whose values resolve_max_seqlen checked, by id(): (weak reference, storage
# key with the version counter, total rows, length bound, whether the bound is the longest length).
# The same tensor object at the same address and version holds the same values (an in-place
# write bumps the version counter, shared by every view), so a model's layers that pass one
# offsets tensor pay for its checks once (on a GPU: ~12 small kernels, or a host sync without
# max_seqlen) instead of every call.
_CHECKED: dict[int, tuple] = {}
_CHECKED_KEEP = 32


def _version_key(offsets: torch.Tensor) -> tuple | None:
    """``jagflash.core.memo.storage_key`` (address, layout, version counter), or ``None``
    where there is none to trust (inference tensors keep no version counter; under
    torch.compile tracing nothing is remembered)."""
    if torch.compiler.is_compiling():
        return None
    return storage_key(offsets)


def _checked_bound(offsets: torch.Tensor, total: int) -> tuple[int, bool] | None:
    entry = _CHECKED.get(id(offsets))
    if entry is None:
        return None
    ref, key, tot, bound, exact = entry
    if ref() is not offsets or tot != total or key is None or _version_key(offsets) != key:
        return None
    return bound, exact


def _remember_checked(offsets: torch.Tensor, total: int, bound: int, *, exact: bool) -> None:
    key = _version_key(offsets)
    if key is None:
        return
    if len(_CHECKED) >= _CHECKED_KEEP:
        _CHECKED.clear()  # a new batch every call: forget them all rather than grow
    _CHECKED[id(offsets)] = (weakref.ref(offsets), key, total, bound, exact)
