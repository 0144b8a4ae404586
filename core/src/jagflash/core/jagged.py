"""Jagged tensors: offsets validation and every quantity the kernels derive from offsets.

A jagged tensor is ``values [T, ...]`` plus ``offsets [B+1]`` (int32 or int64, non-decreasing,
``offsets[0] == 0``, ``offsets[-1] == T``); sequence ``b`` is ``values[offsets[b]:offsets[b+1]]``.
Zero-length sequences are legal.

Tile ranges. A q-tile of ``block_m`` query rows starting at row ``m0`` of a sequence with ``lq``
queries and ``lk`` keys visits the kv-tiles ``[lo, hi)`` (steps of ``block_n``). Of those,
``[full_lo, full_hi)`` need no score mask: every (row, key) pair in them is visible and every key
index is in range. The kernels run ``[lo, full_lo)`` and ``[full_hi, hi)`` in a masked,
compile-time-specialised loop and ``[full_lo, full_hi)`` in an unmasked one. ``kv_tile_ranges``
here is the vectorised twin of ``jagflash.core.math.kv_tile_range``; the two are checked against
each other in the tests, and the schedules use this one for tile costs.

Masks are written as a window ``(left, right)`` relative to the bottom-right diagonal: query ``i``
sees key ``j`` iff ``i + d - left <= j <= i + d + right`` with ``d = lk - lq``; ``-1`` leaves a side
unbounded. Causal is ``right = 0``.
"""

from __future__ import annotations

import weakref

import torch

__all__ = [
    "check_offsets",
    "dkdv_q_ranges",
    "kv_tile_ranges",
    "lse_by_head",
    "lse_by_sequence",
    "mask_bounds",
    "max_seqlen",
    "offsets_from_lengths",
    "resolve_max_seqlen",
    "seq_lengths",
    "tile_starts",
    "to_jagged",
    "to_padded",
    "visible_pairs",
]


def mask_bounds(causal: bool, window: tuple[int, int] | None = None) -> tuple[int, int]:
    """``(left, right)`` bounds of the visible band; -1 is unbounded. Causal clips right to 0."""
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return int(left), int(right)


def check_offsets(
    offsets: object,
    total: int,
    name: str,
    device: torch.device,
    *,
    check_values: bool,
) -> tuple[list[str], int | None]:
    """Reasons ``offsets`` is not a valid offsets tensor for ``total`` rows, and its max length.

    Structure (type, rank, dtype, device) is always checked. Values (start at 0, non-decreasing,
    end at ``total``) are checked only with ``check_values``; on a GPU that costs one host
    synchronisation, which also yields the max sequence length (returned, else ``None``).
    """
    if not isinstance(offsets, torch.Tensor):
        return [f"{name} must be a torch.Tensor, got {type(offsets).__name__}"], None
    reasons = []
    if offsets.dim() != 1:
        reasons.append(f"{name} must be 1-D, got shape {tuple(offsets.shape)}")
    if offsets.dtype not in (torch.int32, torch.int64):
        reasons.append(f"{name} must be int32 or int64, got {offsets.dtype}")
    if offsets.device != device:
        reasons.append(f"{name} is on {offsets.device} but q is on {device}")
    if offsets.dim() == 1 and offsets.numel() < 1:
        reasons.append(f"{name} must have at least one element (B+1 with B >= 0)")
    if reasons or not check_values:
        return reasons, None
    o = offsets.to(torch.int64)
    if o.numel() == 1:
        first, last, min_step, max_step = int(o[0]), int(o[0]), 0, 0
    else:
        steps = o[1:] - o[:-1]
        first, last, min_step, max_step = torch.stack(
            [o[0], o[-1], steps.min(), steps.max()]
        ).tolist()
    if first != 0:
        reasons.append(f"{name}[0] must be 0, got {first}")
    if min_step < 0:
        reasons.append(f"{name} must be non-decreasing (a sequence has length {min_step})")
    if last != total:
        reasons.append(f"{name}[-1] must equal the number of rows {total}, got {last}")
    return reasons, (None if reasons else max(int(max_step), 0))


