"""The TLX dK/dV kernel's tiles (``jagflash.core.tlx.bwd_sm90``): a kv-tile's q-range, its
producer's loads, and the tile ring through which, with ``RING_TILES``, the producer alone walks
the Plan's table and hands each decoded kv-tile to the consumers.

A record of the ring holds :data:`DKDV_TILE_FIELDS` ints, ``(state, b, hk, n0, q_start, lq,
k_start, lk, vec0)``: ``state`` -1 past the walk's end, 0 a table row with no kv-tile, 1 a
kv-tile that no q-step visits (its dK and dV are zeros: no K/V and no Q load), 2 one that some
step does; ``vec0`` the first row of the sequence's packed vectors
(``jagflash.core.tlx.bwd_preprocess``). With ``OWN_SPAN`` (``jagflash.core.tuning.own_span``)
a record ends with one more int, ``own`` (:func:`tile_own`): 0, or for a kv-tile of a sequence
the program owns :data:`OWN` plus :data:`OWN_FIRST` on its first kv-tile (the consumers zero
the sequence's dQ rows before it) and :data:`OWN_LAST` on its last (they write its dQ after
it). The producer publishes an owned sequence's kv-tiles one after the other from the table row
of its first (:func:`own_walk` skips the rows of the others). With ``SPARSE`` it also holds, for each of the GROUP
query heads, the four ``block_walk`` positions of the kv-tile's row of the transposed lists, so
that no consumer runs the list's dependent loads (its count, then searches through its
indices); without it the positions are the tile's q-range (:func:`dkdv_tile_range`), a few
integer operations on the fields. Consumers keep a record's slot until they have walked every
head's steps (:func:`tile_walk` reads a head's positions from it).
"""

from __future__ import annotations

import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jagflash.core.mask import block_at, block_walk, dkdv_q_range, tile_list
from jagflash.core.seqlen import owned_seq, owns_keys, plan_row, q_row, seq_starts, store_zero_rows
from jagflash.core.tlx.bwd_preprocess import CELL_INTS
from jagflash.core.tlx.pipeline import (
    ID_RING,
    record_publish,
    record_read,
    record_wait,
    ring_slot,
    walk_next,
)

#: Ints of a record of the dK/dV tile ring before the per-head positions (``SPARSE``: 4 a head;
#: then ``own`` with ``OWN_SPAN``).
DKDV_TILE_FIELDS = tl.constexpr(9)
#: The bits of a record's ``own``: a kv-tile of an owned sequence, its first, its last.
OWN = tl.constexpr(1)
OWN_FIRST = tl.constexpr(2)
OWN_LAST = tl.constexpr(4)
#: A ``load_q_steps`` bound past any tile's steps (the rest of a tile).
ALL_STEPS = tl.constexpr(1 << 30)


