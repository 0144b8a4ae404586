"""Attention for Hopper (sm_90a), warp-specialised with TLX, over jagged batches: the forward,
the one-pass backward and the dK/dV pass of the two-pass one.

The dense, jagged and broadcast-Q variants all launch these kernels (dense is jagged with equal
lengths; broadcast-Q is jagged with one shared Q block, ``q_shared``); their ``kernels_tlx_sm90``
modules are thin wrappers. One persistent program per SM walks the forward (or dK/dV) section of
a :class:`jagflash.core.schedule.Plan` (dealt zigzag for the grouped and static schedules,
round-robin otherwise) and splits the work over three warp roles:

- the producer (the default warpgroup, 24 registers) streams Q once per tile and K/V through a
  ring of ``NUM_KV`` shared-memory slots with TMA, each slot guarded by a full/empty mbarrier
  pair (``jagflash.core.pipeline``);
- two consumer warpgroups (``replicate=2``, 240 registers each) take 64 rows each and run
  wgmma + the shared online-softmax step of ``jagflash.core.math``; they issue their QK^T
  wgmmas in turn (named barriers 9 and 10), so one's softmax overlaps the other's matmul
  ("ping-pong"). Version 2 of the consumer (``pipeline=True``, the default) also keeps QK^T of
  tile j in flight while P V of tile j-1 issues, carrying P in fp32; a positive scale rides in
  the exponent's fused multiply-add (``FOLD_SCALE``: the kv loop at the uTLX tutorial's
  instruction count, bench/NOTES.md);
- the epilogue (in the consumers) normalises, and writes O and the LSE with masked stores that
  never cross the sequence boundary.

Every q-tile visits the kv-tiles ``[lo, hi)`` of ``jagflash.core.math.kv_tile_range``; the
consumers run ``[lo, full_lo)`` and ``[full_hi, hi)`` in the masked specialisation of their
loop and ``[full_lo, full_hi)`` in the unmasked one (for causal attention that peels the
diagonal tiles off the main loop). TMA reads past a sequence's end are harmless: see
``jagflash.core.pipeline``.

The dK/dV pass (:func:`backward_dkdv`) keeps a 128-row kv-tile's dK and dV in the two consumer
warpgroups' registers and streams Q / dO of every q-tile that sees it, 64 queries a step
(``jagflash.core.backend.tlx_sm90_blocks``); dQ and delta come from the portable dQ pass, which
runs first (deterministic). Both read log2 LSE and delta packed per sequence by
:func:`backward_vectors` (no masks: the producer loads each step's by TMA with its Q and dO).
The same kernel with ``FUSED_DQ`` is the one-pass backward (:func:`backward`, the variants'
default where :func:`use_one_pass` says so, causal or not): after that preprocess (which
computes delta), each 64-query step also computes dQ = dS K, both warpgroups' dS^T meeting in shared
memory, each warpgroup taking half of the head dim, and adds it into an fp32 accumulator with
staged TMA reduce-adds (``jagflash.core.pipeline.dq_reduce_add``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jagflash.core.jagged import seq_lengths
from jagflash.core.mask import band_bounds, bounds_mask, dkdv_q_range, kv_tile_range
from jagflash.core.ops import alloc, alloc_like, stepped_arange
from jagflash.core.pipeline import (
    dq_reduce_add,
    num_workers,
    opaque_zero,
    record_publish,
    record_take,
    ring_acquire,
    ring_load,
    ring_release,
    ring_slot,
    rows_descriptor,
    tile_publish,
    tile_take,
    tma_load,
    vectors_descriptor,
)
from jagflash.core.plan.build import make_plan
from jagflash.core.plan.model import PASSES
from jagflash.core.portable import atomic_add_rows, sched_first, sched_next
from jagflash.core.seqlen import upper_bound
from jagflash.core.softmax import (
    LOG2E,
    attn_delta,
    finish_softmax,
    lse_to_log2,
    online_softmax_step,
    online_softmax_step_scaled,
)
from jagflash.core.tile_scheduler import deal_flags, tile_counter
from jagflash.core.tuning import (
    TLX_ONE_PASS_HEAD_DIMS,
    default_schedules,
    kernel_flags,
    tlx_sm90_blocks,
)

# q-tile rows (each consumer warpgroup takes half), kv rows: the same at every head dim and mask
BLOCK_M, BLOCK_N = tlx_sm90_blocks(128)["fwd"]
NUM_KV = 2  # K/V ring depth
# The dK/dV pass's q rows per step and kv rows per tile (each consumer takes half) come from
# tlx_sm90_blocks (by head dim and mask); the one-pass backward always steps 64 queries.
ONE_PASS_BLOCK_M = 64
NUM_Q = 2  # Q/dO ring depth of the dK/dV pass
#: Tile-index ring depth of a dynamic schedule: the producer claims a tile one ahead of the one it
#: loads for, and the Q / K/V buffers keep it at most one more tile ahead of the consumers.
ID_RING = tl.constexpr(2)
# The fields of a decoded forward tile in the tile ring (``ring_tiles``): state (1 live, 0 none
# to compute, -1 the walk's end), head, first row, q start, lq, kv start, lk.
TILE_FIELDS = tl.constexpr(7)
HEAD_DIMS = (64, 128)
#: Head dims the one-pass backward takes (:func:`dq_cols`); the variants run it by default only
#: where it was measured faster (``backend.TLX_ONE_PASS_HEAD_DIMS``, :func:`use_one_pass`).
ONE_PASS_HEAD_DIMS = (64, 128)
# The per-query vectors of the dK/dV kernel (log2 LSE and delta) are packed per sequence, each
# sequence's rows starting at a multiple of VEC_PAD, padding rows holding lse2 = +inf (P = 0) and
# delta = 0: the kernel's producer then loads a step's vectors as one TMA box each, without a mask.
VEC_PAD = 64  # every dK/dV q-step (64 queries) divides it
# How the one-pass backward (:func:`backward`) adds dQ: the FUSED_DQ value of the kernel.
DQ_WRITES = {"tma": 1, "atomic": 2}
# Shared-memory stages of each consumer's dQ write-back (two do not fit beside K/V, the Q/dO
# ring and dS^T at D 128: 240 KB with Triton's scratch, over the 227 KB a block may take)
DQ_STAGES = 1
# The orders the programs may walk a plan's table in (``walk=`` of forward / backward /
# backward_dkdv; ``None``: :func:`default_walk`)
WALKS = ("slot", "head")
#: Whether the variants' TLX backward may run the one-pass :func:`backward` (see
#: :func:`use_one_pass`): a switch to go back to the two passes everywhere. Measured on the H200,
#: kernels alone, bf16 H16 D128 (bench/NOTES.md, 2026-12-01 session 5): lognormal 9.65 ms vs the
#: two passes' 17.6, causal 6.43 vs 10.2; dense 4x4096 3.04 vs 6.13, causal 1.84 vs 3.30.
ONE_PASS_BACKWARD = True


def _walk_reasons(walk: str | None) -> list[str]:
    """Why ``walk`` is neither ``None`` nor one of :data:`WALKS` (empty if it is)."""
    return [] if walk is None or walk in WALKS else [f"walk must be None or one of {WALKS}, got {walk!r}"]


def default_walk(left: int, right: int, dynamic: bool = False) -> str:
    """The walk a call gets when it names none: ``"head"`` (one head's tiles at a time, for L2
    locality) without a mask or on a dynamic plan, ``"slot"`` (the cost order across heads) on
    a static plan with a mask, whose zigzag deal needs that order to balance the programs.
    Measured on the H200, kernels alone, bf16 D128 (bench/NOTES.md, 2026-12-01 sessions 6 and
    7). Unmasked, head vs slot: forward dense 4x4096 0.917 vs 0.979 ms, 4x8192 H32 6.97 vs
    7.83, lognormal 3.01 vs 3.06; one-pass backward dense 2.90 vs 3.00. Causal on a static
    plan the head walk loses the balance (backward lognormal 6.86 vs 6.36 ms, dense 2.34 vs
    1.80; forward dense 4x4096 0.657 vs 0.553); on a dynamic plan it keeps both (forward dense
    4x4096 causal 0.509 ms, 4x8192 H32 3.75 vs the static slot walk's 4.78, lognormal 1.81 vs
    1.95; backward lognormal causal 5.84 vs 6.29). With GQA the walk goes K/V head by K/V head
    (``_plan_row``): causal 16:4 1.73 ms, level with the grouped slot walk's 1.72 (walking
    query heads one at a time: 1.81)."""
    return "head" if dynamic or (left < 0 and right < 0) else "slot"


def default_ring_tiles(total_kv: int, batch: int) -> bool:
    """Whether a forward call that names no ``ring_tiles`` hands the consumers decoded tiles
    (``RING_TILES``): where the batch's K/V sequences hold at most one K/V tile (BLOCK_N keys)
    on average, so that each tile's start, not its loop, is what the consumers wait for.
    Measured on the H200, kernels alone, bf16 H16 D128 (bench/NOTES.md, session 9), ring vs
    none: 2,048 sequences of 1-63 tokens 0.885 vs 0.974 ms, causal 0.900 vs 0.964; on long
    sequences the ring costs up to 1.5 % (lognormal 3.011 vs 2.967 ms, dense 4x4096 0.939 vs
    0.928) or is level (causal, 4x8192 H32)."""
    return total_kv <= BLOCK_N * max(batch, 1)


def _head_major(walk: str | None, left: int, right: int, dynamic: bool) -> bool:
    """The kernels' ``HEAD_MAJOR`` for a call's ``walk`` (``None``: :func:`default_walk`)."""
    return (walk or default_walk(left, right, dynamic)) == "head"


def dq_cols(head_dim: int) -> int:
    """Columns of dQ one consumer warpgroup of the one pass computes at once (``DQ_COLS``): half
    the head dim, 64 at D 128; the whole head dim at D 64, on alternate steps, since half of
    it (32 columns, 64 bytes) would slice K off its 128-byte swizzle (``_dkdv_steps``)."""
    return head_dim if head_dim < 128 else head_dim // 2


def use_one_pass(deterministic: bool, left: int, right: int, head_dim: int) -> bool:
    """Whether a variant's TLX backward runs the one-pass :func:`backward` (dQ order varies)
    rather than the two passes: where it measured faster (D 64 and 128, causal or not; a
    window's left bound is not yet measured) and the call does not ask for a deterministic
    backward, and only while :data:`ONE_PASS_BACKWARD` is on."""
    return ONE_PASS_BACKWARD and not deterministic and left < 0 and head_dim in TLX_ONE_PASS_HEAD_DIMS


@triton.jit
def _walk_first(pid, COUNTER, ids, id_fulls, id_empties, PRODUCER: tl.constexpr, DYNAMIC: tl.constexpr,
                PUBLISH: tl.constexpr = True):
    """The first table index ``i`` of this program's walk over a Plan pass and its round ``r``.

    Static (``DYNAMIC`` off): every role computes the indices itself (``sched_first`` /
    ``sched_next``: program ``pid``'s slot of each round, mirrored on odd rounds of a zigzag
    deal), so producer and consumers walk the same tiles without talking. Dynamic: only the
    producer takes indices from the launch's atomic counter, one tile ahead of the one it loads
    for, and publishes each in the tile-index ring (``ids``, ``id_fulls``, ``id_empties``:
    :func:`jagflash.core.pipeline.tile_publish`); the consumers take them from there in the same
    order. The walk ends at the first index past the pass's tile count. ``PUBLISH`` off: the
    producer walks alone (the forward's ``RING_TILES`` hands the consumers decoded tiles
    instead of indices)."""
    if DYNAMIC:
        if PRODUCER:
            i, r = sched_first(pid, COUNTER, True)
            if PUBLISH:
                tile_publish(ids, id_fulls, id_empties, r, i, ID_RING)
        else:
            r = pid * 0
            i = tile_take(ids, id_fulls, id_empties, r, ID_RING)
    else:
        i, r = sched_first(pid, COUNTER, False)
    return i, r


@triton.jit
def _walk_next(i, r, pid, nprog, COUNTER, ids, id_fulls, id_empties, PRODUCER: tl.constexpr,
               DYNAMIC: tl.constexpr, ZIGZAG: tl.constexpr, PUBLISH: tl.constexpr = True):
    """The index after ``i`` (round ``r``) of this program's walk, and its round: see
    :func:`_walk_first`. The producer calls it before it loads for tile ``i`` (so a dynamic
    claim's latency hides behind that tile), the consumers after they finish it."""
    if DYNAMIC:
        if PRODUCER:
            i, r = sched_next(i, r, pid, nprog, COUNTER, True, ZIGZAG)
            if PUBLISH:
                tile_publish(ids, id_fulls, id_empties, r, i, ID_RING)
        else:
            r = r + 1
            i = tile_take(ids, id_fulls, id_empties, r, ID_RING)
    else:
        i, r = sched_next(i, r, pid, nprog, COUNTER, False, ZIGZAG)
    return i, r


@triton.jit
def _plan_row(i, TILES, count, heads, HEAD_MAJOR: tl.constexpr, GROUP: tl.constexpr = 1):
    """Row ``i`` of a Plan pass's table (walked in the order of :func:`_walk_first`): (in range,
    sequence, head, first row).

    ``HEAD_MAJOR``: the table holds each tile slot's ``heads`` heads side by side; walk it one
    K/V head at a time instead: the GROUP query heads that share it (GQA; the forward's table
    holds query heads) side by side, slot after slot, then the next K/V head. The tiles that run
    at once then share one K/V head in L2, as the uTLX tutorial's grid order does. It gives up
    the cost order across heads (each head's tiles still come heaviest first), which a static
    deal pays for on masked batches and a dynamic one does not."""
    ok = i < count
    t = i
    if HEAD_MAJOR:
        span = tl.maximum(count // heads, 1) * GROUP  # the tiles of one K/V head
        rem = i % span
        t = (rem // GROUP) * heads + (i // span) * GROUP + rem % GROUP
    row = TILES + tl.where(ok, t, 0).to(tl.int64) * 3
    return ok, tl.load(row, mask=ok, other=0), tl.load(row + 1, mask=ok, other=0), tl.load(row + 2, mask=ok, other=0)


@triton.jit
def _starts(q_offsets, kv_offsets, b):
    """(q start, lq, kv start, lk) of sequence ``b``; int32, as TMA coordinates are 32-bit."""
    q_start = tl.load(q_offsets + b).to(tl.int32)
    lq = tl.load(q_offsets + b + 1).to(tl.int32) - q_start
    k_start = tl.load(kv_offsets + b).to(tl.int32)
    lk = tl.load(kv_offsets + b + 1).to(tl.int32) - k_start
    return q_start, lq, k_start, lk


@triton.jit
def _tile(i, TILES, count, q_offsets, kv_offsets, heads, HEAD_MAJOR: tl.constexpr, GROUP: tl.constexpr):
    """The forward q-tile at index ``i`` of the walk: (live, head, first row, q start, lq, kv
    start, lk)."""
    ok, b, h, m0 = _plan_row(i, TILES, count, heads, HEAD_MAJOR, GROUP)
    q_start, lq, k_start, lk = _starts(q_offsets, kv_offsets, b)
    return ok & (m0 < lq), h, m0, q_start, lq, k_start, lk


@triton.jit
def _q_row(q_start, m0, Q_SHARED: tl.constexpr):
    """Row of Q where a q-tile starting at ``m0`` of a sequence starting at ``q_start`` reads its
    queries: the sequence's own rows, or, broadcast-Q (``Q_SHARED``), the one shared block
    (outputs, LSE and dO still use the sequence's rows ``q_start + m0``)."""
    if Q_SHARED:
        return m0
    else:
        return q_start + m0


@triton.jit
def _turn_wait(CID: tl.constexpr):
    """Wait for this warpgroup's turn to issue (named barriers 9 and 10, :func:`_issue_qk`)."""
    if CID == 0:
        tlx.named_barrier_wait(9, 256)
    else:
        tlx.named_barrier_wait(10, 256)


@triton.jit
def _turn_pass(CID: tl.constexpr):
    """Hand the turn to issue to the other warpgroup."""
    if CID == 0:
        tlx.named_barrier_arrive(10, 256)
    else:
        tlx.named_barrier_arrive(9, 256)


@triton.jit
def _issue_qk(q_buf, k_buf, CID: tl.constexpr):
    """Start S = Q K^T on the tensor cores. The two consumer warpgroups issue in turn (named
    barriers 9 and 10), so one's softmax overlaps the other's matmul ("ping-pong")."""
    _turn_wait(CID)
    qk = tlx.async_dot(q_buf, tlx.local_trans(k_buf))
    _turn_pass(CID)
    return qk


@triton.jit
def _pass_kv_tiles(kv_cnt, start, end, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties,
                   CID: tl.constexpr, BLOCK_N: tl.constexpr, NUM_KV: tl.constexpr):
    """A consumer whose half of the q-tile lies wholly past the sequence's end (``IDLE_HALF``):
    over the kv-tiles ``[start, end)`` it issues no matmul, and keeps only its part of the
    handshakes: its turns to issue (so the other warpgroup never waits for it) and its release
    of each K and V slot, after the slot has filled (a release before that would count towards
    the slot's previous round, which the other warpgroup may still be reading)."""
    for _n0 in range(start, end, BLOCK_N):
        _turn_wait(CID)
        _turn_pass(CID)
        _, k_slot = ring_acquire(k_tiles, k_fulls, kv_cnt, NUM_KV)
        ring_release(k_empties, k_slot)
        _, v_slot = ring_acquire(v_tiles, v_fulls, kv_cnt, NUM_KV)
        ring_release(v_empties, v_slot)
        kv_cnt += 1
    return kv_cnt


@triton.jit
def _scores(qk, qk_scale2, col_lo, col_hi, n0, BLOCK_N: tl.constexpr,
            BOUNDED_LEFT: tl.constexpr, MASKED: tl.constexpr, FOLD_SCALE: tl.constexpr):
    """Scores of the kv-tile at ``n0`` for :func:`_softmax_step`, masked in the masked
    specialisation by the per-row key bounds ``[col_lo, col_hi)`` of
    ``jagflash.core.math.band_bounds``: raw with ``FOLD_SCALE`` (a positive scale, which then
    rides in the exponent), else in the log2 domain (masked after the multiply, as 0 x -inf
    would be NaN)."""
    if FOLD_SCALE:
        s2 = qk
    else:
        s2 = qk * qk_scale2
    if MASKED:
        cols = n0 + tl.arange(0, BLOCK_N)
        s2 = tl.where(bounds_mask(cols[None, :], col_lo[:, None], col_hi[:, None], BOUNDED_LEFT), s2, float("-inf"))
    return s2


@triton.jit
def _softmax_step(s, qk_scale2, m_i, l_i, FOLD_SCALE: tl.constexpr):
    """The online-softmax step of scores from :func:`_scores`."""
    if FOLD_SCALE:
        return online_softmax_step_scaled(s, qk_scale2, m_i, l_i)
    else:
        return online_softmax_step(s, m_i, l_i)


@triton.jit
def _consume_pipelined(
    acc, m_i, l_i, p, kv_cnt, q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties,
    col_lo, col_hi, start, end, qk_scale2,
    CID: tl.constexpr, DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_KV: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, MASKED: tl.constexpr,
    FOLD_SCALE: tl.constexpr,
):
    """Like :func:`_consume`, software-pipelined: the QK^T of tile j is in flight while P V of
    tile j-1 is issued, so a warpgroup's own matmuls overlap its softmax. ``p`` holds the
    probabilities of the previous tile, not yet multiplied into ``acc``, in fp32, converted where
    the wgmma takes it (carried in DTYPE, its layout cost 32 byte permutes a tile); ``acc`` is
    already scaled to the current running max."""
    for n0 in range(start, end, BLOCK_N):
        k_buf, k_slot = ring_acquire(k_tiles, k_fulls, kv_cnt, NUM_KV)
        qk = _issue_qk(q_buf, k_buf, CID)
        v_buf, v_slot = ring_acquire(v_tiles, v_fulls, kv_cnt - 1, NUM_KV)
        acc = tlx.async_dot(p.to(DTYPE), v_buf, acc)
        qk = tlx.async_dot_wait(1, qk)
        ring_release(k_empties, k_slot)
        s2 = _scores(qk, qk_scale2, col_lo, col_hi, n0, BLOCK_N, BOUNDED_LEFT, MASKED, FOLD_SCALE)
        p_new, alpha, m_i, l_i = _softmax_step(s2, qk_scale2, m_i, l_i, FOLD_SCALE)
        acc = tlx.async_dot_wait(0, acc)
        ring_release(v_empties, v_slot)
        acc = acc * alpha[:, None]
        p = p_new
        kv_cnt += 1
    return acc, m_i, l_i, p, kv_cnt


@triton.jit
def _consume(
    acc, m_i, l_i, kv_cnt, q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties,
    col_lo, col_hi, start, end, qk_scale2,
    CID: tl.constexpr, DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_KV: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, MASKED: tl.constexpr,
    FOLD_SCALE: tl.constexpr,
):
    """One consumer warpgroup over the kv-tiles ``[start, end)`` (masked or not)."""
    for n0 in range(start, end, BLOCK_N):
        k_buf, k_slot = ring_acquire(k_tiles, k_fulls, kv_cnt, NUM_KV)
        qk = _issue_qk(q_buf, k_buf, CID)
        qk = tlx.async_dot_wait(0, qk)
        ring_release(k_empties, k_slot)
        s2 = _scores(qk, qk_scale2, col_lo, col_hi, n0, BLOCK_N, BOUNDED_LEFT, MASKED, FOLD_SCALE)
        p, alpha, m_i, l_i = _softmax_step(s2, qk_scale2, m_i, l_i, FOLD_SCALE)
        acc = acc * alpha[:, None]
        v_buf, v_slot = ring_acquire(v_tiles, v_fulls, kv_cnt, NUM_KV)
        acc = tlx.async_dot(p.to(DTYPE), v_buf, acc)
        acc = tlx.async_dot_wait(0, acc)
        ring_release(v_empties, v_slot)
        kv_cnt += 1
    return acc, m_i, l_i, kv_cnt


@triton.jit
def _fwd_kernel(
    desc_q, desc_k, desc_v, O, LSE, q_offsets, kv_offsets, TILES, COUNT, COUNTER,
    stride_ot, stride_oh, stride_lh, stride_ls, scale, left, right, heads,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_KV: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    PIPELINE: tl.constexpr, ZIGZAG: tl.constexpr, Q_SHARED: tl.constexpr = False,
    FOLD_SCALE: tl.constexpr = False, HEAD_MAJOR: tl.constexpr = False, DYNAMIC: tl.constexpr = False,
    Q_BUFS: tl.constexpr = 1, RING_TILES: tl.constexpr = False, IDLE_HALF: tl.constexpr = True,
):
    HALF: tl.constexpr = BLOCK_M // 2
    dtype: tl.constexpr = tlx.dtype_of(desc_q)
    ELEM: tl.constexpr = tlx.size_of(dtype)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)

    # Q, a half per consumer, Q_BUFS tiles deep (2: the next tile's Q loads during this one)
    q_tiles = tlx.local_alloc((HALF, HEAD_DIM), dtype, 2 * Q_BUFS)
    k_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, NUM_KV)
    v_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, NUM_KV)
    q_fulls = tlx.alloc_barriers(num_barriers=2 * Q_BUFS, arrive_count=1)
    q_empties = tlx.alloc_barriers(num_barriers=2 * Q_BUFS, arrive_count=1)
    k_fulls = tlx.alloc_barriers(num_barriers=NUM_KV, arrive_count=1)
    k_empties = tlx.alloc_barriers(num_barriers=NUM_KV, arrive_count=2)
    v_fulls = tlx.alloc_barriers(num_barriers=NUM_KV, arrive_count=1)
    v_empties = tlx.alloc_barriers(num_barriers=NUM_KV, arrive_count=2)
    # The tile ring: with RING_TILES the producer walks the table alone and passes each decoded
    # tile (TILE_FIELDS ints) to the consumers; otherwise, on a dynamic plan, the table index.
    if RING_TILES:
        ids = tlx.local_alloc((1,), tl.int32, ID_RING * TILE_FIELDS)
    else:
        ids = tlx.local_alloc((1,), tl.int32, ID_RING)
    id_fulls = tlx.alloc_barriers(num_barriers=ID_RING, arrive_count=1)
    id_empties = tlx.alloc_barriers(num_barriers=ID_RING, arrive_count=2)

    with tlx.async_tasks():
        with tlx.async_task("default", registers=24):  # producer: TMA loads
            count = tl.load(COUNT).to(tl.int32)
            kv_cnt = 0
            tile_cnt = 0
            pub_cnt = 0  # tiles published in the tile ring (RING_TILES)
            i, r = _walk_first(pid, COUNTER, ids, id_fulls, id_empties, True, DYNAMIC, not RING_TILES)
            while i < count:
                i_next, r = _walk_next(i, r, pid, nprog, COUNTER, ids, id_fulls, id_empties, True, DYNAMIC, ZIGZAG, not RING_TILES)
                live, h, m0, q_start, lq, k_start, lk = _tile(i, TILES, count, q_offsets, kv_offsets, heads, HEAD_MAJOR, GROUP)
                if RING_TILES:
                    # published as the producer reaches the tile: Q_BUFS tiles ahead of the
                    # consumers, who then read a tile from shared memory, not three dependent
                    # global loads (table row, offsets) at every tile start
                    record_publish(ids, id_fulls, id_empties, pub_cnt, (live.to(tl.int32), h, m0, q_start, lq, k_start, lk), ID_RING)
                    pub_cnt += 1
                if live:
                    lo, full_lo, full_hi, hi = kv_tile_range(m0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
                    q_row = _q_row(q_start, m0, Q_SHARED)
                    qb, q_phase = ring_slot(tile_cnt, Q_BUFS)
                    for c in tl.static_range(2):
                        tma_load(desc_q, q_tiles[2 * qb + c], q_fulls[2 * qb + c], q_empties[2 * qb + c], q_phase, q_row + c * HALF, h * HEAD_DIM, ELEM * HALF * HEAD_DIM)
                    col = (h // GROUP) * HEAD_DIM
                    for n0 in range(lo, hi, BLOCK_N):
                        ring_load(desc_k, k_tiles, k_fulls, k_empties, kv_cnt, k_start + n0, col, NUM_KV, ELEM * BLOCK_N * HEAD_DIM)
                        ring_load(desc_v, v_tiles, v_fulls, v_empties, kv_cnt, k_start + n0, col, NUM_KV, ELEM * BLOCK_N * HEAD_DIM)
                        kv_cnt += 1
                    tile_cnt += 1
                i = i_next
            if RING_TILES:  # the walk's end
                record_publish(ids, id_fulls, id_empties, pub_cnt, (-1, 0, 0, 0, 0, 0, 0), ID_RING)

        with tlx.async_task(num_warps=4, registers=240, replicate=2):  # consumers
            cid: tl.constexpr = tlx.async_task_replica_id()
            if cid == 1:
                tlx.named_barrier_arrive(9, 256)  # let warpgroup 0 issue first
            qk_scale2 = scale * LOG2E
            count = tl.load(COUNT).to(tl.int32)
            kv_cnt = 0
            tile_cnt = 0
            if RING_TILES:
                taken = 0
                state, h, m0, q_start, lq, k_start, lk = record_take(ids, id_fulls, id_empties, taken, TILE_FIELDS, ID_RING)
                more = state >= 0
            else:
                i, r = _walk_first(pid, COUNTER, ids, id_fulls, id_empties, False, DYNAMIC)
                more = i < count
            while more:
                if RING_TILES:
                    live = state > 0
                else:
                    live, h, m0, q_start, lq, k_start, lk = _tile(i, TILES, count, q_offsets, kv_offsets, heads, HEAD_MAJOR, GROUP)
                if live:
                    lo, full_lo, full_hi, hi = kv_tile_range(m0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
                    rows = m0 + cid * HALF + tl.arange(0, HALF)
                    col_lo, col_hi = band_bounds(rows, lq, lk, left, right, BOUNDED_LEFT, BOUNDED_RIGHT)
                    qb, q_phase = ring_slot(tile_cnt, Q_BUFS)
                    tlx.barrier_wait(q_fulls[2 * qb + cid], q_phase)
                    q_buf = q_tiles[2 * qb + cid]
                    idle = IDLE_HALF & (m0 + cid * HALF >= lq)  # (only the second half can be)
                    if idle:
                        kv_cnt = _pass_kv_tiles(kv_cnt, lo, hi, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, cid, BLOCK_N, NUM_KV)
                        tlx.barrier_arrive(q_empties[2 * qb + cid], 1)
                    else:
                        m_i = tl.full([HALF], float("-inf"), tl.float32)
                        l_i = tl.zeros([HALF], tl.float32)
                        acc = tl.zeros([HALF, HEAD_DIM], tl.float32)
                        if PIPELINE:
                            if hi > lo:
                                # Prologue: the first tile alone (its mask decided once, at run time).
                                k_buf, k_slot = ring_acquire(k_tiles, k_fulls, kv_cnt, NUM_KV)
                                qk = _issue_qk(q_buf, k_buf, cid)
                                qk = tlx.async_dot_wait(0, qk)
                                ring_release(k_empties, k_slot)
                                if (lo < full_lo) | (lo >= full_hi):
                                    s2 = _scores(qk, qk_scale2, col_lo, col_hi, lo, BLOCK_N, BOUNDED_LEFT, True, FOLD_SCALE)
                                else:
                                    s2 = _scores(qk, qk_scale2, col_lo, col_hi, lo, BLOCK_N, BOUNDED_LEFT, False, FOLD_SCALE)
                                p, _, m_i, l_i = _softmax_step(s2, qk_scale2, m_i, l_i, FOLD_SCALE)  # acc is 0: no rescale
                                kv_cnt += 1
                                second = lo + BLOCK_N
                                acc, m_i, l_i, p, kv_cnt = _consume_pipelined(acc, m_i, l_i, p, kv_cnt, q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, col_lo, col_hi, second, tl.maximum(full_lo, second), qk_scale2, cid, dtype, BLOCK_N, NUM_KV, BOUNDED_LEFT, BOUNDED_RIGHT, True, FOLD_SCALE)
                                acc, m_i, l_i, p, kv_cnt = _consume_pipelined(acc, m_i, l_i, p, kv_cnt, q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, col_lo, col_hi, tl.maximum(full_lo, second), tl.maximum(full_hi, second), qk_scale2, cid, dtype, BLOCK_N, NUM_KV, BOUNDED_LEFT, BOUNDED_RIGHT, False, FOLD_SCALE)
                                acc, m_i, l_i, p, kv_cnt = _consume_pipelined(acc, m_i, l_i, p, kv_cnt, q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, col_lo, col_hi, tl.maximum(full_hi, second), hi, qk_scale2, cid, dtype, BLOCK_N, NUM_KV, BOUNDED_LEFT, BOUNDED_RIGHT, True, FOLD_SCALE)
                                # Epilogue: P V of the last tile.
                                v_buf, v_slot = ring_acquire(v_tiles, v_fulls, kv_cnt - 1, NUM_KV)
                                acc = tlx.async_dot(p.to(dtype), v_buf, acc)
                                acc = tlx.async_dot_wait(0, acc)
                                ring_release(v_empties, v_slot)
                        else:
                            acc, m_i, l_i, kv_cnt = _consume(acc, m_i, l_i, kv_cnt, q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, col_lo, col_hi, lo, full_lo, qk_scale2, cid, dtype, BLOCK_N, NUM_KV, BOUNDED_LEFT, BOUNDED_RIGHT, True, FOLD_SCALE)
                            acc, m_i, l_i, kv_cnt = _consume(acc, m_i, l_i, kv_cnt, q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, col_lo, col_hi, full_lo, full_hi, qk_scale2, cid, dtype, BLOCK_N, NUM_KV, BOUNDED_LEFT, BOUNDED_RIGHT, False, FOLD_SCALE)
                            acc, m_i, l_i, kv_cnt = _consume(acc, m_i, l_i, kv_cnt, q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, col_lo, col_hi, full_hi, hi, qk_scale2, cid, dtype, BLOCK_N, NUM_KV, BOUNDED_LEFT, BOUNDED_RIGHT, True, FOLD_SCALE)
                        tlx.barrier_arrive(q_empties[2 * qb + cid], 1)
                        out, lse = finish_softmax(acc, m_i, l_i)
                        valid = rows < lq
                        offs_d = tl.arange(0, HEAD_DIM)
                        o_rows = (q_start + rows).to(tl.int64)
                        o_ptrs = O + o_rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
                        tl.store(o_ptrs, out.to(dtype), mask=valid[:, None])
                        # LSE [Hq, Tq] (stride_lh = Tq, stride_ls = 1) or [B, Hq, L] (L, Hq: q_start = b L);
                        # int32 offsets: LSE has D times fewer elements than O, which fits in memory
                        tl.store(LSE + (h * stride_lh + q_start * stride_ls + rows), lse, mask=valid)
                    tile_cnt += 1
                if RING_TILES:
                    taken += 1
                    state, h, m0, q_start, lq, k_start, lk = record_take(ids, id_fulls, id_empties, taken, TILE_FIELDS, ID_RING)
                    more = state >= 0
                else:
                    i, r = _walk_next(i, r, pid, nprog, COUNTER, ids, id_fulls, id_empties, False, DYNAMIC, ZIGZAG)
                    more = i < count


@triton.jit
def _dq_write(dq, desc_dq, dq_stages, counter, q_row, col, DQ, stride_acc, rows, lq,
              CID: tl.constexpr, FUSED_DQ: tl.constexpr, DQ_STAGES: tl.constexpr,
              DQ_COLS: tl.constexpr, BLOCK_M: tl.constexpr):
    """Add one warpgroup's fp32 dQ tile (BLOCK_M queries from accumulator row ``q_row``, DQ_COLS
    columns from ``col``) into the accumulator: ``FUSED_DQ == 1`` through its ring of
    ``dq_stages`` (``counter``: its running count of writes) and a TMA reduce-add to
    ``desc_dq``, ``FUSED_DQ == 2`` with fp32 atomics to ``DQ`` (rows past ``lq`` skipped)."""
    if FUSED_DQ == 1:
        dq_reduce_add(desc_dq, dq_stages, DQ_STAGES * CID, DQ_STAGES, counter, dq, q_row, col)
    else:
        cols = col + tl.arange(0, DQ_COLS)
        acc_rows = q_row + tl.arange(0, BLOCK_M)
        ptrs = DQ + acc_rows.to(tl.int64)[:, None] * stride_acc + cols[None, :]
        atomic_add_rows(ptrs, dq, rows, lq, cols, DQ_COLS, True)


@triton.jit
def _dkdv_steps(
    dk, dv, k_tiles, v_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles, q_fulls, q_empties, kv_rows,
    q_cnt, start, end, lq, lk, qk_scale2, left, right,
    desc_dq, ds_tiles, dq_stages, q_start, dq_col, DQ, stride_acc,
    CID: tl.constexpr, DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, NUM_Q: tl.constexpr,
    BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, MASKED: tl.constexpr,
    FUSED_DQ: tl.constexpr, Q_SHARED: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
    DQ_STAGES: tl.constexpr, OPAQUE_INDEX: tl.constexpr, DQ_COLS: tl.constexpr,
):
    """One consumer warpgroup's HALF kv rows (``k_tiles[CID]``, ``v_tiles[CID]``) against the q-tiles
    ``[start, end)`` of one query head (each step's Q, dO and packed vectors, ``lse_tiles`` and
    ``delta_tiles`` ``[1, BLOCK_M]`` fp32, arrive together in one slot of the Q ring):
    S^T = K Q^T and dP^T = V dO^T on the tensor cores, then dV += P^T dO (P^T from registers)
    and dK += dS^T Q (dS^T through shared memory).

    With ``FUSED_DQ`` the step also computes this warpgroup's half of the q-tile's dQ: both
    warpgroups store their dS^T (64 kv rows each) into the step's pair of ``ds_tiles`` (double
    buffered by step parity), meet at named barrier 11, and warpgroup ``CID`` multiplies the
    whole dS (128 kv rows) by the columns ``[CID * D/2, (CID + 1) * D/2)`` of K: dQ[:, half] =
    dS K[:, half], a 64 x D/2 fp32 tile that no other warpgroup of the program adds to. It goes
    into the fp32 accumulator ``[rows, Hq * D]`` at row ``q_start + m0`` (broadcast-Q: ``m0``),
    column ``dq_col + CID * D/2``: ``FUSED_DQ == 1`` through ``dq_stages`` and a TMA
    reduce-add to ``desc_dq``, ``FUSED_DQ == 2`` with fp32 atomics to ``DQ``.

    ``DQ_COLS`` (:func:`dq_cols`): the columns of dQ a warpgroup computes at once, D/2 as above
    or, at D 64 (whose halves of K, 32 columns, would fall off its 128-byte swizzle), the whole
    row: then the warpgroup whose ``CID`` is the step's parity computes dQ = dS K over both K
    tiles and writes it, and the other goes straight on to its next step (every other step
    each, so the two stay balanced)."""
    for m0 in range(start, end, BLOCK_M):
        # OPAQUE_INDEX: K/V descriptors rebuilt each step instead of hoisted out of the loop and
        # spilled (the one pass: 12.6 -> 9.8 ms; the two passes' dK/dV: no gain, bench/NOTES.md)
        if OPAQUE_INDEX:
            zero = opaque_zero(q_cnt)
        else:
            zero = 0
        k_buf = k_tiles[CID + zero]
        v_buf = v_tiles[CID + zero]
        rows = m0 + tl.arange(0, BLOCK_M)
        q_buf, slot = ring_acquire(q_tiles, q_fulls, q_cnt, NUM_Q)
        do_buf = do_tiles[slot]
        st = tlx.async_dot(k_buf, tlx.local_trans(q_buf))
        dpt = tlx.async_dot(v_buf, tlx.local_trans(do_buf))
        # The packed vectors (backward_vectors), loaded by the producer with Q and dO: rows
        # past lq are padding, lse2 = +inf (P = 0) and delta 0, so they add nothing (to dQ
        # either: their dS is exactly 0, so the reduce-add into the next sequence's rows adds 0).
        lse2 = tlx.local_load(lse_tiles[slot])
        delta = tlx.local_load(delta_tiles[slot])
        st = tlx.async_dot_wait(1, st)
        pt = tl.math.exp2(st * qk_scale2 - lse2)
        if MASKED:
            q_lo, q_hi = band_bounds(rows, lq, lk, left, right, BOUNDED_LEFT, BOUNDED_RIGHT)
            pt = tl.where(bounds_mask(kv_rows[:, None], q_lo[None, :], q_hi[None, :], BOUNDED_LEFT), pt, 0.0)
        dpt = tlx.async_dot_wait(0, dpt)
        dv = tlx.async_dot(pt.to(DTYPE), do_buf, dv)
        dst = (pt * (dpt - delta)).to(DTYPE)
        if FUSED_DQ > 0:
            pair = 2 * (q_cnt % 2)
            ds_buf = ds_tiles[pair + CID]
        else:
            ds_buf = ds_tiles[CID]
        tlx.local_store(ds_buf, dst)
        tlx.fence("async_shared")  # (Triton's barrier pass syncs the warpgroup here)
        dk = tlx.async_dot(ds_buf, q_buf, dk)
        if FUSED_DQ > 0:
            # Both halves of dS^T are in shared memory once both warpgroups pass here; the
            # other pair of buffers is free: both finished the previous step's dQ before it
            # (the one that computes it, with whole rows, arrives here only after it has).
            tlx.named_barrier_wait(11, 256)
            q_row = _q_row(q_start, m0, Q_SHARED)
            if DQ_COLS == HEAD_DIM:
                # (dK and dV waited for outside the branch: a wgmma wait inside a run-time
                # branch on a product issued before it does not compile)
                dk = tlx.async_dot_wait(0, dk)
                dv = tlx.async_dot_wait(0, dv)
                ring_release(q_empties, slot)  # dQ reads dS and K only
                if q_cnt % 2 == CID:
                    dq = tlx.async_dot(tlx.local_trans(ds_tiles[pair]), k_tiles[zero])
                    dq = tlx.async_dot(tlx.local_trans(ds_tiles[pair + 1]), k_tiles[1 + zero], dq)
                    dq = tlx.async_dot_wait(0, dq)
                    _dq_write(dq, desc_dq, dq_stages, q_cnt // 2, q_row, dq_col, DQ, stride_acc, rows, lq, CID, FUSED_DQ, DQ_STAGES, DQ_COLS, BLOCK_M)
            else:
                dq = tlx.async_dot(
                    tlx.local_trans(ds_tiles[pair]), tlx.local_slice(k_tiles[zero], [0, CID * DQ_COLS], [HALF, DQ_COLS])
                )
                dq = tlx.async_dot(
                    tlx.local_trans(ds_tiles[pair + 1]), tlx.local_slice(k_tiles[1 + zero], [0, CID * DQ_COLS], [HALF, DQ_COLS]), dq
                )
                dq = tlx.async_dot_wait(0, dq)
                dk = tlx.async_dot_wait(0, dk)
                dv = tlx.async_dot_wait(0, dv)
                ring_release(q_empties, slot)  # released before the dQ write-back
                _dq_write(dq, desc_dq, dq_stages, q_cnt, q_row, dq_col + CID * DQ_COLS, DQ, stride_acc, rows, lq, CID, FUSED_DQ, DQ_STAGES, DQ_COLS, BLOCK_M)
        else:
            dk = tlx.async_dot_wait(0, dk)
            dv = tlx.async_dot_wait(0, dv)
            ring_release(q_empties, slot)
        q_cnt += 1
    return dk, dv, q_cnt


@triton.jit
def _dkdv_kernel(
    desc_q, desc_k, desc_v, desc_do, DK, DV, desc_lse2, desc_delta, VEC_TILE, q_offsets, kv_offsets, TILES, COUNT,
    COUNTER, stride_dkt, stride_dkh, stride_dvt, stride_dvh, scale, left, right,
    desc_dq, DQ, stride_acc, heads,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_Q: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr,
    ZIGZAG: tl.constexpr, Q_SHARED: tl.constexpr = False, FUSED_DQ: tl.constexpr = 0,
    DQ_STAGES: tl.constexpr = 1, OPAQUE_INDEX: tl.constexpr = False, PAD: tl.constexpr = 64,
    HEAD_MAJOR: tl.constexpr = False, DYNAMIC: tl.constexpr = False, DQ_COLS: tl.constexpr = 64,
):
    """dK and dV of kv-tiles of BLOCK_N rows (one per Plan row of the dK/dV pass), summed over
    the GQA group, and with ``FUSED_DQ`` (1: TMA reduce-add, 2: atomics) each tile's share of
    dQ, added into an fp32 accumulator (``FUSED_DQ == 0``: dQ and delta come from the portable
    dQ pass, which runs first). A producer streams K/V once per tile and Q/dO through a ring
    of NUM_Q slots; two consumer warpgroups take 64 kv rows each and share every Q/dO slot.
    ``desc_lse2``, ``desc_delta`` (TMA descriptors over ``[Hq, vec_rows]``, blocks of
    ``[1, BLOCK_M]``) and ``VEC_TILE``: the packed vectors of :func:`backward_vectors`
    (``PAD``: :data:`VEC_PAD`), which the producer loads with each step's Q and dO (the
    consumers once loaded them from global memory at the top of each step, and waited for
    them: 11 % of all stall samples, bench/NOTES.md session 8). ``heads``, ``HEAD_MAJOR``, ``COUNTER``,
    ``DYNAMIC``, ``ZIGZAG``: the walk of the table (:func:`_walk_first`, :func:`_plan_row`)."""
    HALF: tl.constexpr = BLOCK_N // 2
    dtype: tl.constexpr = tlx.dtype_of(desc_q)
    ELEM: tl.constexpr = tlx.size_of(dtype)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)

    k_tiles = tlx.local_alloc((HALF, HEAD_DIM), dtype, 2)
    v_tiles = tlx.local_alloc((HALF, HEAD_DIM), dtype, 2)
    q_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), dtype, NUM_Q)
    do_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), dtype, NUM_Q)
    lse_tiles = tlx.local_alloc((1, BLOCK_M), tl.float32, NUM_Q)
    delta_tiles = tlx.local_alloc((1, BLOCK_M), tl.float32, NUM_Q)
    if FUSED_DQ > 0:
        # dS^T, one per consumer, double-buffered by step (the dQ product reads both)
        ds_tiles = tlx.local_alloc((HALF, BLOCK_M), dtype, 4)
        dq_stages = tlx.local_alloc((BLOCK_M, DQ_COLS), tl.float32, 2 * DQ_STAGES)  # per consumer
    else:
        ds_tiles = tlx.local_alloc((HALF, BLOCK_M), dtype, 2)  # dS^T, one per consumer
        dq_stages = k_tiles  # unused
    kv_fulls = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    kv_empties = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    q_fulls = tlx.alloc_barriers(num_barriers=NUM_Q, arrive_count=1)
    q_empties = tlx.alloc_barriers(num_barriers=NUM_Q, arrive_count=2)
    ids = tlx.local_alloc((1,), tl.int32, ID_RING)  # the tile-index ring (DYNAMIC)
    id_fulls = tlx.alloc_barriers(num_barriers=ID_RING, arrive_count=1)
    id_empties = tlx.alloc_barriers(num_barriers=ID_RING, arrive_count=2)

    with tlx.async_tasks():
        with tlx.async_task("default", registers=24):  # producer: TMA loads
            count = tl.load(COUNT).to(tl.int32)
            q_cnt = 0
            tile_cnt = 0
            i, r = _walk_first(pid, COUNTER, ids, id_fulls, id_empties, True, DYNAMIC)
            while i < count:
                i_next, r = _walk_next(i, r, pid, nprog, COUNTER, ids, id_fulls, id_empties, True, DYNAMIC, ZIGZAG)
                ok, b, hk, n0 = _plan_row(i, TILES, count, heads, HEAD_MAJOR)
                q_start, lq, k_start, lk = _starts(q_offsets, kv_offsets, b)
                if ok & (n0 < lk):
                    lo, full_lo, full_hi, hi = dkdv_q_range(n0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
                    for c in tl.static_range(2):
                        tlx.barrier_wait(kv_empties[c], (tile_cnt & 1) ^ 1)
                        tlx.barrier_expect_bytes(kv_fulls[c], 2 * ELEM * HALF * HEAD_DIM)
                        tlx.async_descriptor_load(desc_k, k_tiles[c], [k_start + n0 + c * HALF, hk * HEAD_DIM], kv_fulls[c])
                        tlx.async_descriptor_load(desc_v, v_tiles[c], [k_start + n0 + c * HALF, hk * HEAD_DIM], kv_fulls[c])
                    vec0 = tl.load(VEC_TILE + b) * PAD
                    for g in range(GROUP):
                        head = hk * GROUP + g
                        col = head * HEAD_DIM
                        for m0 in range(lo, hi, BLOCK_M):
                            slot, phase = ring_slot(q_cnt, NUM_Q)
                            tlx.barrier_wait(q_empties[slot], phase ^ 1)
                            tlx.barrier_expect_bytes(q_fulls[slot], 2 * ELEM * BLOCK_M * HEAD_DIM + 2 * 4 * BLOCK_M)
                            tlx.async_descriptor_load(desc_q, q_tiles[slot], [_q_row(q_start, m0, Q_SHARED), col], q_fulls[slot])
                            tlx.async_descriptor_load(desc_do, do_tiles[slot], [q_start + m0, col], q_fulls[slot])
                            tlx.async_descriptor_load(desc_lse2, lse_tiles[slot], [head, vec0 + m0], q_fulls[slot])
                            tlx.async_descriptor_load(desc_delta, delta_tiles[slot], [head, vec0 + m0], q_fulls[slot])
                            q_cnt += 1
                    tile_cnt += 1
                i = i_next

        with tlx.async_task(num_warps=4, registers=240, replicate=2):  # consumers
            cid: tl.constexpr = tlx.async_task_replica_id()
            qk_scale2 = scale * LOG2E
            count = tl.load(COUNT).to(tl.int32)
            q_cnt = 0
            tile_cnt = 0
            i, r = _walk_first(pid, COUNTER, ids, id_fulls, id_empties, False, DYNAMIC)
            while i < count:
                ok, b, hk, n0 = _plan_row(i, TILES, count, heads, HEAD_MAJOR)
                q_start, lq, k_start, lk = _starts(q_offsets, kv_offsets, b)
                if ok & (n0 < lk):
                    lo, full_lo, full_hi, hi = dkdv_q_range(n0, lq, lk, left, right, BLOCK_M, BLOCK_N, BOUNDED_LEFT, BOUNDED_RIGHT)
                    if FUSED_DQ > 0:  # noqa: SIM102 (a compile-time branch around a run-time one)
                        if n0 + BLOCK_N > lk:
                            # A tile past the sequence's end runs masked throughout: its rows past
                            # lk hold the next sequence's keys, whose dS must not reach dQ.
                            full_lo = lo
                            full_hi = lo
                    kv_rows = n0 + cid * HALF + tl.arange(0, HALF)
                    tlx.barrier_wait(kv_fulls[cid], tile_cnt & 1)
                    dk = tl.zeros([HALF, HEAD_DIM], tl.float32)
                    dv = tl.zeros([HALF, HEAD_DIM], tl.float32)
                    for g in range(GROUP):
                        dq_col = (hk * GROUP + g) * HEAD_DIM
                        dk, dv, q_cnt = _dkdv_steps(dk, dv, k_tiles, v_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles, q_fulls, q_empties, kv_rows, q_cnt, lo, full_lo, lq, lk, qk_scale2, left, right, desc_dq, ds_tiles, dq_stages, q_start, dq_col, DQ, stride_acc, cid, dtype, BLOCK_M, NUM_Q, BOUNDED_LEFT, BOUNDED_RIGHT, True, FUSED_DQ, Q_SHARED, HEAD_DIM, HALF, DQ_STAGES, OPAQUE_INDEX, DQ_COLS)
                        dk, dv, q_cnt = _dkdv_steps(dk, dv, k_tiles, v_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles, q_fulls, q_empties, kv_rows, q_cnt, full_lo, full_hi, lq, lk, qk_scale2, left, right, desc_dq, ds_tiles, dq_stages, q_start, dq_col, DQ, stride_acc, cid, dtype, BLOCK_M, NUM_Q, BOUNDED_LEFT, BOUNDED_RIGHT, False, FUSED_DQ, Q_SHARED, HEAD_DIM, HALF, DQ_STAGES, OPAQUE_INDEX, DQ_COLS)
                        dk, dv, q_cnt = _dkdv_steps(dk, dv, k_tiles, v_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles, q_fulls, q_empties, kv_rows, q_cnt, full_hi, hi, lq, lk, qk_scale2, left, right, desc_dq, ds_tiles, dq_stages, q_start, dq_col, DQ, stride_acc, cid, dtype, BLOCK_M, NUM_Q, BOUNDED_LEFT, BOUNDED_RIGHT, True, FUSED_DQ, Q_SHARED, HEAD_DIM, HALF, DQ_STAGES, OPAQUE_INDEX, DQ_COLS)
                    tlx.barrier_arrive(kv_empties[cid], 1)
                    valid = kv_rows < lk
                    offs_d = tl.arange(0, HEAD_DIM)
                    out_rows = (k_start + kv_rows).to(tl.int64)
                    tl.store(DK + out_rows[:, None] * stride_dkt + hk * stride_dkh + offs_d[None, :], (dk * scale).to(dtype), mask=valid[:, None])
                    tl.store(DV + out_rows[:, None] * stride_dvt + hk * stride_dvh + offs_d[None, :], dv.to(dtype), mask=valid[:, None])
                    tile_cnt += 1
                i, r = _walk_next(i, r, pid, nprog, COUNTER, ids, id_fulls, id_empties, False, DYNAMIC, ZIGZAG)
            if FUSED_DQ == 1:
                tlx.async_descriptor_store_wait(0)  # the stages must outlive their last stores


def _deal(plan, pass_: str) -> tuple[torch.Tensor, dict]:
    """How a launch deals ``pass_``'s table to the programs: the kernel's ``COUNTER`` argument,
    and its ``DYNAMIC`` (the producer takes tiles from that atomic counter, :func:`_walk_first`)
    and ``ZIGZAG`` (``jagflash.core.schedule.deal_flags``, as for the portable kernels)."""
    dynamic, zigzag = deal_flags(plan.info, pass_)
    return tile_counter(plan, pass_), {"DYNAMIC": dynamic, "ZIGZAG": zigzag}


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seqlen_q: int,
    *,
    left: int,
    right: int,
    scale: float,
    pipeline: bool = True,
    plan=None,
    q_shared: bool = False,
    walk: str | None = None,
    q_bufs: int = 2,
    ring_tiles: bool | None = None,
    lse_per_sequence: bool = False,
    idle_half: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """O ``[Tq, Hq, D]`` and LSE ``[Hq, Tq]`` fp32 (inputs are made contiguous: TMA needs it).
    ``lse_per_sequence``: LSE ``[B, Hq, L]`` instead, stored so by the kernel, for batches whose
    B sequences all have L = Tq / B queries (dense, broadcast-Q; ``q_offsets`` = ``arange(B + 1)
    * L``, which is the caller's to guarantee).

    ``q_shared`` (broadcast-Q): ``q`` is one block ``[Lq, Hq, D]`` that every sequence reads,
    ``q_offsets`` must then be ``arange(B + 1) * Lq`` and ``Tq = B * Lq`` (the output rows).

    ``plan``: a :class:`jagflash.core.schedule.Plan` whose forward pass has 128-row q-tiles
    (built here, with the default schedule, when not given): its table sets the tile order,
    dealt zigzag for a grouped or static plan, taken from an atomic counter for a dynamic one.

    ``pipeline``: the consumer version. ``True`` (default): version 2, software-pipelined (QK^T
    of tile j in flight while P V of tile j-1 issues); ``False``: version 1 (no overlap inside a
    warpgroup), kept as the plainest form of the loop and for A/B (``python -m
    jagflash.core.tlx_attention``). Measured on the H200, kernels alone, bf16 D128 (bench/NOTES.md,
    session 5): v2 3.11 ms vs v1 3.38 on the lognormal batch, causal 2.00 vs 2.12.

    A positive ``scale`` rides in the exponent's fused multiply-add (``FOLD_SCALE``: 561 -> 464
    SASS instructions per kv-tile, +5-8 % measured); a zero or negative one multiplies the scores
    first (the running max must be taken on the scaled scores).

    ``walk``: the order the programs walk the plan's table in: ``"slot"`` (as laid out: every
    head of a tile slot, then the next slot) or ``"head"`` (one head's slots at a time, for L2
    locality; see ``_plan_row``); ``None`` (default): :func:`default_walk`.

    ``q_bufs``: Q tiles in flight per program; 2 lets the producer load the next tile's Q (and
    so its first K/V) while the consumers run this one (default 2). Measured on the H200, kernels
    alone, bf16 H16 D128 (bench/NOTES.md, session 8), 2 against 1: faster on every batch, lognormal +0.5 %, causal
    +0.7 %, dense 4x4096 +0.7 % / causal +2.1 %, 2,048 sequences of 1-63 tokens +2.3 % /
    causal +4.8 % (session 5's 33 % loss on dense causal, on older kernels, did not recur).

    ``ring_tiles``: the producer alone walks the table and hands each decoded tile (head, rows,
    the sequence's starts and lengths) to the consumers through shared memory (``RING_TILES``),
    instead of each consumer warpgroup reading the table row and the offsets itself at every
    tile start: three dependent global loads, ~19 % of the stall samples of the tiny batch's
    forward (ncu, bench/NOTES.md session 8). ``None`` (default): on where the batch's K/V
    sequences average at most one K/V tile (:func:`default_ring_tiles`).

    ``idle_half`` (default ``True``): a consumer warpgroup whose 64 rows of a q-tile all lie
    past the sequence's end issues no matmul there (``IDLE_HALF``, :func:`_pass_kv_tiles`):
    the second half of every tile of a sequence of at most 64 queries (broadcast-Q with
    Lq <= 64, short jagged sequences) and of the last tile where Lq % 128 is 1-64. ``False``
    computes those rows and discards them (kept for A/B: they take the tensor cores from the
    other warpgroup)."""
    reasons = _walk_reasons(walk)
    if q_bufs not in (1, 2):
        reasons.append(f"q_bufs must be 1 or 2, got {q_bufs!r}")
    n_seqs = q_offsets.numel() - 1
    tq = n_seqs * q.shape[0] if q_shared else q.shape[0]
    if lse_per_sequence and n_seqs and tq % n_seqs:
        reasons.append(f"lse_per_sequence needs sequences of one length: {tq} query rows in {n_seqs} sequences")
    if reasons:
        raise ValueError("tlx_attention.forward: " + "; ".join(reasons))
    q, k, v = (t.contiguous() for t in (q, k, v))
    _, hq, dim = q.shape
    hkv = k.shape[1]
    out = alloc((tq, hq, dim), q.dtype, q.device)
    if lse_per_sequence:
        rows = tq // n_seqs if n_seqs else 0
        lse = alloc((n_seqs, hq, rows), torch.float32, q.device)
        lse_strides = (rows, hq)  # q_start = b L: b Hq L + h L + row
    else:
        lse = alloc((hq, tq), torch.float32, q.device)
        lse_strides = (tq, 1)
    if plan is None:
        schedule, _ = default_schedules("tlx-sm90", dim, window=(left, right))
        plan = make_plan(
            q_offsets, kv_offsets, total_q=tq, total_kv=k.shape[0], heads_q=hq, heads_kv=hkv,
            window=(left, right), block_m=BLOCK_M, block_n=BLOCK_N, max_seqlen_q=max_seqlen_q,
            backward=False, schedule=schedule,
        )
    lay = plan.info.layout("fwd")
    if lay.block_m != BLOCK_M:
        raise ValueError(f"the plan's forward tiles have {lay.block_m} rows; this kernel takes {BLOCK_M}")
    if tq == 0 or lay.rows == 0:
        return out, lse
    if k.shape[0] == 0:  # no keys anywhere: every row sees nothing (no descriptor over 0 rows)
        return out.zero_(), lse.fill_(float("-inf"))
    if ring_tiles is None:
        ring_tiles = default_ring_tiles(plan.info.total_kv, plan.info.batch)
    programs = min(num_workers(q.device), lay.rows)
    counter, deal = _deal(plan, "fwd")
    _fwd_kernel[(programs,)](
        rows_descriptor(q, BLOCK_M // 2, dim), rows_descriptor(k, BLOCK_N, dim),
        rows_descriptor(v, BLOCK_N, dim), out, lse, q_offsets, kv_offsets,
        plan.section("fwd"), plan.meta[PASSES.index("fwd"):], counter,
        out.stride(0), out.stride(1), *lse_strides, scale, left, right, lay.heads, **deal,
        **kernel_flags(hq, hkv, dim, left, right), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, NUM_KV=NUM_KV,
        PIPELINE=pipeline, Q_SHARED=q_shared, Q_BUFS=q_bufs, RING_TILES=ring_tiles, IDLE_HALF=idle_half,
        FOLD_SCALE=scale > 0, HEAD_MAJOR=_head_major(walk, left, right, deal["DYNAMIC"]), num_warps=4, num_stages=1,
    )
    return out, lse


@triton.jit
def _vectors_kernel(
    O, DO, LSE, DELTA_IN, LSE2, DELTA, q_offsets, VEC_TILE, vec_rows, n_seqs, search_steps,
    stride_ot, stride_oh, stride_dot, stride_doh, stride_lh, stride_ls,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, GIVEN_DELTA: tl.constexpr, PAD: tl.constexpr,
):
    """The backward's preprocess: ``BLOCK`` rows of head ``program_id(1)`` of the packed
    ``[Hq, vec_rows]`` vectors, each written once. Packed row ``p`` lies in the PAD-row tile
    ``p // PAD``, owned by sequence ``b`` (a binary search over ``VEC_TILE``'s tile prefix sum,
    zero-length sequences skipped); it is that sequence's query ``r = p - VEC_TILE[b] * PAD``
    if ``r`` is under its length: log2 LSE (``lse_to_log2``) and delta = rowsum(dO * O) (or
    ``DELTA_IN``, laid out as LSE, when ``GIVEN_DELTA``); else padding, lse2 = +inf (P = 0) and
    delta = 0. LSE (and DELTA_IN) are ``[Hq, Tq]`` (``stride_lh`` Tq, ``stride_ls`` 1) or ``[B,
    Hq, L]`` (L, Hq): the value of query r of sequence b is at ``h * stride_lh + q_offsets[b] *
    stride_ls + r``."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    h = tl.program_id(1).to(tl.int64)
    in_range = p < vec_rows
    b = upper_bound(VEC_TILE + 1, n_seqs, p // PAD, search_steps)  # n_seqs: past the last tile
    owned = b < n_seqs
    q_start = tl.load(q_offsets + b).to(tl.int64)
    length = tl.load(q_offsets + b + 1, mask=owned, other=0).to(tl.int64) - q_start
    r = p - tl.load(VEC_TILE + b).to(tl.int64) * PAD
    valid = in_range & owned & (r < length)
    at = h * stride_lh + q_start * stride_ls + r
    if GIVEN_DELTA:
        delta = tl.load(DELTA_IN + at, mask=valid, other=0.0)
    else:
        offs_d = tl.arange(0, HEAD_DIM)
        r64 = (q_start + r)[:, None]
        o = tl.load(O + r64 * stride_ot + h * stride_oh + offs_d[None, :], mask=valid[:, None], other=0.0)
        do = tl.load(DO + r64 * stride_dot + h * stride_doh + offs_d[None, :], mask=valid[:, None], other=0.0)
        delta = attn_delta(o, do)
    lse2 = tl.where(valid, lse_to_log2(tl.load(LSE + at, mask=valid, other=0.0)), float("inf"))
    tl.store(LSE2 + h * vec_rows + p, lse2, mask=in_range)
    tl.store(DELTA + h * vec_rows + p, delta, mask=in_range)


def backward_vectors(
    lse: torch.Tensor,
    q_offsets: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    dout: torch.Tensor | None = None,
    delta: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The dK/dV kernel's per-query vectors, packed (see :data:`VEC_PAD`): ``(lse2, delta,
    vec_tile)``, ``lse2`` and ``delta`` ``[Hq, vec_rows]`` fp32 and ``vec_tile`` ``[B + 1]`` int32,
    sequence ``b``'s rows starting at row ``vec_tile[b] * VEC_PAD``. ``lse`` ``[Hq, Tq]``, or
    ``[B, Hq, L]`` for sequences of one length L (:func:`forward`'s ``lse_per_sequence``); delta
    = rowsum(dO * O) of ``out`` and ``dout`` (``[Tq, Hq, D]``), or given (laid out as ``lse``,
    from the portable dQ pass). One kernel writes every packed row, padding included (no
    fills); for sequences of one length ``vec_tile`` is ``arange(B + 1) * ceil(L / VEC_PAD)``,
    kept in plain eager mode (``core.ops.stepped_arange``). No host synchronisation:
    ``vec_rows`` is the bound ``Tq + VEC_PAD * B``."""
    n_seqs = q_offsets.numel() - 1
    if lse.dim() == 3:
        _, hq, length = lse.shape
        tq, lse_strides = n_seqs * length, (length, hq)
        vec_tile = stepped_arange(n_seqs + 1, triton.cdiv(length, VEC_PAD), lse.device, torch.int32, (lse, q_offsets))
    else:
        hq, tq = lse.shape
        lse_strides = (tq, 1)
        vec_tile = torch.zeros(n_seqs + 1, dtype=torch.int32, device=lse.device)
        vec_tile[1:] = torch.cumsum(torch.div(seq_lengths(q_offsets) + VEC_PAD - 1, VEC_PAD, rounding_mode="floor"), 0)
    vec_rows = triton.cdiv(tq + VEC_PAD * n_seqs, 16) * 16  # 16-divisible: aligned per-head rows
    if not (tq and n_seqs):
        lse2 = torch.full((hq, vec_rows), float("inf"), dtype=torch.float32, device=lse.device)
        return lse2, torch.zeros_like(lse2), vec_tile
    lse2 = torch.empty((hq, vec_rows), dtype=torch.float32, device=lse.device)
    packed_delta = torch.empty_like(lse2)
    given = delta is not None
    if given:
        delta = delta.contiguous()
        out = dout = delta  # unused
        strides = (0, 0, 0, 0)
        dim = 16
    else:
        out, dout = out.contiguous(), dout.contiguous()
        strides = (out.stride(0), out.stride(1), dout.stride(0), dout.stride(1))
        dim = out.shape[-1]
        delta = lse  # unused
    block = 64
    _vectors_kernel[(triton.cdiv(vec_rows, block), hq)](
        out, dout, lse.contiguous(), delta, lse2, packed_delta, q_offsets, vec_tile, vec_rows,
        n_seqs, n_seqs.bit_length(), *strides, *lse_strides, HEAD_DIM=dim, BLOCK=block, GIVEN_DELTA=given,
        PAD=VEC_PAD, num_warps=4,
    )
    return lse2, packed_delta, vec_tile


def _dkdv_plan(plan, q_offsets, kv_offsets, tq, tk, hq, hkv, dim, left, right, blocks, who):
    """The plan (made with the TLX kernels' default schedules if none was given) and its dK/dV
    layout, whose tiles must be ``blocks``."""
    if plan is None:
        schedule, backward_schedule = default_schedules("tlx-sm90", dim, window=(left, right))
        plan = make_plan(
            q_offsets, kv_offsets, total_q=tq, total_kv=tk, heads_q=hq, heads_kv=hkv,
            window=(left, right), block_m=BLOCK_M, block_n=BLOCK_N, dkdv_blocks=blocks, backward=True,
            schedule=schedule, backward_schedule=backward_schedule,
        )
    lay = plan.info.layout("dkdv")
    if (lay.block_m, lay.block_n) != tuple(blocks):
        raise ValueError(
            f"the plan's dK/dV tiles are {lay.block_m}x{lay.block_n}; {who} takes "
            f"{blocks[0]}x{blocks[1]}"
        )
    return plan, lay


def _launch_dkdv(dout, q, k, v, vectors, q_offsets, kv_offsets, dk, dv, plan, lay, dq_acc,
                 left, right, scale, q_shared, dq_write="tma", walk=None):
    """One launch of :func:`_dkdv_kernel`; ``vectors``: :func:`backward_vectors`'s; ``dq_acc``
    (fp32 ``[rows, Hq * D]``) fuses dQ in (and then K/V are indexed opaquely: ``OPAQUE_INDEX``)."""
    _, hq, dim = q.shape
    hkv = k.shape[1]
    programs = min(num_workers(q.device), lay.rows)
    block_m, block_n = lay.block_m, lay.block_n
    if dq_acc is None:
        desc_dq = rows_descriptor(q, block_m, dim)  # unused
    else:
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc_dq = TensorDescriptor(
            dq_acc, shape=list(dq_acc.shape), strides=[dq_acc.stride(0), 1],
            block_shape=[block_m, dq_cols(dim)],
        )
    counter, deal = _deal(plan, "dkdv")
    _dkdv_kernel[(programs,)](
        rows_descriptor(q, block_m, dim), rows_descriptor(k, block_n // 2, dim),
        rows_descriptor(v, block_n // 2, dim), rows_descriptor(dout, block_m, dim),
        dk, dv, *(vectors_descriptor(x, block_m) for x in vectors[:2]), vectors[2], q_offsets, kv_offsets,
        plan.section("dkdv"), plan.meta[PASSES.index("dkdv"):], counter,
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
        scale, left, right, desc_dq,
        dk if dq_acc is None else dq_acc, 0 if dq_acc is None else dq_acc.stride(0), lay.heads,
        **deal, **kernel_flags(hq, hkv, dim, left, right), BLOCK_M=block_m, BLOCK_N=block_n,
        NUM_Q=NUM_Q, Q_SHARED=q_shared, FUSED_DQ=0 if dq_acc is None else DQ_WRITES[dq_write],
        DQ_STAGES=DQ_STAGES, OPAQUE_INDEX=dq_acc is not None, PAD=VEC_PAD, HEAD_MAJOR=_head_major(walk, left, right, deal["DYNAMIC"]), DQ_COLS=dq_cols(dim),
        num_warps=4, num_stages=1,
    )


def backward_dkdv(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    left: int,
    right: int,
    scale: float,
    plan=None,
    q_shared: bool = False,
    walk: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dK ``[Tk, Hkv, D]`` and dV of jagged attention, given LSE and delta = rowsum(dO * O)
    (both ``[Hq, Tq]`` fp32, or both ``[B, Hq, L]``: :func:`backward_vectors`; the portable dQ
    pass computes delta): the second pass of the
    deterministic backward (no atomics, no reduce-adds). ``q_shared``: broadcast-Q, as for
    :func:`forward` (``dout`` then has the ``B * Lq`` rows). ``walk``: as for :func:`forward`."""
    reasons = _walk_reasons(walk)
    if reasons:
        raise ValueError("tlx_attention.backward_dkdv: " + "; ".join(reasons))
    q, k, v, dout = (t.contiguous() for t in (q, k, v, dout))
    tq = dout.shape[0]  # the rows of dO, LSE and delta (B * Lq for broadcast-Q: see forward)
    dk, dv = alloc_like(k), alloc_like(v)
    blocks = tlx_sm90_blocks(q.shape[-1])["dkdv"]
    plan, lay = _dkdv_plan(plan, q_offsets, kv_offsets, tq, k.shape[0], q.shape[1], k.shape[1], q.shape[-1], left, right, blocks, "the dK/dV pass")
    if k.shape[0] == 0 or lay.rows == 0:
        return dk, dv
    if tq == 0:  # no queries anywhere: no gradient (and no descriptor over 0 rows)
        return dk.zero_(), dv.zero_()
    vectors = backward_vectors(lse, q_offsets, delta=delta)
    _launch_dkdv(dout, q, k, v, vectors, q_offsets, kv_offsets, dk, dv, plan, lay, None, left, right, scale, q_shared, walk=walk)
    return dk, dv


def backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    left: int,
    right: int,
    scale: float,
    plan=None,
    q_shared: bool = False,
    dq_write: str = "tma",
    walk: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of jagged attention in one pass over the kv-tiles (after the delta
    preprocess): dK/dV stay in registers and each tile adds its share of dQ into an fp32
    accumulator, so dQ's summation order varies from run to run. ``out``, ``dout``:
    ``[Tq, Hq, D]``; ``lse`` ``[Hq, Tq]`` (or ``[B, Hq, L]``: :func:`backward_vectors`). ``q_shared`` (broadcast-Q, as for :func:`forward`):
    dQ ``[Lq, Hq, D]`` is summed over the sequences by the same adds.

    ``dq_write``: ``"tma"`` (the staged TMA reduce-add of
    :func:`jagflash.core.pipeline.dq_reduce_add`) or ``"atomic"`` (fp32 atomics from
    registers: 1.9x slower on the H200, kept as the plainest reference of the same sum).
    ``walk``: as for :func:`forward`."""
    reasons = []
    if dq_write not in DQ_WRITES:
        reasons.append(f"dq_write must be one of {sorted(DQ_WRITES)}, got {dq_write!r}")
    reasons += _walk_reasons(walk)
    if q.shape[-1] not in ONE_PASS_HEAD_DIMS:
        reasons.append(
            f"the one-pass backward takes head dims {ONE_PASS_HEAD_DIMS} (its dQ tiles are 64 columns "
            f"wide, the 128-byte swizzle of 16-bit K), got {q.shape[-1]}: run the two passes"
        )
    if reasons:
        raise ValueError("tlx_attention.backward: " + "; ".join(reasons))
    q, k, v, dout = (t.contiguous() for t in (q, k, v, dout))
    lq, hq, dim = q.shape
    tq = dout.shape[0]
    dk, dv = alloc_like(k), alloc_like(v)
    blocks = (ONE_PASS_BLOCK_M, tlx_sm90_blocks(dim)["dkdv"][1])
    plan, lay = _dkdv_plan(plan, q_offsets, kv_offsets, tq, k.shape[0], hq, k.shape[1], dim, left, right, blocks, "the one-pass backward")
    # The accumulator has dQ's layout in fp32 (queries as rows; broadcast-Q: the Lq shared rows,
    # which every sequence adds into). A q-tile that runs past its sequence's end adds exact
    # zeros into the next sequence's rows (TMA clips the rows past the last). Zeroed, so rows
    # that no tile reaches get dQ = 0.
    acc = torch.zeros((lq, hq * dim), dtype=torch.float32, device=q.device)
    if k.shape[0] and lay.rows and tq:
        vectors = backward_vectors(lse, q_offsets, out=out, dout=dout)
        _launch_dkdv(dout, q, k, v, vectors, q_offsets, kv_offsets, dk, dv, plan, lay, acc, left, right, scale, q_shared, dq_write, walk)
    else:
        dk.zero_()
        dv.zero_()
    dq = torch.empty_like(q)
    torch.mul(acc.view(lq, hq, dim), scale, out=dq)
    return dq, dk, dv


def _walk_suffix(head_major: bool, causal: bool, dynamic: bool) -> str:
    """A compile configuration's name names its walk only where it is not :func:`default_walk`'s,
    and a dynamic deal (the atomic tile counter) as ``_dynamic``."""
    walk = "head" if head_major else "slot"
    name = "" if walk == default_walk(-1, 0 if causal else -1, dynamic) else f"_{walk}walk"
    return name + ("_dynamic" if dynamic else "")


def compile_configs():
    """Every configuration :func:`forward` launches, for the sm_90a compile check on the CPU:
    ``(name, kernel, signature, constexprs, options)``."""
    configs = []
    for dtype in ("fp16", "bf16"):
        for dim in HEAD_DIMS:
            # What calls launch (schedule.default_schedules, default_walk): jagged and
            # broadcast-Q batches a dynamic plan walked head by head; dense unmasked a static
            # one walked head by head; a caller's static causal plan the slot walk.
            for causal, pipeline, shared, fold, head_major, dynamic, q_bufs, ring in (
                (False, True, False, True, True, True, 2, False), (True, True, False, True, True, True, 2, False),
                (False, True, False, True, True, False, 2, False), (True, True, False, True, False, False, 2, False),
                (False, False, False, True, True, False, 2, False), (True, False, False, True, False, False, 2, False),  # v1
                (False, True, True, True, True, True, 2, False), (False, True, True, True, True, True, 1, False),  # broadcast-Q (q_bufs=1: A/B)
                (False, True, False, False, True, True, 2, False), (True, True, False, False, True, True, 2, False),  # scale <= 0
                (False, True, False, True, False, False, 2, False),  # walk="slot" unmasked
                (False, True, False, True, True, True, 1, False), (True, True, False, True, True, True, 1, False),  # q_bufs=1 (A/B)
                # the decoded tile ring (default_ring_tiles: batches of short K/V sequences)
                (False, True, False, True, True, True, 2, True), (True, True, False, True, True, True, 2, True),
                (True, True, False, True, False, False, 2, True),  # static plan
                (False, True, True, True, True, True, 2, True),  # broadcast-Q
            ):
                signature = {
                    "desc_q": f"tensordesc<{dtype}[{BLOCK_M // 2},{dim}]>",
                    "desc_k": f"tensordesc<{dtype}[{BLOCK_N},{dim}]>",
                    "desc_v": f"tensordesc<{dtype}[{BLOCK_N},{dim}]>",
                    "O": f"*{dtype}", "LSE": "*fp32", "q_offsets": "*i32", "kv_offsets": "*i32",
                    "TILES": "*i32", "COUNT": "*i64", "COUNTER": "*i32" if dynamic else "*i64", "stride_ot": "i32:16",
                    "stride_oh": "i32:16", "stride_lh": "i32", "stride_ls": "i32", "scale": "fp32", "left": "i32",
                    "right": "i32", "heads": "i32",
                }
                constexprs = {
                    "GROUP": 1, "HEAD_DIM": dim, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N,
                    "NUM_KV": NUM_KV, "BOUNDED_LEFT": False, "BOUNDED_RIGHT": causal,
                    "PIPELINE": pipeline, "ZIGZAG": not dynamic, "Q_SHARED": shared,
                    "FOLD_SCALE": fold, "HEAD_MAJOR": head_major, "DYNAMIC": dynamic, "Q_BUFS": q_bufs,
                    "RING_TILES": ring, "IDLE_HALF": True,
                }
                for name in constexprs:
                    signature[name] = "constexpr"
                # version 2 carries P in fp32: a few per-tile values spill outside the kv loop
                # (8-68 B, none inside it; at D 64 only unfolded, in fp16; the dynamic walk's
                # tile-index ring adds a few, two Q tiles in flight 8 B on a static causal plan,
                # the decoded tile ring as much as the dynamic walk's, the idle half's branch
                # 4-8 B causal and none unmasked).
                configs.append((
                    f"tlx_fwd{'' if pipeline else '_v1'}{'' if fold else '_unfolded'}{_walk_suffix(head_major, causal, dynamic)}{'_q1' if q_bufs == 1 else ''}{'_ring' if ring else ''}{'_bq' if shared else ''} {dtype} d{dim}{' causal' if causal else ''}",
                    _fwd_kernel,
                    signature, constexprs, {"num_warps": 4, "num_stages": 1},
                    {64: 0 if fold else 8, 128: (60 if dynamic or ring else 36) if fold else 68}[dim] if pipeline else 0,
                ))
            # the one pass on a dynamic plan (jagged, broadcast-Q) and on dense unmasked's
            # static one; the two passes' dK/dV on batch order (portable dQ pass first)
            for causal, shared, fused, head_major, dynamic in (
                (False, False, True, True, True), (True, False, True, True, True), (False, True, True, True, True),
                (False, False, True, True, False), (True, False, True, False, False),
                (False, False, False, True, False), (True, False, False, False, False), (False, True, False, True, False),
                (False, False, True, False, False),  # walk="slot" unmasked
            ):
                if fused and dim not in ONE_PASS_HEAD_DIMS:
                    continue
                bm, bn = tlx_sm90_blocks(dim)["dkdv"]
                if fused:
                    bm = ONE_PASS_BLOCK_M
                signature = {
                    "desc_q": f"tensordesc<{dtype}[{bm},{dim}]>",
                    "desc_k": f"tensordesc<{dtype}[{bn // 2},{dim}]>",
                    "desc_v": f"tensordesc<{dtype}[{bn // 2},{dim}]>",
                    "desc_do": f"tensordesc<{dtype}[{bm},{dim}]>",
                    "DK": f"*{dtype}", "DV": f"*{dtype}", "desc_lse2": f"tensordesc<fp32[1,{bm}]>", "desc_delta": f"tensordesc<fp32[1,{bm}]>", "VEC_TILE": "*i32",
                    "q_offsets": "*i32", "kv_offsets": "*i32", "TILES": "*i32", "COUNT": "*i64",
                    "COUNTER": "*i32" if dynamic else "*i64", "stride_dkt": "i32:16", "stride_dkh": "i32:16", "stride_dvt": "i32:16", "stride_dvh": "i32:16",
                    "scale": "fp32", "left": "i32", "right": "i32",
                    "desc_dq": f"tensordesc<fp32[{bm},{dq_cols(dim)}]>" if fused else f"tensordesc<{dtype}[{bm},{dim}]>",
                    "DQ": "*fp32", "stride_acc": "i32:16", "heads": "i32",
                }
                constexprs = {
                    "GROUP": 1, "HEAD_DIM": dim, "BLOCK_M": bm, "BLOCK_N": bn,
                    "NUM_Q": NUM_Q, "BOUNDED_LEFT": False, "BOUNDED_RIGHT": causal, "ZIGZAG": not dynamic,
                    "Q_SHARED": shared, "FUSED_DQ": DQ_WRITES["tma"] if fused else 0, "DQ_STAGES": DQ_STAGES,
                    "OPAQUE_INDEX": fused, "PAD": VEC_PAD, "HEAD_MAJOR": head_major, "DYNAMIC": dynamic,
                    "DQ_COLS": dq_cols(dim),
                }
                for name in constexprs:
                    signature[name] = "constexpr"
                # Known spills of the dK/dV kernel (dK and dV of 64 x D fp32 each stay in
                # registers beside the 64-query S^T / dP^T tiles, and in the one pass its dQ
                # tile; the masked steps need the most; the configurations compile the default
                # TMA write): bench/NOTES.md. Since the producer loads the packed vectors into
                # shared memory (session 8) they are 280 -> 32 B and 720 -> 60-140 B in the one
                # pass at D 128, 424 -> 112 B in the two passes' causal dK/dV.
                if fused:
                    known_spill = {64: 0, 128: 140 if causal else 32}[dim]
                else:
                    known_spill = {64: 0, 128: 112 if causal else 104}[dim]
                configs.append((
                    f"tlx_{'bwd' if fused else 'dkdv'}{_walk_suffix(head_major, causal, dynamic)}{'_bq' if shared else ''} {dtype} d{dim}{' causal' if causal else ''}", _dkdv_kernel,
                    signature, constexprs, {"num_warps": 4, "num_stages": 1}, known_spill,
                ))
    return configs


def _ab(argv: list[str] | None = None) -> int:
    """A/B of the forward's tile orders on one GPU: ``python -m jagflash.core.tlx_attention``.

    Times the default consumer (version 2) on plans of each schedule (grouped: the default;
    static; dynamic: the atomic tile counter) walked slot by slot and head by head, on a
    lognormal jagged batch (H16, and GQA 16:4), 2,048 sequences of 1-63 tokens, and a dense one
    (bf16, H16, D128, causal and not) and dense 4 x 8192 H32 (its K/V, 256 MB, are five times the
    L2), and the default order with one Q tile in flight (``q_bufs=1``; the default is 2), with
    and without the decoded tile ring (``default-ring`` / ``default-noring``: ``ring_tiles``
    True / False; the default is :func:`default_ring_tiles`), and with the idle half computed
    (``default-busy``: ``idle_half=False``); also broadcast-Q, one block of 64 queries against
    1,024 lognormal K/V sequences (the bench's ``bq-lq64-b1024``, unmasked only); checks that
    each matches the call's default, and prints TFLOP/s. ``--batches tiny,gqa4``: only the
    batches whose names contain one of these."""
    import argparse
    import functools

    from triton.testing import do_bench

    from jagflash.core.jagged import offsets_from_lengths
    from jagflash.core.mask import visible_pairs

    parser = argparse.ArgumentParser(description=_ab.__doc__.splitlines()[0])
    parser.add_argument("--reps-ms", type=int, default=300, help="do_bench rep time per case")
    parser.add_argument(
        "--batches", default="", help="only the batches whose name contains one of these (comma-separated)"
    )
    parser.add_argument("--orders", default="", help="only these orders (comma-separated, e.g. default,default-q1)")
    args = parser.parse_args(argv)
    gen = torch.Generator().manual_seed(0)

    def lognormal(n: int) -> list[int]:  # the bench's lengths: median 512, sigma 1, 1-4096
        return torch.clamp((torch.exp(torch.randn(n, generator=gen)) * 512).round(), 1, 4096).long().tolist()

    lens128 = lognormal(128)
    tiny = torch.randint(1, 64, (2048,), generator=gen)  # the bench's jagged-tiny shape
    batches = {  # lengths, q heads, kv heads
        "lognormal128": (lens128, 16, 16), "lognormal128gqa4": (lens128, 16, 4),
        "tiny2048": (tiny.tolist(), 16, 16), "dense4x4096": ([4096] * 4, 16, 16),
        "dense4x8192h32": ([8192] * 4, 32, 32),
        "bq64x1024": (lognormal(1024), 16, 16),
    }
    dim = 128
    print(f"{'batch':16s} {'causal':6s} {'order':14s} {'ms':>8s} {'TFLOP/s':>8s} {'max|x-dflt|':>11s}")
    for name, (lens, heads, kv_heads) in batches.items():
        if not any(part in name for part in args.batches.split(",")):
            continue
        shared = name.startswith("bq")
        total, longest = sum(lens), max(lens)
        lq = 64 if shared else longest  # broadcast-Q: one block of lq queries
        q = torch.randn(lq if shared else total, heads, dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(total, kv_heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        offs = offsets_from_lengths(lens, "cuda")
        q_offs = offsets_from_lengths([lq] * len(lens), "cuda") if shared else offs
        lt = torch.tensor(lens)
        for causal in (False,) if shared else (False, True):
            right = 0 if causal else -1
            lq_t = torch.full_like(lt, lq) if shared else lt
            flops = 4 * int(visible_pairs(lq_t, lt, -1, right).sum()) * dim * heads
            outs = {}
            orders = ("default", *(f"{s}-{w}" for s in ("grouped", "static", "dynamic") for w in WALKS), "default-q1", "default-ring", "default-noring", "default-busy")
            for order in orders:
                if args.orders and order != "default" and order not in args.orders.split(","):
                    continue  # (the default always runs: the others are compared with it)
                schedule, walk = order.split("-") if not order.startswith("default") else (None, None)
                plan = None if schedule is None else make_plan(
                    q_offs, offs, total_q=lq * len(lens) if shared else total, total_kv=total, heads_q=heads,
                    heads_kv=kv_heads, window=(-1, right), block_m=BLOCK_M, block_n=BLOCK_N, max_seqlen_q=lq,
                    backward=False, schedule=schedule,
                )
                run = functools.partial(
                    forward, q, k, v, q_offs, offs, lq, left=-1, right=right, scale=dim**-0.5,
                    plan=plan, walk=walk, q_shared=shared, q_bufs=1 if order.endswith("q1") else 2,
                    ring_tiles={"default-ring": True, "default-noring": False}.get(order), idle_half=order != "default-busy",
                )
                outs[order] = run()[0]
                ms = do_bench(run, warmup=25, rep=args.reps_ms, return_mode="median")
                diff = (outs[order].float() - outs["default"].float()).abs().max().item()
                del run
                print(f"{name:16s} {causal!s:6s} {order:14s} {ms:8.3f} {flops / ms / 1e9:8.1f} {diff:11.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_ab())
