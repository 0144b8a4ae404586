"""What a call may remember between calls about the tensors it was given, and when it may not.

A memo of this module is keyed on a tensor's storage (:func:`storage_key`: address, storage
offset, size, stride, dtype, device) and its version counter, which every in-place write
through torch bumps, on the tensor and on every view of it. An entry holds weak references to
the tensors it was made from and is dropped when one of them dies, so a key never outlives the
memory it names (the caching allocator could hand the same address to a new tensor).

No memo is used where a value it returns could be wrong or meaningless (:func:`memo_allowed`):
under ``torch.compile`` tracing, torch function or dispatch modes (FakeTensorMode,
FlopCounterMode), functorch transforms, tensor subclasses, during a CUDA graph capture (a tensor
made there holds its values only when the graph replays, and a capture must record the work
that a replay on new values redoes), and for inference tensors (no version counter).

What a version counter does not see, no memo sees: writes that bypass torch's in-place ops
(through ``.data``, a numpy view, a custom kernel writing the tensor's memory).
"""

from __future__ import annotations

import contextlib
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = ["TensorMemo", "capturing", "memo_allowed", "plain_eager", "storage_key"]


def plain_eager(args: tuple) -> bool:
    """Whether a call with ``args`` runs in plain eager mode: not traced by torch.compile, no
    torch function or dispatch mode (FakeTensorMode, FlopCounterMode, ``with torch.device``),
    no functorch transform, and no tensor subclass among the arguments."""
    if torch.compiler.is_compiling():
        return False
    if torch._C._is_torch_function_mode_enabled() or torch._C._are_functorch_transforms_active():
        return False
    if _get_current_dispatch_mode() is not None:
        return False
    # every call asks, over ~20 arguments: the exact-type test first (most are plain tensors or
    # not tensors at all), a loop rather than all() over a generator (0.9 against 1.6 us)
    for a in args:  # noqa: SIM110
        if type(a) is not torch.Tensor and isinstance(a, torch.Tensor):
            return False
    return True


def capturing(device: torch.device) -> bool:
    """Whether the current CUDA stream is capturing a graph (``False`` off CUDA devices)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def memo_allowed(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether a memo may be read or written for a call on ``tensors`` (module docstring)."""
    return plain_eager(tuple(tensors)) and not any(capturing(t.device) for t in tensors)


def storage_key(t: torch.Tensor) -> tuple | None:
    """``(address, storage offset, numel, stride, dtype, device, version)`` of ``t``, or
    ``None`` where it has no version counter (an inference tensor). Two live tensors with the
    same key read the same values, unless memory was written behind torch's back."""
    try:
        version = t._version
    except RuntimeError:  # inference tensors keep no version counter
        return None
    return (t.data_ptr(), t.storage_offset(), t.numel(), tuple(t.stride()), t.dtype, t.device, version)


class TensorMemo:
    """A bounded LRU memo of values made from tensors, keyed on their :func:`storage_key`
    and on a hashable ``extra`` (what else the value depends on). Holds the tensors weakly: an
    entry goes when one of its tensors dies."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[tuple, tuple[tuple[weakref.ref, ...], object]] = OrderedDict()

    def key(self, tensors: Sequence[torch.Tensor], extra: Hashable) -> tuple | None:
        """The key of a value made from ``tensors`` and ``extra``, or ``None`` where no memo may
        be used (:func:`memo_allowed`, :func:`storage_key`)."""
        if not memo_allowed(tensors):
            return None
        keys = tuple(storage_key(t) for t in tensors)
        if any(k is None for k in keys):
            return None
        return (keys, extra)

    def get(self, key: tuple | None) -> object | None:
        """The value remembered under ``key`` (marked as the latest used), or ``None``."""
        if key is None:
            return None
        entry = self._entries.get(key)
        if entry is None:
            return None
        refs, value = entry
        if any(r() is None for r in refs):  # its memory may since belong to another tensor
            self._entries.pop(key, None)
            return None
        with contextlib.suppress(KeyError):  # dropped meanwhile (a tensor died): still valid here
            self._entries.move_to_end(key)
        return value

    def put(self, key: tuple | None, tensors: Sequence[torch.Tensor], value: object) -> None:
        """Remember ``value`` under ``key`` (nothing for a ``None`` key), dropping the least
        recently used entry beyond ``size``."""
        if key is None:
            return
        entries = self._entries

        def forget(ref: weakref.ref, key: tuple = key) -> None:
            entry = entries.get(key)
            if entry is not None and any(r is ref for r in entry[0]):
                entries.pop(key, None)

        entries[key] = (tuple(weakref.ref(t, forget) for t in tensors), value)
        entries.move_to_end(key)
        while len(entries) > self.size:
            entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
