"""Jagged tensors: every quantity the kernels derive from offsets.

A jagged tensor is ``values [T, ...]`` plus ``offsets [B+1]`` (int32 or int64, non-decreasing,
``offsets[0] == 0``, ``offsets[-1] == T``); sequence ``b`` is ``values[offsets[b]:offsets[b+1]]``.
Zero-length sequences are legal. Validating offsets is ``jagflash.core.checks``'s.

Which keys a query sees, and the tile ranges that follow from it, are ``jagflash.core.mask``'s.
"""

from __future__ import annotations

import torch

__all__ = [
    "cdiv",
    "lse_by_head",
    "lse_by_sequence",
    "max_seqlen",
    "next_pow2",
    "offsets_from_lengths",
    "seq_lengths",
    "slots_of",
    "tile_starts",
    "to_jagged",
    "to_padded",
]


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` of host ints (tile and program counts). ``triton.cdiv`` gives the same,
    but as a Triton constexpr function it costs ~3 us a host call (it imports and unwraps its
    arguments every time), several times per attention call."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The least power of two ``>= n``, for a host int ``n >= 1`` (block sizes):
    ``triton.next_power_of_2``'s answer without its constexpr wrapper's ~3 us a call."""
    return 1 << (n - 1).bit_length()


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


def slots_of(counts: torch.Tensor, slots: int, first: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lay ``counts[b]`` items of every sequence ``b`` out sequence-major in slots (host ints:
    ``first + slots`` need not reach ``counts.sum()``, slots past it are invalid), on the device
    and without a host sync; returns slots ``first .. first + slots - 1``.

    Returns ``(seq, item, valid)`` int64, int64, bool ``[slots]``: slot ``t`` holds item
    ``item[t]`` (``0 <= item < counts[seq]``) of sequence ``seq[t]`` where ``valid[t]``; slots
    past ``counts.sum()`` are invalid, with ``seq`` the last sequence and ``item`` 0.
    """
    batch = counts.numel()
    last = torch.cumsum(counts.to(torch.int64), 0)
    slot = torch.arange(first, first + slots, device=counts.device)
    seq = torch.searchsorted(last, slot, right=True)
    valid = seq < batch
    seq = seq.clamp(max=max(batch - 1, 0))
    item = torch.where(valid, slot - (last - counts)[seq] if batch else slot, 0)
    return seq, item, valid


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
