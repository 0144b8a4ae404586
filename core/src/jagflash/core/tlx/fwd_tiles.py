"""The TLX forward's tiles (``jagflash.core.tlx.fwd_sm90``): the tile ring through which, with
``RING_TILES``, the producer alone walks the Plan's table and hands each decoded q-tile to the
consumers (:func:`publish_tile`, :func:`tile_record`), with ``SOLO`` each half's own walk
(:func:`half_walk`, :func:`half_blocks`), and the producer's K/V loads (:func:`load_kv_blocks`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from jagflash.core.mask import block_at, block_walk, kv_tile_range, tile_list
from jagflash.core.seqlen import fwd_tile, store_zero_rows
from jagflash.core.tlx.pipeline import (
    record_publish,
    record_read,
    record_take,
    record_wait,
    ring_load,
    walk_next,
)

# The fields of a decoded forward tile in the tile ring (``RING_TILES``): state (1 live, 0 none
# to compute, -1 the walk's end), head, first row, q start, lq, kv start, lk; with ``SPARSE``
# also the sequence and the positions ``block_walk`` gives the tile's list row.
TILE_FIELDS = tl.constexpr(7)
SPARSE_TILE_FIELDS = tl.constexpr(12)
#: With ``SOLO`` and ``SPARSE``: the sequence, then the walk positions of each of the tile's two
#: halves (:func:`half_walk`), four each.
SOLO_SPARSE_FIELDS = tl.constexpr(16)


@triton.jit
def store_no_keys(O, LSE, q_start, m0, lq, h, stride_ot, stride_oh, stride_lh, stride_ls,
                  ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr):
    """O 0 and LSE -inf on the rows ``[m0, m0 + ROWS)`` of a sequence (those under ``lq``): the
    output of rows that see no key, written in the producer's registers."""
    store_zero_rows(O + h * stride_oh, q_start, m0, lq, stride_ot, ROWS, HEAD_DIM, DTYPE)
    rows = m0 + tl.arange(0, ROWS)
    tl.store(LSE + (h * stride_lh + q_start * stride_ls + rows), tl.full([ROWS], float("-inf"), tl.float32), mask=rows < lq)