@triton.jit
def dkdv_tile_range(n0, lq, lk, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, FUSED_DQ: tl.constexpr):
    """The q-range ``(lo, full_lo, full_hi, hi)`` the consumers walk for the kv-tile at ``n0``
    (``jagflash.core.mask.dkdv_q_range``). With ``FUSED_DQ`` a tile past the sequence's end runs
    masked throughout: its rows past ``lk`` hold the next sequence's keys, whose dS must not
    reach dQ."""
    lo, full_lo, full_hi, hi = dkdv_q_range(n0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
    if FUSED_DQ:  # noqa: SIM102 (a compile-time branch around a run-time one)
        if n0 + BLOCK_N > lk:
            full_lo = lo
            full_hi = lo
    return lo, full_lo, full_hi, hi


@triton.jit
def own_walk(i, r, pid, nprog, COUNTER, ring, TILES, count, heads, kv_offsets, HEAD_MAJOR: tl.constexpr,
             DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr, OWN_SPAN: tl.constexpr):
    """Producer side: the table row at walk index ``i`` (round ``r``) decoded, ``(i, r, ok, b, hk,
    n0)``; with ``OWN_SPAN`` the walk goes on past the rows of owned sequences' kv-tiles other
    than their first (their program takes them with the first: :func:`next_dkdv_tile`)."""
    ok, b, hk, n0 = plan_row(i, TILES, count, heads, HEAD_MAJOR)
    if OWN_SPAN > 0:
        skip = ok & (n0 > 0) & owned_seq(kv_offsets, b, ok, OWN_SPAN)
        while skip:
            i, r = walk_next(i, r, pid, nprog, COUNTER, ring, True, DYNAMIC, ZIGZAG, False)
            ok, b, hk, n0 = plan_row(i, TILES, count, heads, HEAD_MAJOR)
            skip = ok & (n0 > 0) & owned_seq(kv_offsets, b, ok, OWN_SPAN)
    return i, r, ok, b, hk, n0


@triton.jit
def next_dkdv_tile(i, r, own, b, hk, n0, pid, nprog, COUNTER, ring, TILES, count, heads, kv_offsets,
                   HEAD_MAJOR: tl.constexpr, DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr, BLOCK_N: tl.constexpr,
                   OWN_SPAN: tl.constexpr):
    """Producer side: the kv-tile after the one of record fields ``own``, ``b``, ``hk``, ``n0``
    (walk index ``i``, round ``r``): an owned sequence's next kv-tile until its last, else the
    walk's next row (:func:`own_walk`). Returns ``(i, r, ok, b, hk, n0)``."""
    if (own & (OWN | OWN_LAST)) == OWN:
        ok = own > 0
        n0 = n0 + BLOCK_N
    else:
        i, r = walk_next(i, r, pid, nprog, COUNTER, ring, True, DYNAMIC, ZIGZAG, False)
        i, r, ok, b, hk, n0 = own_walk(i, r, pid, nprog, COUNTER, ring, TILES, count, heads, kv_offsets, HEAD_MAJOR, DYNAMIC, ZIGZAG, OWN_SPAN)
    return i, r, ok, b, hk, n0


@triton.jit
def publish_dkdv_tile(ring, counter, ok, b, hk, n0, q_offsets, kv_offsets, VEC_TILE, lists, left, right, outs,
                      GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, FUSED_DQ: tl.constexpr,
                      SPARSE: tl.constexpr, PAD: tl.constexpr, OWN_SPAN: tl.constexpr,
                      ZERO_EMPTY: tl.constexpr, HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr):
    """Producer side of the tile ring: publish the kv-tile at ``n0`` of sequence ``b``, K/V head
    ``hk`` (``ok`` False: past the walk's end) as record ``counter`` (the module's layout).
    With ``ZERO_EMPTY`` a kv-tile no step visits (and no owner waits for) is not published: its
    dK and dV zeros are written here (``outs`` = ``(DK, DV, stride_dkt, stride_dkh, stride_dvt,
    stride_dvh)``), and a table row with no kv-tile is skipped. Returns whether a record was
    published."""
    q_start, lq, k_start, lk = seq_starts(q_offsets, kv_offsets, b)
    live = ok & (n0 < lk)
    lo, full_lo, full_hi, hi = dkdv_tile_range(n0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, FUSED_DQ)
    vec0 = tl.load(VEC_TILE + b) * PAD
    walks = ()
    if SPARSE:
        SUB: tl.constexpr = BLOCK_N // BLOCK_M
        steps = lo * 0
        block = tl.where(live, n0 // BLOCK_N, 0)  # (a row of the sequence's lists even where no tile is)
        for g in tl.static_range(GROUP):
            p = block_walk(lo, full_lo, full_hi, hi, tile_list(lists, b, hk * GROUP + g, block, SPARSE), BLOCK_M, SPARSE, SUB, True)
            steps += p[3] - p[0]
            walks = walks + p
    else:
        steps = hi - lo
    owned = live & (lk < 0)  # (False; an owned sequence's every kv-tile is published: its owner zeroes and casts)
    if OWN_SPAN > 0:
        owned = live & owns_keys(lk, OWN_SPAN)
        own = OWN + tl.where(n0 == 0, OWN_FIRST, 0) + tl.where(n0 + BLOCK_N >= lk, OWN_LAST, 0)
        walks = walks + (tl.where(owned, own, 0),)  # noqa: RUF005
    state = tl.where(live, tl.where(steps > 0, 2, 1), tl.where(ok, 0, -1)).to(tl.int32)
    sent = True
    if ZERO_EMPTY:
        sent = (state == 2) | (state < 0) | owned
        if (state == 1) & ~owned:
            DK, DV, stride_dkt, stride_dkh, stride_dvt, stride_dvh = outs
            store_zero_rows(DK + hk * stride_dkh, k_start, n0, lk, stride_dkt, BLOCK_N, HEAD_DIM, DTYPE)
            store_zero_rows(DV + hk * stride_dvh, k_start, n0, lk, stride_dvt, BLOCK_N, HEAD_DIM, DTYPE)
    if sent:
        record_publish(ring[0], ring[1], ring[2], counter, (state, b, hk, n0, q_start, lq, k_start, lk, vec0) + walks, ID_RING)  # noqa: RUF005 (Triton's frontend concatenates tuples; no unpacking)
    return sent


@triton.jit
def publish_dkdv_walk(ring, counter, i, r, ok, b, hk, n0, pid, nprog, COUNTER, TILES, count, heads, q_offsets, kv_offsets,
                      VEC_TILE, lists, left, right, outs, HEAD_MAJOR: tl.constexpr, DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr,
                      GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, FUSED_DQ: tl.constexpr,
                      SPARSE: tl.constexpr, PAD: tl.constexpr, OWN_SPAN: tl.constexpr,
                      ZERO_EMPTY: tl.constexpr, HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr):
    """:func:`publish_dkdv_tile` of the decoded row ``(ok, b, hk, n0)`` at walk index ``i`` (round
    ``r``) as record ``counter``; with ``ZERO_EMPTY`` the walk goes on past the kv-tiles it does
    not publish (never an owned one), until one is. Returns ``(i, r)`` of the published record."""
    sent = publish_dkdv_tile(ring, counter, ok, b, hk, n0, q_offsets, kv_offsets, VEC_TILE, lists, left, right, outs, GROUP, BLOCK_M, BLOCK_N,
                             BOUNDED_LEFT, BOUNDED_RIGHT, FUSED_DQ, SPARSE, PAD, OWN_SPAN, ZERO_EMPTY, HEAD_DIM, DTYPE)
    if ZERO_EMPTY:
        while not sent:
            i, r, ok, b, hk, n0 = next_dkdv_tile(i, r, 0, b, hk, n0, pid, nprog, COUNTER, ring, TILES, count, heads, kv_offsets, HEAD_MAJOR, DYNAMIC, ZIGZAG, BLOCK_N, OWN_SPAN)
            sent = publish_dkdv_tile(ring, counter, ok, b, hk, n0, q_offsets, kv_offsets, VEC_TILE, lists, left, right, outs, GROUP, BLOCK_M, BLOCK_N,
                                     BOUNDED_LEFT, BOUNDED_RIGHT, FUSED_DQ, SPARSE, PAD, OWN_SPAN, ZERO_EMPTY, HEAD_DIM, DTYPE)
    return i, r


@triton.jit
def dkdv_tile(ring, counter, FIELDS: tl.constexpr, TAKE: tl.constexpr):
    """The tile fields ``(state, b, hk, n0, q_start, lq, k_start, lk, vec0)`` of record
    ``counter`` of a ring of FIELDS-int records. ``TAKE``: the consumers' wait for it (the slot
    kept until they release it); else the producer's read-back of a record it published."""
    if TAKE:
        return record_wait(ring[0], ring[1], counter, FIELDS, ID_RING, DKDV_TILE_FIELDS)
    else:
        return record_read(ring[0], counter, FIELDS, ID_RING, 0, DKDV_TILE_FIELDS)


@triton.jit
def tile_own(ring, counter, FIELDS: tl.constexpr, OWN_SPAN: tl.constexpr):
    """The ``own`` bits of record ``counter`` (its last int; 0 without ``OWN_SPAN``), read
    without waiting (the record is already taken or published)."""
    if OWN_SPAN > 0:
        return record_read(ring[0], counter, FIELDS, ID_RING, FIELDS - 1, 1)[0]
    else:
        return 0


@triton.jit
def tile_walk(ring, counter, g, n0, lq, lk, left, right, FIELDS: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
              FUSED_DQ: tl.constexpr, SPARSE: tl.constexpr):
    """``block_walk``'s positions ``(p0, p1, p2, p3)`` of head ``g`` of the group for the tile of
    record ``counter``: with ``SPARSE`` the producer's, from the record; else the tile's range."""
    if SPARSE:
        return record_read(ring[0], counter, FIELDS, ID_RING, DKDV_TILE_FIELDS + 4 * g, 4)
    else:
        return dkdv_tile_range(n0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, FUSED_DQ)


@triton.jit
def load_kv_tile(desc_k, desc_v, k_tiles, v_tiles, kv_fulls, kv_empties, tile_cnt, row, col,
                 HALF: tl.constexpr, HEAD_DIM: tl.constexpr, ELEM: tl.constexpr):
    """Producer side: the kv-tile at ``row`` (K and V, a half per consumer warpgroup) once the
    consumers have released the previous one (``tile_cnt``: the kv-tiles loaded before)."""
    for c in tl.static_range(2):
        tlx.barrier_wait(kv_empties[c], (tile_cnt & 1) ^ 1)
        tlx.barrier_expect_bytes(kv_fulls[c], 2 * ELEM * HALF * HEAD_DIM)
        tlx.async_descriptor_load(desc_k, k_tiles[c], [row + c * HALF, col], kv_fulls[c])
        tlx.async_descriptor_load(desc_v, v_tiles[c], [row + c * HALF, col], kv_fulls[c])


@triton.jit
def load_q_step(descs, qring, q_cnt, q_start, m0, head, vec0, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                NUM_Q: tl.constexpr, ELEM: tl.constexpr, Q_SHARED: tl.constexpr):
    """Producer side: the q-step at ``m0`` of query head ``head`` (Q, dO and the step's packed
    vectors, ``vec0`` the sequence's first vector row) into slot ``q_cnt`` of the Q/dO ring
    ``qring`` (``bwd_mainloop``'s layout). ``descs``: ``(desc_q, desc_do, desc_lse2, desc_delta)``,
    with ``SOLE_DQ`` also ``desc_adds`` (``bwd_preprocess.dq_cell_counts``' counts, a ``[1, CELL_INTS]``
    box of the step's row at ``CELL_INTS head``, the count first), loaded into ``qring[6]``'s slot."""
    desc_q, desc_do, desc_lse2, desc_delta = descs[0], descs[1], descs[2], descs[3]
    q_tiles, do_tiles, lse_tiles, delta_tiles, q_fulls, q_empties = qring[0], qring[1], qring[2], qring[3], qring[4], qring[5]
    slot, phase = ring_slot(q_cnt, NUM_Q)
    col = head * HEAD_DIM
    tlx.barrier_wait(q_empties[slot], phase ^ 1)
    tlx.barrier_expect_bytes(q_fulls[slot], 2 * ELEM * BLOCK_M * HEAD_DIM + 2 * 4 * BLOCK_M + (4 * CELL_INTS if len(descs) > 4 else 0))
    tlx.async_descriptor_load(desc_q, q_tiles[slot], [q_row(q_start, m0, Q_SHARED), col], q_fulls[slot])
    tlx.async_descriptor_load(desc_do, do_tiles[slot], [q_start + m0, col], q_fulls[slot])
    tlx.async_descriptor_load(desc_lse2, lse_tiles[slot], [head, vec0 + m0], q_fulls[slot])
    tlx.async_descriptor_load(desc_delta, delta_tiles[slot], [head, vec0 + m0], q_fulls[slot])
    if len(descs) > 4:
        tlx.async_descriptor_load(descs[4], qring[6][slot], [(vec0 + m0) // BLOCK_M, CELL_INTS * head], q_fulls[slot])


@triton.jit
def load_q_steps(descs, qring, q_cnt, ring, counter, lists, first, last, left, right, FIELDS: tl.constexpr,
                 GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 NUM_Q: tl.constexpr, ELEM: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
                 FUSED_DQ: tl.constexpr, Q_SHARED: tl.constexpr, SPARSE: tl.constexpr):
    """Producer side: the steps ``[first, last)`` of the tile of record ``counter``, counted over
    its heads' steps in the order the consumers walk them (head by head, then ``block_walk``'s
    positions); returns ``q_cnt`` advanced by the steps loaded. The tile's fields are read back
    from its record here, not carried in the producer's registers."""
    STEP: tl.constexpr = 1 if SPARSE else BLOCK_M
    SUB: tl.constexpr = BLOCK_N // BLOCK_M
    _, b, hk, n0, q_start, lq, _, lk, vec0 = dkdv_tile(ring, counter, FIELDS, False)
    done = n0 * 0
    for g in range(GROUP):
        head = hk * GROUP + g
        p0, _, _, p3 = tile_walk(ring, counter, g, n0, lq, lk, left, right, FIELDS, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT, FUSED_DQ, SPARSE)
        listed = tile_list(lists, b, head, n0 // BLOCK_N, SPARSE)
        n = (p3 - p0) // STEP
        for s in range(tl.maximum(first - done, 0), tl.minimum(last - done, n)):
            m0 = block_at(listed, p0 + s * STEP, BLOCK_M, SPARSE, SUB)
            load_q_step(descs, qring, q_cnt, q_start, m0, head, vec0, HEAD_DIM, BLOCK_M, NUM_Q, ELEM, Q_SHARED)
            q_cnt += 1
        done += n
    return q_cnt
