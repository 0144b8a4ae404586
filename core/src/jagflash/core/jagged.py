"""Jagged tensors: offsets validation and every quantity the kernels derive from offsets.

A jagged tensor is ``values [T, ...]`` plus ``offsets [B+1]`` (int32 or int64, non-decreasing,
``offsets[0] == 0``, ``offsets[-1] == T``); sequence ``b`` is ``values[offsets[b]:offsets[b+1]]``.
Zero-length sequences are legal.

Which keys a query sees, and the tile ranges that follow from it, are ``jagflash.core.mask``'s.
"""

from __future__ import annotations

import weakref

import torch

__all__ = [
    "check_offsets",
    "lse_by_head",
    "lse_by_sequence",
    "max_seqlen",
    "offsets_from_lengths",
    "resolve_max_seqlen",
    "seq_lengths",
    "tile_starts",
    "to_jagged",
    "to_padded",
]


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
