"""Hypothesis strategies for jagged batches that hunt the odd inputs.

Lengths mix zero-length and 1-token sequences, lengths around tile boundaries (31, 32, 33, ...),
and a skewed batch with one long sequence among short ones. Sizes stay small: every tile
iteration costs milliseconds under the interpreter. The ``nightly`` profile draws more examples,
and ``max_len`` can be raised by the caller for GPU runs.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from jagflash.testing.inputs import JaggedCase

#: Lengths that sit on or next to the tile sizes the kernels use (16, 32, 64, 128).
EDGE_LENGTHS = (0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65)


def lengths(max_len: int = 80) -> st.SearchStrategy[int]:
    edges = [x for x in EDGE_LENGTHS if x <= max_len]
    return st.one_of(st.sampled_from(edges), st.integers(0, max_len))


@st.composite
def length_lists(draw, max_batch: int = 4, max_len: int = 80, min_batch: int = 1) -> list[int]:
    """A batch of lengths; sometimes skewed: one sequence near ``max_len``, the rest short."""
    b = draw(st.integers(min_batch, max_batch))
    if b > 1 and draw(st.booleans()):
        short = draw(st.lists(st.integers(0, max(1, max_len // 8)), min_size=b - 1, max_size=b - 1))
        long_at = draw(st.integers(0, b - 1))
        short.insert(long_at, draw(st.integers(max_len // 2, max_len)))
        return short
    return draw(st.lists(lengths(max_len), min_size=b, max_size=b))


@st.composite
def jagged_cases(
    draw,
    max_batch: int = 4,
    max_len: int = 80,
    head_dims: tuple[int, ...] = (16, 32, 64),
    dtypes: tuple[torch.dtype, ...] = (torch.float32,),
    groups: tuple[int, ...] = (1, 2, 4),
    cross: bool = True,
) -> JaggedCase:
    """A :class:`JaggedCase`: q and k lengths (equal, or drawn apart when ``cross``), GQA group,
    head dim, dtype, causal flag, offsets dtype, and a seed for fresh random values."""
    q_lens = draw(length_lists(max_batch=max_batch, max_len=max_len))
    if cross and draw(st.booleans()):
        k_lens = [draw(lengths(max_len)) for _ in q_lens]
    else:
        k_lens = list(q_lens)
    hkv = draw(st.sampled_from((1, 2)))
    return JaggedCase(
        q_lens=tuple(q_lens),
        k_lens=tuple(k_lens),
        hq=hkv * draw(st.sampled_from(groups)),
        hkv=hkv,
        head_dim=draw(st.sampled_from(head_dims)),
        dtype=draw(st.sampled_from(dtypes)),
        causal=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
        offsets_dtype=draw(st.sampled_from((torch.int32, torch.int64))),
    )
