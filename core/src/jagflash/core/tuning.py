"""THE policy table: tile shapes, head dims, which backward runs, default schedules and walks.

Every other module asks here; none decides on its own. Each rule names the measurement that
settled it in ``bench/NOTES.md`` (the figures live there, not here). Nothing here imports Triton
kernels or TLX, so plans can be laid out for any backend on any machine.

- Portable (stock Triton) kernels: :func:`block_config` per pass, :func:`plan_blocks`.
- TLX (sm_90a) kernels: :func:`tlx_sm90_blocks`, :func:`fwd_config` / :func:`bwd_config`
  (frozen :class:`FwdConfig` / :class:`BwdConfig`: the compile-time choices of one launch),
  :func:`use_one_pass` (one-pass backward or two passes).
- Schedules: :func:`default_schedules` (what a plan a call builds for itself uses).
- The decode path (``jagflash.core.portable.decode``): :func:`decode_reasons` (what it can
  run), :func:`use_decode` (whether a jagged forward runs it), :func:`decode_config` (its tiles
  and key split).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

from jagflash.core.jagged import cdiv, next_pow2

__all__ = [
    # constants
    "BACKEND_DEFAULT", "DECODE_MAX_Q", "DECODE_MAX_ROWS", "DEFAULT_BACKWARD_SCHEDULE",
    "DEFAULT_SCHEDULE", "FREE_FIELDS", "OWN_BY_DEFAULT", "OWN_KV_TILES", "PORTABLE_HEAD_DIMS",
    "SOLO_PER_SM", "TLX_BLOCK_SIZES", "TLX_HEAD_DIMS", "TLX_ONE_PASS_HEAD_DIMS", "VEC_PAD",
    # configs
    "BwdConfig", "DecodeConfig", "FwdConfig",
    # rules
    "block_config", "bwd_config", "config_reasons", "decode_config", "decode_reasons",
    "default_fwd_depths", "default_head_major", "default_ring_tiles", "default_schedules",
    "default_solo", "dq_cols", "forced_ring", "fwd_config", "grouped_backward", "kernel_flags",
    "launch_options", "own_span", "plan_blocks", "resolve_schedules", "tlx_sm90_blocks",
    "use_decode", "use_one_pass",
]

# --- portable kernels ------------------------------------------------------------------------

#: Head dims the portable kernels take (a non-power of two is padded to the next one and masked).
PORTABLE_HEAD_DIMS = frozenset({16, 32, 64, 96, 128, 256})



def block_config(backend: str, head_dim: int, pass_: str, block_size: tuple[int, int] | None = None) -> dict[str, int]:
    """Tile sizes and launch options for one pass (``fwd``, ``dq`` or ``dkdv``) of the portable
    kernels. Under the interpreter every tile iteration costs about the same whatever its size,
    so small tiles there buy nothing but they do exercise multi-tile paths on small tests.
    With a block mask's ``block_size`` ``(bm, bn)`` every pass tiles by its blocks (q-tiles of
    ``bm`` rows, kv-tiles of ``bn`` keys), so a tile is one listed block."""
    block_d = next_pow2(head_dim)
    if block_size is not None:
        big = max(block_size) * block_d >= 128 * 64
        return {
            "BLOCK_M": int(block_size[0]), "BLOCK_N": int(block_size[1]), "BLOCK_D": block_d,
            "num_warps": 8 if big else 4, "num_stages": 1 if backend == "interpreter" else (1 if big else 2),
        }
    if backend == "interpreter":
        return {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_D": block_d, "num_warps": 4, "num_stages": 1}
    wide = block_d > 64
    if pass_ == "fwd":
        return {
            "BLOCK_M": 128 if block_d <= 128 else 64,
            "BLOCK_N": 64 if block_d <= 128 else 32,
            "BLOCK_D": block_d,
            "num_warps": 8 if block_d <= 128 else 4,
            "num_stages": 3 if block_d <= 128 else 2,
        }
    if pass_ == "dq":
        return {"BLOCK_M": 128 if not wide else 64, "BLOCK_N": 32 if not wide else 64, "BLOCK_D": block_d, "num_warps": 4 if not wide else 8, "num_stages": 3 if not wide else 2}
    if pass_ == "dkdv":
        return {"BLOCK_M": 32, "BLOCK_N": 128 if not wide else 64, "BLOCK_D": block_d, "num_warps": 4 if not wide else 8, "num_stages": 3 if not wide else 2}
    raise ValueError(f"unknown pass {pass_!r}")


def kernel_flags(heads_q: int, heads_kv: int, head_dim: int, left: int, right: int) -> dict[str, object]:
    """The compile-time flags every attention kernel takes: the GQA group, the head dim and
    which sides of the mask are bounded (``jagflash.core.mask.mask_bounds``)."""
    return {"GROUP": heads_q // heads_kv, "HEAD_DIM": head_dim, "BOUNDED_LEFT": left >= 0, "BOUNDED_RIGHT": right >= 0}


def launch_options(cfg: dict[str, int]) -> dict[str, int]:
    """The keyword arguments of a kernel launch from a :func:`block_config`."""
    return {k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "num_warps", "num_stages")}


def plan_blocks(backend: str, head_dim: int, block_size: tuple[int, int] | None = None) -> dict[str, tuple[int, int]]:
    """``(block_m, block_n)`` of every pass of ``backend``'s kernels: what a Plan for them holds.
    ``tlx-sm90`` runs its own forward and dK/dV passes and the portable dQ pass (its tiles:
    :func:`tlx_sm90_blocks`). Every call asks (a plan's check): computed
    once per (backend, head dim). With a block mask's ``block_size``: its blocks in every pass
    (:func:`block_config`), but the TLX kernels keep their own tiles (the forward's 128 x 128,
    over a 64 x 64 mask its tiles: ``jagflash.core.block_tiles``; the dK/dV pass's 64-query steps)."""
    if block_size is not None:
        blocks = {p: (int(block_size[0]), int(block_size[1])) for p in ("fwd", "dq", "dkdv")}
        if backend == "tlx-sm90":  # (the dQ pass of its two passes is the portable one, by the mask's blocks)
            blocks.update(tlx_sm90_blocks(head_dim))
        return blocks
    return dict(_plan_blocks(backend, head_dim))


@functools.cache
def _plan_blocks(backend: str, head_dim: int) -> tuple[tuple[str, tuple[int, int]], ...]:
    tlx = backend == "tlx-sm90"
    blocks = {
        p: (cfg["BLOCK_M"], cfg["BLOCK_N"])
        for p in ("fwd", "dq", "dkdv")
        for cfg in (block_config("portable" if tlx else backend, head_dim, p),)
    }
    if tlx:
        blocks.update(tlx_sm90_blocks(head_dim))
    return tuple(blocks.items())



# --- TLX (Hopper, sm_90a) kernels ------------------------------------------------------------

#: Head dims the TLX kernels take, forward and backward.
TLX_HEAD_DIMS = (64, 128)
#: Block sizes of the block masks the TLX kernels take: their forward tile (a q-tile walks its
#: row of the list) and their dK/dV kv-tile (which walks the transposed row, two 64-query steps
#: per listed q-block). A 64 x 64 mask they walk as these tiles with bits (``block_tiles``), which
#: the public call takes only once GPU-tested: until then its 64 x 64 masks run on the portable kernels.
TLX_BLOCK_SIZES = ((128, 128),)
#: Head dims where the variants run the TLX one-pass backward (:func:`use_one_pass`): where it
#: measured faster than the two passes and the portable backward (bench/NOTES.md, session 8).
#: Its dQ tiles are 64 columns wide, the 128-byte swizzle of 16-bit K (:func:`dq_cols`).
TLX_ONE_PASS_HEAD_DIMS = (64, 128)


def tlx_sm90_blocks(head_dim: int) -> dict[str, tuple[int, int]]:
    """Tile sizes ``(block_m, block_n)`` of the TLX kernels' forward and dK/dV passes, here so
    that plans can be laid out for them without importing TLX; their dQ pass (two-pass
    backward) is the portable one (:func:`block_config`). The dK/dV pass steps 64 queries at a
    time, causal or not, at D 64 and D 128: the one-pass backward needs 64 (its dQ tile is a
    wgmma's 64 rows), and the two passes' dK/dV pass at D 64 measured faster with 64 than with
    32 (bench/NOTES.md, session 8)."""
    return {"fwd": (128, 128), "dkdv": (64, 128)}


def use_one_pass(deterministic: bool, left: int, right: int, head_dim: int) -> bool:
    """Whether a TLX backward runs in one pass (dQ reduce-added from every kv-tile, so its order
    varies) rather than as a portable dQ pass and a TLX dK/dV pass: at
    :data:`TLX_ONE_PASS_HEAD_DIMS`, whatever the mask (causal or not, with a window too: the
    one pass walks the same ``jagflash.core.mask.dkdv_q_range`` steps as the two passes' dK/dV
    pass and masks dS with the same band, so a bounded left side changes which steps run, not
    what a step adds to dQ), unless the call asks for a deterministic backward. Measured
    faster without a window (bench/NOTES.md, sessions 5 and 8); with one, the window bench rows
    say (bench/NOTES.md, the sliding-window session)."""
    return not deterministic and head_dim in TLX_ONE_PASS_HEAD_DIMS


def dq_cols(head_dim: int) -> int:
    """Columns of dQ one consumer warpgroup of the one-pass backward computes at once: half the
    head dim, 64 at D 128; the whole head dim at D 64, on alternate steps, since half of it (32
    columns, 64 bytes) would slice K off its 128-byte swizzle."""
    return head_dim if head_dim < 128 else head_dim // 2


def default_head_major(left: int, right: int, dynamic: bool) -> bool:
    """Whether a TLX launch walks its plan's table one (K/V) head at a time (for L2 locality) rather
    than slot by slot in cost order: without a mask, or on a dynamic plan; a static plan with a
    mask needs the cost order across heads for its zigzag deal to balance (NOTES, sessions 6-7)."""
    return dynamic or (left < 0 and right < 0)


def default_ring_tiles(total_kv: int, batch: int, block_n: int) -> bool:
    """Whether the TLX forward's producer hands the consumers decoded tiles through shared
    memory (``RING_TILES``) instead of each consumer reading the table row and the offsets at
    every tile start: where the batch's K/V sequences hold at most one K/V tile on average, so
    that each tile's start, not its loop, is what the consumers wait for (measured faster there
    and slower on long sequences: bench/NOTES.md, session 9)."""
    return total_kv <= block_n * max(batch, 1)


#: Programs a ``SOLO`` forward runs on each SM (launched with 128 registers a thread).
SOLO_PER_SM = 2


def default_solo(head_dim: int, ring: bool, sparse: bool, q_shared: bool, crowded: bool) -> bool:
    """Whether a TLX forward runs ``SOLO`` (one consumer warpgroup a program, two programs an SM,
    one Q tile): with the tile ring on K/V sequences of at most one kv-tile on average, no block
    mask nor broadcast-Q, at D 128, and ``crowded``: the plan holds a tile for each program. H100,
    kernel alone (bench/NOTES.md, session 40): jagged-tiny -31 %, short-1tok -45 %; one sequence
    of 16 +7 % (one tile: its halves in turn); bs-lognormal-d25 +9 %, long batches +10-28 %."""
    return ring and not sparse and not q_shared and head_dim == 128 and crowded


def default_fwd_depths(head_dim: int, left: int, right: int, ring: bool, sparse: bool, q_shared: bool) -> tuple[int, int, bool]:
    """``(NUM_KV, Q_BUFS, STAGE_O)`` of a TLX forward: three K/V slots and one Q tile for a
    causal band without a left bound on the per-consumer walk (no tile ring, no block mask, no
    broadcast-Q), at D 128 with O stored through the Q slot, whose 16 KB of layout-conversion
    scratch the third slot needs; else two and two. Measured 4-5 % faster on lognormal and
    dense causal batches, level on the other causal ones, 2 % slower without a mask and 10-38 %
    slower with the tile ring (bench/NOTES.md, session 28). A causal block-sparse forward at D 128
    stores O through the Q slot too, by TMA (:func:`fwd_config`), once its consumers hold their
    records: 0.3-2.5 % faster on the H100 (session 33; only causal masks were measured)."""
    if left < 0 and right >= 0 and not (ring or sparse or q_shared):
        return 3, 1, head_dim >= 128
    return 2, 2, sparse and right >= 0 and head_dim >= 128 and not q_shared


class _Constexprs:
    """What a frozen launch config gives its kernel: its fields by name."""

    def constexprs(self) -> dict[str, object]:
        """The kernel's compile-time keyword arguments (a new dict each call)."""
        return dict(self._fields)

    @functools.cached_property
    def _fields(self) -> dict[str, object]:
        # shallow (every launch asks: ``dataclasses.asdict`` would copy each value deeply), made
        # once per config, which is frozen
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True)
class FwdConfig(_Constexprs):
    """The compile-time choices of one TLX forward launch (the kernel's constexprs). Chosen by
    :func:`fwd_config`; the tile shapes and register split are fixed, the ring depths
    :func:`default_fwd_depths`'s (the measured winners: bench/NOTES.md)."""

    HEAD_DIM: int
    GROUP: int  # query heads per K/V head (GQA)
    BOUNDED_LEFT: bool
    BOUNDED_RIGHT: bool
    Q_SHARED: bool  # broadcast-Q: one Q block shared by every sequence
    FOLD_SCALE: bool  # a positive scale rides in the exponent's fused multiply-add
    HEAD_MAJOR: bool  # walk the table one K/V head at a time (default_head_major)
    DYNAMIC: bool  # tiles from the launch's atomic counter (a dynamic plan)
    ZIGZAG: bool  # a static deal mirrored on odd rounds
    RING_TILES: bool  # decoded tiles through shared memory (default_ring_tiles)
    BLOCK_M: int = 128  # q rows per tile, 64 per consumer warpgroup
    BLOCK_N: int = 128  # kv rows per K/V ring slot
    NUM_KV: int = 2  # K/V ring depth
    Q_BUFS: int = 2  # Q tiles in flight (the next tile's Q loads during this one)
    SPARSE: bool = False  # a q-tile walks its row of a block mask's lists (jagflash.core.mask.block_walk)
    STAGE_O: bool = False  # O stored through the tile's Q slot (no layout-conversion scratch)
    TMA_O: bool = False  # with STAGE_O: a half tile inside its sequence leaves by one TMA store
    ZERO_EMPTY: bool = False  # with RING_TILES: the producer writes the rows of tiles that visit no kv-block
    HOLD_RECORD: bool = False  # with RING_TILES: consumers keep a tile's record slot and re-read its fields
    SOLO: bool = False  # with HOLD_RECORD: one consumer warpgroup takes both halves in turn, two programs an SM
    FINE: bool = False  # with SPARSE: a 64 x 64 mask's 128 x 128 tiles, each step masked by its bits (block_tiles)


def forced_ring(config: FwdConfig | BwdConfig, ring: bool) -> FwdConfig | BwdConfig:
    """``config`` with its kernel's tile ring forced on or off (tests and probes): the fields
    that ride on the ring follow it, off without it (:func:`config_reasons` refuses them there):
    ``ZERO_EMPTY``, the backward's ``OWN_SPAN`` and the forward's ``SOLO`` (kept with the ring),
    the forward's ``HOLD_RECORD`` (on with the ring, as :func:`fwd_config` sets it)."""
    if isinstance(config, FwdConfig):
        return replace(config, RING_TILES=ring, HOLD_RECORD=ring, ZERO_EMPTY=ring and config.ZERO_EMPTY, SOLO=ring and config.SOLO)
    return replace(config, RING_TILES=ring, ZERO_EMPTY=ring and config.ZERO_EMPTY, OWN_SPAN=config.OWN_SPAN if ring else 0)


@functools.lru_cache(maxsize=256)
def fwd_config(
    *, head_dim: int, group: int, left: int, right: int, q_shared: bool, scale: float,
    dynamic: bool, zigzag: bool, total_kv: int, batch: int, sparse: bool = False, crowded: bool = False, fine: bool = False,
) -> FwdConfig:
    """The :class:`FwdConfig` of a forward call (``sparse``: with a block mask's lists, ``fine`` a tiled 64 x 64 one's). A
    block-sparse call always hands tiles through the tile ring: its producer walks each list row
    (dependent loads: the row's count, then searches through its indices) once, for itself and
    both consumers (bench/NOTES.md, session 17). With the ring the consumers hold each tile's
    record and read its fields again after the main loop (``HOLD_RECORD``: 2-6 % faster on the
    block-sparse and tiny batches, H100, session 33); ``ZERO_EMPTY`` stays off (level or slower
    there); ``SOLO`` as :func:`default_solo` (``crowded``: the plan's forward rows are at least
    :data:`SOLO_PER_SM` an SM). Every forward asks: kept per arguments (a config is frozen)."""
    block_m, block_n = tlx_sm90_blocks(head_dim)["fwd"]
    ring = sparse or default_ring_tiles(total_kv, batch, block_n)
    num_kv, q_bufs, stage_o = default_fwd_depths(head_dim, left, right, ring, sparse, q_shared)
    solo = default_solo(head_dim, ring, sparse, q_shared, crowded)
    return FwdConfig(
        HEAD_DIM=head_dim, GROUP=group, BOUNDED_LEFT=left >= 0, BOUNDED_RIGHT=right >= 0,
        Q_SHARED=q_shared, FOLD_SCALE=scale > 0, HEAD_MAJOR=default_head_major(left, right, dynamic),
        DYNAMIC=dynamic, ZIGZAG=zigzag, RING_TILES=ring, BLOCK_M=block_m, BLOCK_N=block_n,
        NUM_KV=num_kv, Q_BUFS=1 if solo else q_bufs, SPARSE=sparse, STAGE_O=stage_o, TMA_O=stage_o and sparse,
        HOLD_RECORD=ring, SOLO=solo, FINE=fine,
    )


#: Rows the packed per-query vectors of each sequence are padded to (a multiple of every dK/dV
#: q-step), so that the dK/dV kernel's producer loads a step's vectors as one TMA box.
VEC_PAD = 64


@dataclass(frozen=True)
class BwdConfig(_Constexprs):
    """The compile-time choices of one launch of the TLX dK/dV kernel: the two-pass backward's
    dK/dV pass (``FUSED_DQ`` off) or the one-pass backward (on: each 64-query step also adds its
    share of dQ with a staged TMA reduce-add). Chosen by :func:`bwd_config`."""

    HEAD_DIM: int
    GROUP: int
    BOUNDED_LEFT: bool
    BOUNDED_RIGHT: bool
    Q_SHARED: bool
    FUSED_DQ: bool
    HEAD_MAJOR: bool
    DYNAMIC: bool
    ZIGZAG: bool
    BLOCK_M: int  # queries per step (64)
    BLOCK_N: int  # kv rows per tile, 64 per consumer warpgroup
    DQ_COLS: int  # dQ columns a consumer computes at once (dq_cols)
    NUM_Q: int = 2  # Q/dO ring depth
    DQ_STAGES: int = 1  # shared-memory stages of each consumer's dQ write-back (two do not fit at D 128)
    PAD: int = VEC_PAD  # rows the packed per-query vectors of each sequence are padded to
    SPARSE: bool = False  # a kv-tile walks its row of a block mask's transposed lists
    RING_TILES: bool = False  # decoded kv-tiles through shared memory (bwd_config)
    OWN_SPAN: int = 0  # one program sums a sequence's dQ if it has at most this many keys (own_span)
    ZERO_EMPTY: bool = False  # with RING_TILES: the producer writes the dK, dV zeros of kv-tiles no step visits
    SOLE_DQ: bool = False  # a dQ cell one kv-tile adds into is written by that add, not summed (SOLE_MEAN_KV)
    FINE: bool = False  # with SPARSE: a 64 x 64 mask's 128 x 128 tiles, each step masked by its bits (block_tiles)


@functools.lru_cache(maxsize=256)
def bwd_config(
    *, head_dim: int, group: int, left: int, right: int, q_shared: bool, fused_dq: bool,
    dynamic: bool, zigzag: bool, total_kv: int, batch: int, sparse: bool = False, grouped: bool = False, fine: bool = False,
) -> BwdConfig:
    """The :class:`BwdConfig` of a backward call (``fused_dq``: the one pass; ``sparse``: with a
    block mask's transposed lists, ``fine`` a tiled 64 x 64 one's; ``grouped``: on a ``"dynamic-grouped"`` table, :func:`own_span`,
    with :data:`OWN_BY_DEFAULT`). The tile ring where the kernel owns sequences and where the
    forward takes it: a block-sparse call (the producer walks each list row once for all three
    roles) and short K/V sequences (:func:`default_ring_tiles`; 11 % faster on jagged-tiny, 1-2 %
    slower on long non-causal batches: bench/NOTES.md, session 25). Kept per arguments."""
    block_m, block_n = tlx_sm90_blocks(head_dim)["dkdv"]
    own = own_span(head_dim, block_n, fused_dq=fused_dq, q_shared=q_shared, grouped=grouped) if OWN_BY_DEFAULT else 0
    return BwdConfig(
        HEAD_DIM=head_dim, GROUP=group, BOUNDED_LEFT=left >= 0, BOUNDED_RIGHT=right >= 0,
        Q_SHARED=q_shared, FUSED_DQ=fused_dq, HEAD_MAJOR=default_head_major(left, right, dynamic),
        DYNAMIC=dynamic, ZIGZAG=zigzag, BLOCK_M=block_m, BLOCK_N=block_n, DQ_COLS=dq_cols(head_dim),
        SPARSE=sparse, RING_TILES=sparse or own > 0 or default_ring_tiles(total_kv, batch, block_n), OWN_SPAN=own,
        SOLE_DQ=fused_dq and not q_shared and head_dim == 128 and sparse and total_kv <= SOLE_MEAN_KV * batch, FINE=fine,
    )


#: ``SOLE_DQ`` of the one pass (D 128, no broadcast-Q) with a block mask over K/V sequences of at most this many keys on
#: average, where most dQ cells have one add or none (bench/NOTES.md, session 35, H100: bs-lognormal-d25 -16 %, d10 -29 %,
#: local+global -1.5 %; session 36's TMA store: bs-dense8k-d25 level, jagged-tiny +10 %, jagged-heavytail +2-5 %).
SOLE_MEAN_KV = 2048


#: The most kv-tiles of a sequence whose dQ one program of the one-pass backward sums
#: (:func:`own_span`). Measured (bench/NOTES.md, session 31, H100): owning sequences of 1-2
#: kv-tiles takes jagged-tiny's backward 15 % faster and the heavy-tailed batch's 1-3 %, the
#: lognormal batches (dense causal, block-sparse) level; owning up to 8 kv-tiles makes those 3-6 %
#: slower, up to 16 the block-sparse one 15 % slower (a program sums a long sequence alone).
OWN_KV_TILES = 2
#: Whether :func:`bwd_config` owns sequences where :func:`own_span` allows (the switch the
#: owned kernel's GPU tests and probes were measured against).
OWN_BY_DEFAULT = True


def own_span(head_dim: int, block_n: int, *, fused_dq: bool, q_shared: bool, grouped: bool) -> int:
    """``OWN_SPAN`` of a dK/dV launch: the most keys a sequence may have for one program to take
    all its kv-tiles of a K/V head and sum its dQ rows itself (zeroed, added, written while in
    L2; the preprocess and the cast pass skip them). 0 (none) but in the one pass on a
    ``"dynamic-grouped"`` table (a sequence's tiles together) with column-half dQ tiles (D 128:
    a warpgroup waits only for its own stores), and not for broadcast-Q (every sequence adds
    into the shared rows). Needs the tile ring (the producer hands out a sequence's kv-tiles)."""
    own = fused_dq and grouped and not q_shared and dq_cols(head_dim) < head_dim
    return OWN_KV_TILES * block_n if own else 0


#: The FwdConfig / BwdConfig fields a caller's config may choose other than the policy does
#: (the walk, the tile hand-off, the forward's ring depths and O store, the backward's dQ
#: write-back: tests and probes force each; depths the shared memory cannot hold fail to
#: compile, a write-back the kernel cannot do is refused); the rest follow from the call.
FREE_FIELDS = frozenset({"HEAD_MAJOR", "RING_TILES", "NUM_KV", "Q_BUFS", "STAGE_O", "TMA_O", "ZERO_EMPTY", "HOLD_RECORD", "SOLO", "OWN_SPAN", "SOLE_DQ"})


def config_reasons(config: FwdConfig | BwdConfig, want: FwdConfig | BwdConfig, plan_blocks: tuple[int, int]) -> list[str]:
    """Why a caller's ``config`` does not fit the call whose policy config is ``want`` and whose
    plan has tiles ``plan_blocks``: every reason (empty if it fits). The policy's own config
    (every call but the tests' and probes', which force one) agrees with itself field by field."""
    reasons = [] if config is want else [
        f"{name}={getattr(config, name)!r}, the call needs {getattr(want, name)!r}"
        for name in type(config).__dataclass_fields__
        if name not in FREE_FIELDS and getattr(config, name) != getattr(want, name)
    ]
    if plan_blocks != (config.BLOCK_M, config.BLOCK_N):
        reasons.append(f"the plan's tiles are {plan_blocks[0]}x{plan_blocks[1]}, the config's {config.BLOCK_M}x{config.BLOCK_N}")
    if getattr(config, "TMA_O", False) and not config.STAGE_O:
        reasons.append("TMA_O stores O from the Q slot: it needs STAGE_O")
    if getattr(config, "ZERO_EMPTY", False) and not config.RING_TILES:
        reasons.append("ZERO_EMPTY is the tile ring's producer's: it needs RING_TILES")
    if getattr(config, "HOLD_RECORD", False) and not config.RING_TILES:
        reasons.append("HOLD_RECORD keeps the tile ring's record: it needs RING_TILES")
    if getattr(config, "SOLO", False) and (config.ZERO_EMPTY or not config.HOLD_RECORD):
        reasons.append("SOLO re-reads the held record and has no ZERO_EMPTY producer: it needs HOLD_RECORD without ZERO_EMPTY")
    if config.FINE and not config.SPARSE:
        reasons.append("FINE masks the steps of a block mask's tiles: it needs SPARSE")
    if getattr(config, "OWN_SPAN", 0):
        reasons += [f"OWN_SPAN={config.OWN_SPAN} {why}" for why, bad in (
            ("needs the one pass (FUSED_DQ)", not config.FUSED_DQ), ("needs the tile ring (RING_TILES)", not config.RING_TILES),
            ("is not for broadcast-Q (Q_SHARED)", config.Q_SHARED),
            (f"needs column-half dQ tiles (DQ_COLS {config.DQ_COLS} < HEAD_DIM {config.HEAD_DIM})", config.DQ_COLS >= config.HEAD_DIM),
            (f"is not a multiple of BLOCK_N {config.BLOCK_N}", config.OWN_SPAN % config.BLOCK_N != 0),
        ) if bad]
    if getattr(config, "SOLE_DQ", False):
        reasons += [f"SOLE_DQ {why}" for why, bad in (
            ("needs the one pass (FUSED_DQ)", not config.FUSED_DQ), ("is not for broadcast-Q (Q_SHARED: every sequence adds into them)", config.Q_SHARED),
            (f"needs 64-column dQ halves (DQ_COLS {config.DQ_COLS}, HEAD_DIM {config.HEAD_DIM})", (config.DQ_COLS, config.HEAD_DIM) != (64, 128)),
            (f"needs 64-query steps and padding (BLOCK_M {config.BLOCK_M}, PAD {config.PAD})", config.BLOCK_M != 64 or config.PAD % 64),
        ) if bad]
    return reasons


# --- schedules ---------------------------------------------------------------------------------

#: The schedules of a plan a call builds for itself for the portable kernels: the forward's and
#: the backward passes' (the orders measured fastest: bench/NOTES.md, 2026-11-30).
DEFAULT_SCHEDULE = "grouped"
DEFAULT_BACKWARD_SCHEDULE: str | None = "none"
#: ``schedule=`` / ``backward_schedule=`` of the variants' calls and ``make_plan``: the schedules
#: measured fastest for the kernels the plan is for (:func:`default_schedules`).
BACKEND_DEFAULT = "default"


def grouped_backward(total_kv: int, batch: int, heads_kv: int, block_n: int, workers: int) -> bool:
    """Whether the TLX one-pass backward takes its kv-tiles in sequence-grouped order from the
    atomic counter (``"dynamic-grouped"``) rather than in cost order (``"dynamic"``): where a
    sequence holds at most ``workers`` kv-tiles of BLOCK_N keys on average, all K/V heads
    counted. The tiles that run at once then add into few sequences' dQ accumulator rows (which
    stay in L2) without every program adding into one sequence's. Measured (bench/NOTES.md,
    session 26): 4-5 % faster on the block-sparse lognormal batches, 1-4 % on causal lognormal,
    GQA and heavy-tailed ones, within 1 % on the others it takes; where a sequence fills the
    machine several times over (4 sequences of 4,096 or 8,192 keys), from 2 % faster to 7 %
    slower between runs, so cost order stays there."""
    return cdiv(total_kv, block_n) * heads_kv <= workers * max(batch, 1)


def default_schedules(
    backend: str, head_dim: int, *, window: tuple[int, int] = (-1, -1), equal_costs: bool = False,
    deterministic: bool = False, grouped: bool = False,
) -> tuple[str, str | None]:
    """``(schedule, backward_schedule)`` of a plan for ``backend``'s kernels when the caller names
    none. ``equal_costs``: every tile of a pass costs the same (a dense batch without a mask), so
    a static deal is already balanced. ``deterministic``: the backward the plan is for.
    ``grouped``: :func:`grouped_backward` of the batch.

    The portable kernels: :data:`DEFAULT_SCHEDULE` and :data:`DEFAULT_BACKWARD_SCHEDULE`. The
    TLX kernels: ``"dynamic"`` (cost-sorted table, an atomic tile counter, walked head by head)
    wherever tile costs differ, for the forward and for the one-pass backward
    (:func:`use_one_pass`; ``"dynamic-grouped"`` for it with ``grouped``); the two passes'
    portable dQ pass keeps batch order (bench/NOTES.md, session 7; dense unmasked keeps the
    static defaults)."""
    if backend != "tlx-sm90" or equal_costs:
        return DEFAULT_SCHEDULE, DEFAULT_BACKWARD_SCHEDULE
    if not use_one_pass(deterministic, window[0], window[1], head_dim):
        return "dynamic", DEFAULT_BACKWARD_SCHEDULE
    return "dynamic", "dynamic-grouped" if grouped else "dynamic"


def resolve_schedules(
    schedule: str, backward_schedule: str | None, backend: str, head_dim: int, *,
    window: tuple[int, int] = (-1, -1), equal_costs: bool = False, deterministic: bool = False,
    grouped: bool = False,
) -> tuple[str, str | None]:
    """``schedule`` and ``backward_schedule`` with :data:`BACKEND_DEFAULT` replaced by
    :func:`default_schedules`' (other values, and ``None`` for "the forward's", as given)."""
    fwd, bwd = default_schedules(
        backend, head_dim, window=window, equal_costs=equal_costs, deterministic=deterministic, grouped=grouped
    )
    return (fwd if schedule == BACKEND_DEFAULT else schedule), (bwd if backward_schedule == BACKEND_DEFAULT else backward_schedule)


# --- the decode path -------------------------------------------------------------------------

#: The longest query sequence for which a jagged forward takes the decode path on its own
#: (:func:`use_decode`), per backend the call chose. 16: a sequence's queries times its GQA group
#: then fill the 16-row minimum of an MMA at group 1 and stay within :data:`DECODE_MAX_ROWS` up
#: to group 8, so one program holds every query of a (sequence, kv head) and K/V are read once;
#: the tile kernels instead run a 128-row (TLX) or 32/128-row (portable) q-tile per query head,
#: mostly empty, and read each K/V block once per query head of a GQA group. Not yet measured
#: on a GPU (bench/NOTES.md, the decode session): the H200 rows set these.
DECODE_MAX_Q = {"tlx-sm90": 16, "portable": 16, "interpreter": 16}
#: The most query rows one decode program holds for one (sequence, kv head): ``max_seqlen_q *
#: GQA group``; beyond it the decode kernel refuses (:func:`decode_reasons`).
DECODE_MAX_ROWS = 128
#: Query rows a decode program aims at when it packs several short sequences together.
_DECODE_PACK_ROWS = 64
#: The fewest keys a decode program's chunk of a long K/V range holds (the key split); under
#: the interpreter fewer, so that small tests split their keys too.
_DECODE_MIN_CHUNK = {"interpreter": 64}
_DECODE_MIN_CHUNK_GPU = 256
#: Programs a decode launch aims at: a few per SM, so a long-key batch splits its keys.
_DECODE_PROGRAMS_PER_SM = 4


def decode_reasons(*, max_seqlen_q: int, group: int, head_dim: int, sparse: bool = False) -> list[str]:
    """Every reason the decode kernel (``jagflash.core.portable.decode``) cannot run a jagged
    forward (empty if it can): more than :data:`DECODE_MAX_ROWS` query rows per (sequence, kv
    head), a head dim the portable kernels do not take, a block mask."""
    reasons = []
    if max(max_seqlen_q, 1) * group > DECODE_MAX_ROWS:
        reasons.append(
            f"max_seqlen_q {max_seqlen_q} x GQA group {group} = {max_seqlen_q * group} query rows per "
            f"(sequence, kv head), more than the decode kernel's {DECODE_MAX_ROWS}"
        )
    if head_dim not in PORTABLE_HEAD_DIMS:
        reasons.append(f"head_dim {head_dim} not in {sorted(PORTABLE_HEAD_DIMS)}")
    if sparse:
        reasons.append("the decode kernel takes no block mask")
    return reasons


def use_decode(
    backend: str, *, max_seqlen_q: int, group: int, head_dim: int, sparse: bool = False,
    requested: bool | None = None,
) -> tuple[bool, str]:
    """Whether a jagged forward or backward on ``backend`` (the one the pass chose: ``tlx-sm90``,
    ``portable`` or ``interpreter``) runs the decode kernels instead of the tile kernels, and why
    (the sentence ``last_choice(...).explain()`` shows). The rule:

    - ``requested=False`` (the call's ``decode=False``): never.
    - ``requested=True``: always; a problem :func:`decode_reasons` refuses raises
      :class:`~jagflash.core.capability.UnsupportedProblem` with every reason.
    - ``requested=None`` (the default): where :func:`decode_reasons` has no reason and
      ``max_seqlen_q <= DECODE_MAX_Q[backend]`` (16 on every backend), whatever the key lengths
      (long ones are split across programs). The TLX backend hands such forwards to the decode
      kernel too: its 128-row q-tiles would run at most 16 live rows each.

    The backward asks the same question with the same answers (it reads no key length
    either), so a decode forward has a decode backward, and a tile forward a tile backward."""
    reasons = decode_reasons(max_seqlen_q=max_seqlen_q, group=group, head_dim=head_dim, sparse=sparse)
    if requested is False:
        return False, "decode=False"
    if requested:
        if reasons:
            from jagflash.core.capability import UnsupportedProblem

            raise UnsupportedProblem("decode path (decode=True)", reasons)
        return True, "decode=True"
    if reasons:
        return False, "; ".join(reasons)
    bound = DECODE_MAX_Q.get(backend, 0)
    if max_seqlen_q > bound:
        return False, f"max_seqlen_q {max_seqlen_q} > {bound}, the decode bound on {backend}"
    return True, (
        f"max_seqlen_q {max_seqlen_q} <= {bound} on {backend}: every query of a (sequence, kv head) "
        "in one program, K/V read once per kv head"
    )


@dataclass(frozen=True)
class DecodeConfig:
    """One decode launch (``jagflash.core.portable.decode``): each program takes the query rows
    of ``SEQS`` consecutive sequences (``ROWS`` = max_seqlen_q x GQA group positions each, in a
    ``BLOCK_M``-row tile) for one kv head, over one of ``SPLITS`` chunks of their keys
    (``BLOCK_N`` at a time); ``SPLITS > 1`` adds a merge launch."""

    ROWS: int
    SEQS: int
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_D: int
    SPLITS: int
    num_warps: int = 4
    num_stages: int = 2


@functools.lru_cache(maxsize=256)  # host ints only; a frozen result: ~7 us a decode call less
def decode_config(
    backend: str, *, batch: int, max_seqlen_q: int, max_seqlen_kv: int, total_kv: int,
    heads_kv: int, group: int, head_dim: int, sms: int, backward: bool = False,
) -> DecodeConfig:
    """The :class:`DecodeConfig` of a decode call. Sequences are packed ``SEQS`` to a program
    where their queries leave rows free (about 64 rows) and their average key count fits one
    ``BLOCK_N`` block (packing longer ones would compute every packed row over every packed
    sequence's keys, masked); the keys of a program are split ``SPLITS`` ways, chunks of at
    least 256 keys (64 under the interpreter), until the launch has about four programs per SM (``sms``:
    ``jagflash.core.tile_scheduler.default_workers``). The ``backward``'s programs are the
    forward's (they must take the same rows and keys), with 8 warps from 64 x 128 row tiles on:
    it holds dQ and the block's dK, dV in fp32 besides the forward's tiles (compiled for sm_90a
    at D 128, 64 rows: 4 warps spilled ~200 bytes at 255 registers, 8 warps 212 registers, no
    spill). 16-row tiles stay on 4 warps: they spill 20 bytes there, and 8 warps measured
    slower on the H200 (four queries x GQA 4 a sequence against lognormal keys, the backward
    replayed in a CUDA graph: 1.32 ms on 8 warps, 1.02 ms on 4; 2026-12-02)."""
    rows = max(max_seqlen_q, 1) * group
    block_n = 32 if backend == "interpreter" or head_dim > 128 else 64
    mean_kv = total_kv / max(batch, 1)
    seqs = max(1, min(_DECODE_PACK_ROWS // rows, max(1, int(block_n // max(mean_kv, 1.0))), batch))
    packs = cdiv(max(batch, 1), seqs)
    longest = min(seqs * max_seqlen_kv, total_kv)
    programs = sms * _DECODE_PROGRAMS_PER_SM
    min_chunk = _DECODE_MIN_CHUNK.get(backend, _DECODE_MIN_CHUNK_GPU)
    splits = max(1, min(cdiv(programs, packs * max(heads_kv, 1)), cdiv(longest, min_chunk)))
    block_m, block_d = max(16, next_pow2(rows * seqs)), next_pow2(head_dim)
    wide = block_m * block_d >= (64 * 128 if backward or seqs > 1 else 128 * 128)
    return DecodeConfig(
        ROWS=rows, SEQS=seqs, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, SPLITS=splits,
        num_warps=8 if wide else 4, num_stages=1 if backend == "interpreter" else 2,
    )