def offsets_from_lengths(
    lengths: list[int] | tuple[int, ...],
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.int32,
) -> torch.Tensor:
    """``[0, l0, l0+l1, ...]`` on ``device``."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    if len(lengths):
        out[1:] = torch.cumsum(torch.tensor(list(lengths), dtype=torch.int64), 0)
    return out.to(device=device, dtype=dtype)


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


# Offsets tensors whose values resolve_max_seqlen checked, by id(): (weak reference, data
# pointer, version counter, total rows, length bound, whether the bound is the longest length).
# The same tensor object at the same address and version holds the same values (an in-place
# write bumps the version counter, shared by every view), so a model's layers that pass one
# offsets tensor pay for its checks once (on a GPU: ~12 small kernels, or a host sync without
# max_seqlen) instead of every call.
_CHECKED: dict[int, tuple] = {}
_CHECKED_KEEP = 32


def _version_key(offsets: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, version counter), or ``None`` where there is none to trust (inference
    tensors keep no version counter; under torch.compile tracing nothing is remembered)."""
    if torch.compiler.is_compiling():
        return None
    try:
        return int(offsets.data_ptr()), int(offsets._version)
    except RuntimeError:
        return None


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


def seq_lengths(offsets: torch.Tensor) -> torch.Tensor:
    """Per-sequence lengths ``[B]`` as int64."""
    o = offsets.to(torch.int64)
    return o[1:] - o[:-1]


def max_seqlen(offsets: torch.Tensor) -> int:
    """Largest sequence length (a host synchronisation on a GPU)."""
    if offsets.numel() <= 1:
        return 0
    return int(seq_lengths(offsets).max())


