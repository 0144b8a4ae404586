"""The skeleton of the kernel :mod:`jagflash.core.mask_mod_codegen` generates for a traced
``mask_mod``: :data:`LANES` (the lanes helper, which decides every block along a list at once
from the bounds' statements, and the kernel's head up to the pairs of one open block) and
:data:`STORE` (the end of the open blocks' loop, the compaction and the stores of the lists).
Formatted with the generator's pieces: ``args`` / ``names`` (the tensors the mask_mod reads),
``pre`` (the parameters' loads), ``lanes`` (the bounds), ``every`` / ``some`` (the result's
bounds), ``evals`` / ``stores`` (heads evaluated, and lists stored per evaluation), ``idx``.
"""

from __future__ import annotations

__all__ = ["LANES", "STORE"]

LANES = '''
@triton.jit
def mask_mod_lanes(_P, {args}fixed, lq, lk, b_val, h_val, along, BM: tl.constexpr, BN: tl.constexpr,
                   NW: tl.constexpr, BY_ROW: tl.constexpr):
    """Every block along a list at once, a lane each: which the bounds list, and which they
    leave open (pairs to evaluate). ``BY_ROW``: the list of q-block ``fixed`` (a lane per
    kv-block), else of kv-block ``fixed``; the fixed side's positions are one value for every
    lane, and so is a read that follows them alone."""
    _T = tl.full([], 1, tl.int1)
    _F = tl.full([], 0, tl.int1)
    _Z = tl.full([], 0, tl.int64)
    _ZL = tl.zeros([NW], tl.int64)
    _Z1 = tl.zeros([1], tl.int64)
    _IN1 = tl.full([1], 1, tl.int1)
{pre}    o = tl.arange(0, NW)
    if BY_ROW:
        qb = fixed
        kb = o
    else:
        qb = o
        kb = fixed
    q0 = qb * BM + _Z
    q_last = tl.minimum(q0 + BM, lq) - 1
    k0 = kb * BN + _Z
    k_last = tl.minimum(k0 + BN, lk) - 1
    inside = o < along
{lanes}    unsure = inside & ({some}) & (({every}) == 0)
    return inside & ({every}), unsure


@triton.jit(do_not_specialize=["nq", "nk", "n_rows"],
            do_not_specialize_on_alignment=["kv_counts", "kv_indices", "q_counts", "q_indices", "qo", "ko", "_P", {names}])
def mask_mod_build(kv_counts, kv_indices, q_counts, q_indices, qo, ko, nq, nk, _P, {args}n_rows, HEADS: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, B_ZERO: tl.constexpr, NW: tl.constexpr):
    """Program ``pid < n_rows``: the kv list of q-block row ``pid`` (sequence-major), for every
    head; the others: the q list of kv-block column ``pid - n_rows``. Every block along the
    list is decided at once from its bounds (:func:`mask_mod_lanes`); those left open one by
    one, from their in-range pairs."""
    _T = tl.full([], 1, tl.int1)
    _F = tl.full([], 0, tl.int1)
    _Z = tl.full([], 0, tl.int64)
{pre}    pid = tl.program_id(0)
    by_row = pid < n_rows
    by_col = pid >= n_rows
    col = pid - n_rows
    seq = tl.where(by_row, pid // nq, col // nk)
    fixed = tl.where(by_row, pid % nq, col % nk)  # the row's q-block or the column's kv-block
    b_val = seq + _Z
    if B_ZERO:
        b_val = _Z
    lq = _length(qo, seq)
    lk = _length(ko, seq)
    nq_b = tl.minimum((lq + BM - 1) // BM, nq).to(tl.int32)  # the sequence's own blocks (inside the grid)
    nk_b = tl.minimum((lk + BN - 1) // BN, nk).to(tl.int32)
    along = tl.where(fixed < tl.where(by_row, nq_b, nk_b), tl.where(by_row, nk_b, nq_b), 0)  # the blocks to decide
    width = tl.where(by_row, nk, nq)
    first = tl.where(by_row, (seq * HEADS * nq + fixed) * nk, (seq * HEADS * nk + fixed) * nq).to(tl.int64)  # head 0's list
    counted = tl.where(by_row, seq * HEADS * nq + fixed, seq * HEADS * nk + fixed).to(tl.int64)  # head 0's count
    count_step = tl.where(by_row, nq, nk)
    lanes = tl.arange(0, NW)
    for hh in tl.static_range({evals}):
        h_val = _Z + hh
        listed = lanes < 0
        unsure = listed
        if along > 0:  # a padded program (past its sequence's blocks) decides nothing, reads nothing
            if by_row:
                listed, unsure = mask_mod_lanes(_P, {args}fixed, lq, lk, b_val, h_val, along, BM, BN, NW, True)
            else:
                listed, unsure = mask_mod_lanes(_P, {args}fixed, lq, lk, b_val, h_val, along, BM, BN, NW, False)
        place = tl.cumsum(unsure.to(tl.int32), 0) - 1
        for i in range(0, tl.sum(unsure.to(tl.int32))):
            o = tl.sum(tl.where(unsure & (place == i), lanes, 0))
            qb = tl.where(by_row, fixed, o)
            kb = tl.where(by_row, o, fixed)
            rows = qb * BM + _Z + tl.arange(0, BM)[:, None]
            q_idx = rows.to({idx})
            cols = kb * BN + _Z + tl.arange(0, BN)[None, :]
            kv_idx = cols.to({idx})
            _live = (rows < lq) & (cols < lk)
            b = b_val.to({idx})
            h = h_val.to({idx})
'''
STORE = '''
            listed = listed | ((lanes == o) & (hit != 0))
        ones = listed.to(tl.int32)
        count = tl.sum(ones)
        slot = tl.cumsum(ones, 0) - 1
        rest = (lanes >= count) & (lanes < width)
        for hs in tl.static_range({stores}):
            at = first + (hh + hs) * nq * nk
            tl.store(kv_indices + at + slot, lanes, mask=by_row & listed)
            tl.store(q_indices + at + slot, lanes, mask=by_col & listed)
            tl.store(kv_indices + at + lanes, 0, mask=by_row & rest)
            tl.store(q_indices + at + lanes, 0, mask=by_col & rest)
            at = counted + (hh + hs) * count_step
            tl.store(kv_counts + at, count, mask=by_row)
            tl.store(q_counts + at, count, mask=by_col)
'''