@triton.jit
def publish_tile(ring, counter, i, count, TILES, q_offsets, kv_offsets, heads, lists, left, right,
                 O, LSE, stride_ot, stride_oh, stride_lh, stride_ls,
                 HEAD_MAJOR: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, SPARSE: tl.constexpr,
                 ZERO_EMPTY: tl.constexpr, HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr, RECS: tl.constexpr,
                 SOLO: tl.constexpr = False):
    """Producer side of the forward's tile ring (RECS records deep): decode the tile at table index ``i`` and publish
    it as record ``counter`` (:data:`TILE_FIELDS`; with ``SPARSE`` the list row is walked here,
    its dependent loads paid once for the three roles; with ``SOLO`` too each half's walk, of
    :data:`SOLO_SPARSE_FIELDS`), or the walk's end (state -1) when ``i`` is past the table. With ``ZERO_EMPTY`` a tile with nothing for the consumers is not
    published: one that visits no kv-block gets its O 0 and LSE -inf here (``store_no_keys``),
    one that is not live nothing. Returns whether a record was published."""
    sent = True
    if i < count:
        live, h, m0, q_start, lq, k_start, lk, b = fwd_tile(i, TILES, count, q_offsets, kv_offsets, heads, HEAD_MAJOR, GROUP)
        p0 = count * 0
        p1, p2, p3 = p0, p0, p0
        if (SPARSE and not SOLO) or ZERO_EMPTY:  # noqa: SIM102 (a compile-time branch around a run-time one)
            if live:
                lo, full_lo, full_hi, hi = kv_tile_range(m0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
                p0, p1, p2, p3 = block_walk(lo, full_lo, full_hi, hi, tile_list(lists, b, h, m0 // BLOCK_M, SPARSE), BLOCK_N, SPARSE, 1, True)
        if ZERO_EMPTY:
            sent = live & (p3 > p0)
            if live & (p3 <= p0):
                store_no_keys(O, LSE, q_start, m0, lq, h, stride_ot, stride_oh, stride_lh, stride_ls, BLOCK_M, HEAD_DIM, DTYPE)
        if sent:
            if SPARSE and SOLO:
                a0, a1, a2, a3 = p0, p0, p0, p0
                c0, c1, c2, c3 = p0, p0, p0, p0
                if live:
                    listed = tile_list(lists, b, h, m0 // BLOCK_M, SPARSE)
                    a0, a1, a2, a3 = half_walk(m0, 0, lq, lk, left, right, listed, BLOCK_M // 2, BLOCK_N // 2, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE)
                    c0, c1, c2, c3 = half_walk(m0, 1, lq, lk, left, right, listed, BLOCK_M // 2, BLOCK_N // 2, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE)
                record_publish(ring[0], ring[1], ring[2], counter,
                               (live.to(tl.int32), h, m0, q_start, lq, k_start, lk, b, a0, a1, a2, a3, c0, c1, c2, c3), RECS)
            elif SPARSE:
                record_publish(ring[0], ring[1], ring[2], counter, (live.to(tl.int32), h, m0, q_start, lq, k_start, lk, b, p0, p1, p2, p3), RECS)
            else:
                record_publish(ring[0], ring[1], ring[2], counter, (live.to(tl.int32), h, m0, q_start, lq, k_start, lk), RECS)
    else:
        z = count * 0
        if SPARSE and SOLO:
            record_publish(ring[0], ring[1], ring[2], counter, (z - 1, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z), RECS)
        elif SPARSE:
            record_publish(ring[0], ring[1], ring[2], counter, (z - 1, z, z, z, z, z, z, z, z, z, z, z), RECS)
        else:
            record_publish(ring[0], ring[1], ring[2], counter, (z - 1, z, z, z, z, z, z), RECS)
    return sent


@triton.jit
def publish_walk(ring, counter, i, r, pid, nprog, COUNTER, count, TILES, q_offsets, kv_offsets, heads, lists, left, right,
                 O, LSE, stride_ot, stride_oh, stride_lh, stride_ls,
                 HEAD_MAJOR: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, SPARSE: tl.constexpr,
                 ZERO_EMPTY: tl.constexpr, HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr,
                 DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr, RECS: tl.constexpr, SOLO: tl.constexpr = False):
    """:func:`publish_tile` of walk index ``i`` (round ``r``) as record ``counter``; with
    ``ZERO_EMPTY`` the walk goes on past the tiles it does not publish, until one is (or the
    walk's end). Returns ``(i, r)`` of the published record."""
    sent = publish_tile(ring, counter, i, count, TILES, q_offsets, kv_offsets, heads, lists, left, right, O, LSE, stride_ot, stride_oh, stride_lh, stride_ls,
                        HEAD_MAJOR, GROUP, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, ZERO_EMPTY, HEAD_DIM, DTYPE, RECS, SOLO)
    if ZERO_EMPTY:
        while not sent:
            i, r = walk_next(i, r, pid, nprog, COUNTER, ring, True, DYNAMIC, ZIGZAG, False)
            sent = publish_tile(ring, counter, i, count, TILES, q_offsets, kv_offsets, heads, lists, left, right, O, LSE, stride_ot, stride_oh, stride_lh, stride_ls,
                                HEAD_MAJOR, GROUP, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, SPARSE, ZERO_EMPTY, HEAD_DIM, DTYPE, RECS, SOLO)
    return i, r


@triton.jit
def tile_record(ring, counter, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, SPARSE: tl.constexpr, TAKE: tl.constexpr,
                RECS: tl.constexpr, HOLD: tl.constexpr = False, SOLO: tl.constexpr = False):
    """Record ``counter`` of the forward's tile ring (RECS records deep): ``(state, h, m0, q_start,
    lq, k_start, lk, b, blocks)``, ``blocks`` the tile's ``block_walk`` positions (sent with
    ``SPARSE``; without it the tile's kv range, from its lengths, and ``b`` 0). ``TAKE``: the
    consumers' take (wait for the record; its slot released, or with ``HOLD`` kept until the
    consumer releases it); else a read of a record in a slot still held: the producer's read-back
    of a record it published, or a holding consumer's second read. With ``SOLO`` (a record of
    :data:`SOLO_SPARSE_FIELDS` with ``SPARSE``) ``blocks`` is unused: each half's walk comes from
    :func:`half_blocks`."""
    FIELDS: tl.constexpr = (SOLO_SPARSE_FIELDS if SOLO else SPARSE_TILE_FIELDS) if SPARSE else TILE_FIELDS
    if TAKE and HOLD:
        rec = record_wait(ring[0], ring[1], counter, FIELDS, RECS)
    elif TAKE:
        rec = record_take(ring[0], ring[1], ring[2], counter, FIELDS, RECS)
    else:
        rec = record_read(ring[0], counter, FIELDS, RECS)
    state, h, m0, q_start, lq, k_start, lk = rec[0], rec[1], rec[2], rec[3], rec[4], rec[5], rec[6]
    if SPARSE:
        b, p0, p1, p2, p3 = rec[7], rec[8], rec[9], rec[10], rec[11]
    else:
        b = state * 0
        p0, p1, p2, p3 = kv_tile_range(m0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
    return state, h, m0, q_start, lq, k_start, lk, b, (p0, p1, p2, p3)


@triton.jit
def half_walk(m0, c, lq, lk, left, right, listed, HALF: tl.constexpr, SLOT_N: tl.constexpr,
              BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, SPARSE: tl.constexpr):
    """``SOLO``: the ``block_walk`` positions of half ``c`` of the q-tile at ``m0`` (its HALF
    rows' own kv range, in steps of SLOT_N keys; with ``SPARSE`` through the tile's list row
    ``listed``, each listed block of ``2 * SLOT_N`` keys two steps); none for a half that lies
    past the sequence's end."""
    r0 = m0 + c * HALF
    lo, full_lo, full_hi, hi = kv_tile_range(r0, lq, lk, left, right, HALF, SLOT_N, BOUNDED_LEFT, BOUNDED_RIGHT)
    hi = tl.where(r0 < lq, hi, lo)
    return block_walk(lo, full_lo, full_hi, hi, listed, SLOT_N, SPARSE, 2, True)


@triton.jit
def half_blocks(ring, counter, c, m0, lq, lk, left, right, HALF: tl.constexpr, SLOT_N: tl.constexpr,
                BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, SPARSE: tl.constexpr, RECS: tl.constexpr):
    """``SOLO``: :func:`half_walk` of half ``c`` (a run-time value) of record ``counter``'s tile:
    read from the record with ``SPARSE`` (the producer walked the list row), else computed."""
    if SPARSE:
        return record_read(ring[0], counter, SOLO_SPARSE_FIELDS, RECS, 8 + 4 * c, 4)
    else:
        return half_walk(m0, c, lq, lk, left, right, 0, HALF, SLOT_N, BOUNDED_LEFT, BOUNDED_RIGHT, False)


@triton.jit
def load_kv_blocks(desc_k, desc_v, kv, kv_cnt, listed, start, end, k_start, col,
                   BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, ELEM: tl.constexpr, NUM_KV: tl.constexpr, SPARSE: tl.constexpr,
                   SUB: tl.constexpr = 1):
    """Producer side: K and V of the kv-blocks at positions ``[start, end)`` (the positions the
    consumers walk: ``fwd_mainloop.attend``) into the K/V ring ``kv`` (its counter
    ``kv_cnt``, returned advanced); BLOCK_N keys a slot (``SUB`` slots a listed block)."""
    STEP: tl.constexpr = 1 if SPARSE else BLOCK_N
    for t in range(start, end, STEP):
        n0 = block_at(listed, t, BLOCK_N, SPARSE, SUB)
        ring_load(desc_k, kv[0], kv[2], kv[3], kv_cnt, k_start + n0, col, NUM_KV, ELEM * BLOCK_N * HEAD_DIM)
        ring_load(desc_v, kv[1], kv[4], kv[5], kv_cnt, k_start + n0, col, NUM_KV, ELEM * BLOCK_N * HEAD_DIM)
        kv_cnt += 1
    return kv_cnt
