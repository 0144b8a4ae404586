"""jagflash.core.memo: keys on a tensor's storage and version counter, entries that die with
their tensors, a bounded LRU, and no memo where its values could be wrong (modes, inference
tensors)."""

from __future__ import annotations

import gc

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from jagflash.core.memo import TensorMemo, memo_allowed, storage_key


def test_a_key_follows_the_storage_and_the_version_counter() -> None:
    memo = TensorMemo(4)
    t = torch.arange(5, dtype=torch.int32)
    key = memo.key([t], "x")
    memo.put(key, [t], "value")
    assert memo.get(memo.key([t], "x")) == "value"
    assert memo.get(memo.key([t[:]], "x")) == "value"  # a view of the same elements: same values
    assert memo.get(memo.key([t], "y")) is None  # another extra
    assert memo.get(memo.key([t.clone()], "x")) is None  # other memory
    assert memo.get(memo.key([t[1:]], "x")) is None  # other elements of the same storage
    t[2] = 7  # an in-place write bumps the version counter (of every view)
    assert memo.key([t], "x") != key
    assert memo.get(memo.key([t], "x")) is None


def test_an_entry_dies_with_its_tensors() -> None:
    memo = TensorMemo(4)
    a, b = torch.arange(3), torch.arange(4)
    memo.put(memo.key([a, b], 0), [a, b], "value")
    assert len(memo) == 1
    del b
    gc.collect()
    assert len(memo) == 0  # its address may now be handed to another tensor


def test_the_memo_is_bounded_and_least_recently_used_goes_first() -> None:
    memo = TensorMemo(2)
    ts = [torch.arange(n + 1) for n in range(3)]
    for i in range(2):
        memo.put(memo.key([ts[i]], 0), [ts[i]], i)
    assert memo.get(memo.key([ts[0]], 0)) == 0  # 0 is now the latest used
    memo.put(memo.key([ts[2]], 0), [ts[2]], 2)
    assert len(memo) == 2
    assert memo.get(memo.key([ts[1]], 0)) is None
    assert memo.get(memo.key([ts[0]], 0)) == 0
    assert memo.get(memo.key([ts[2]], 0)) == 2


def test_no_memo_under_modes_or_for_inference_tensors() -> None:
    memo = TensorMemo(2)
    t = torch.arange(3)
    assert memo_allowed([t])
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(t)
        assert not memo_allowed([fake])
        assert memo.key([fake], 0) is None
    with torch.inference_mode():
        inf = torch.arange(3)
    assert storage_key(inf) is None
    assert memo.key([inf], 0) is None
    memo.put(None, [t], "ignored")
    assert len(memo) == 0