def tile_starts(offsets: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Enumerate the tiles of ``block`` rows of every sequence, sequence-major.

    Returns ``(seq, start)`` int64 tensors: tile ``t`` covers rows ``start[t] ..
    start[t] + block - 1`` (clipped to the sequence) of sequence ``seq[t]``. Zero-length
    sequences have no tiles.
    """
    lengths = seq_lengths(offsets)
    counts = (lengths + block - 1) // block
    seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), counts)
    first = torch.cumsum(counts, 0) - counts
    start = (torch.arange(seq.numel(), device=offsets.device) - first[seq]) * block
    return seq, start


def _floor_to(x: torch.Tensor, block: int) -> torch.Tensor:
    return torch.div(x, block, rounding_mode="floor") * block


def _ceil_to(x: torch.Tensor, block: int) -> torch.Tensor:
    return -torch.div(-x, block, rounding_mode="floor") * block


def kv_tile_ranges(
    m0: torch.Tensor,
    lq: torch.Tensor,
    lk: torch.Tensor,
    block_m: int,
    block_n: int,
    left: int,
    right: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """kv-tile bounds ``(lo, full_lo, full_hi, hi)`` for q-tiles starting at ``m0``.

    Used by the forward and the dQ pass. ``hi`` is not tile-aligned (the last masked tile is
    clipped to it); the others are multiples of ``block_n``.
    """
    m0, lq, lk = (torch.as_tensor(x, dtype=torch.int64) for x in (m0, lq, lk))
    d = lk - lq
    zero = torch.zeros_like(d)
    hi_key = lk if right < 0 else torch.minimum(lk, m0 + block_m + d + right)
    lo_key = zero if left < 0 else torch.clamp(m0 + d - left, min=0)
    lo = _floor_to(lo_key, block_n)
    hi = torch.where(hi_key > lo_key, hi_key, lo)
    hi_full_key = lk if right < 0 else torch.clamp(torch.minimum(lk, m0 + d + right + 1), min=0)
    lo_full_key = zero if left < 0 else torch.clamp(m0 + block_m - 1 + d - left, min=0)
    full_lo = torch.minimum(torch.maximum(_ceil_to(lo_full_key, block_n), lo), hi)
    full_hi = torch.maximum(torch.minimum(_floor_to(hi_full_key, block_n), hi), full_lo)
    return lo, full_lo, full_hi, hi


def dkdv_q_ranges(
    n0: torch.Tensor,
    lq: torch.Tensor,
    lk: torch.Tensor,
    block_m: int,
    block_n: int,
    left: int,
    right: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q-tile bounds ``(lo, full_lo, full_hi, hi)`` for the kv-tiles starting at ``n0``.

    Used by the dK/dV pass; all four are multiples of ``block_m``. Rows past ``lq`` inside the
    last q-tile need no score mask there: the kernel loads their LSE as +inf, so they add zero.
    """
    n0, lq, lk = (torch.as_tensor(x, dtype=torch.int64) for x in (n0, lq, lk))
    d = lk - lq
    zero = torch.zeros_like(d)
    lo_row = zero if right < 0 else torch.clamp(n0 - d - right, min=0)
    hi_row = lq if left < 0 else torch.clamp(torch.minimum(lq, n0 + block_n - d + left), min=0)
    lo = _floor_to(lo_row, block_m)
    hi = torch.where(hi_row > lo_row, _ceil_to(hi_row, block_m), lo)
    lo_full_row = zero if right < 0 else torch.clamp(n0 + block_n - 1 - d - right, min=0)
    full_lo = torch.minimum(torch.maximum(_ceil_to(lo_full_row, block_m), lo), hi)
    if left < 0:
        full_hi = torch.maximum(hi, full_lo)
    else:
        hi_full_row = torch.clamp(n0 - d + left + 1, min=0)
        full_hi = torch.maximum(torch.minimum(_floor_to(hi_full_row, block_m), hi), full_lo)
    return lo, full_lo, full_hi, hi


def visible_pairs(lq: torch.Tensor, lk: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """Number of visible (query, key) pairs per sequence, exactly (int64, no materialised mask).

    Row ``i`` sees keys ``[max(0, i+d-left), min(lk-1, i+d+right)]``; the rows of all sequences
    are counted at once (O(sum lq) work and memory) and summed per sequence.
    """
    lq = torch.as_tensor(lq, dtype=torch.int64).reshape(-1)
    lk = torch.as_tensor(lk, dtype=torch.int64).reshape(-1).to(lq.device)
    seq = torch.repeat_interleave(torch.arange(lq.numel(), device=lq.device), lq)
    starts = torch.cumsum(lq, 0) - lq
    i = torch.arange(seq.numel(), device=lq.device) - starts[seq]  # row within its sequence
    k_len = lk[seq]
    d = k_len - lq[seq]
    hi = k_len - 1 if right < 0 else torch.minimum(k_len - 1, i + d + right)
    lo = torch.zeros_like(i) if left < 0 else torch.clamp(i + d - left, min=0)
    count = torch.clamp(hi - lo + 1, min=0)
    return torch.zeros_like(lq).index_add_(0, seq, count)


def to_padded(
    values: torch.Tensor, offsets: torch.Tensor, max_len: int, pad: float = 0.0
) -> torch.Tensor:
    """``values [T, ...]`` -> ``[B, max_len, ...]``, rows past each length filled with ``pad``."""
    lengths = seq_lengths(offsets)
    b = lengths.numel()
    out = values.new_full((b, max_len, *values.shape[1:]), pad)
    pos = torch.arange(max_len, device=values.device)
    valid = pos[None, :] < lengths[:, None]
    src = offsets[:-1].to(torch.int64)[:, None] + pos[None, :]
    out[valid] = values[src[valid]]
    return out


def to_jagged(padded: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``[B, N, ...]`` -> ``values [T, ...]`` keeping the first ``length_b`` rows of each batch."""
    lengths = seq_lengths(offsets)
    pos = torch.arange(padded.shape[1], device=padded.device)
    valid = pos[None, :] < lengths[:, None]
    return padded[valid]


def lse_by_sequence(lse: torch.Tensor, batch: int) -> torch.Tensor:
    """LSE ``[H, B*L]`` (the jagged layout) of ``batch`` sequences of one length L as
    ``[B, H, L]`` (the dense and broadcast-Q layout)."""
    heads, rows = lse.shape
    return lse.view(heads, batch, rows // batch if batch else 0).transpose(0, 1).contiguous()


def lse_by_head(lse: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`lse_by_sequence`: ``[B, H, L]`` as ``[H, B*L]`` (also for delta)."""
    batch, heads, length = lse.shape
    return lse.transpose(0, 1).reshape(heads, batch * length)
