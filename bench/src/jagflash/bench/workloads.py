"""Every benchmark workload, in one place.

A workload is a name, a kind (``dense``, ``jagged`` or ``broadcast_q``), a seeded generator of
sequence lengths and the attention problem's shape (heads, KV heads, head dim, dtype, causal,
window). Its FLOPs come from the lengths it actually draws (:mod:`jagflash.bench.flops`), never
from ``B x max_len**2``. Adding one is a line in :data:`WORKLOADS`::

    Workload("jagged-uniform-d128", "jagged", Uniform(256, 64, 2048), heads=16, head_dim=128),

Lengths are drawn with ``numpy.random.default_rng(seed)``, so a workload is the same batch on
every machine and in every process (the benchmark's worker processes regenerate it from the
seed). ``--smoke`` runs :meth:`Workload.smoke`: the same kind and features (causal, GQA ratio,
length distribution family) shrunk to a few sequences of at most 40 tokens, 2 heads of dim 32,
float32 (the Triton interpreter gets bfloat16 wrong: docs/architecture.md, "Backends"), each
bounded window side cut to at most ``SMOKE_WINDOW`` (so that a smoke window is still a band).
A block-sparse workload's smoke version keeps its pattern on ``SMOKE_BLOCK``-row blocks, so its
sequences are a few blocks long (at most ``SMOKE_BS_MAX_LEN`` tokens).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from jagflash.bench.sparsity import BlockPattern

__all__ = [
    "BLOCK_SPARSE_WORKLOADS",
    "KINDS",
    "SHORT_WORKLOADS",
    "SMOKE_BLOCK",
    "SMOKE_BS_MAX_LEN",
    "SMOKE_DEFAULT",
    "SMOKE_WINDOW",
    "WINDOW_WORKLOADS",
    "WORKLOADS",
    "Bimodal",
    "BlockPattern",
    "Fixed",
    "LengthSpec",
    "Lognormal",
    "Mix",
    "PowerLaw",
    "Uniform",
    "Workload",
    "get",
    "run_order",
    "select",
]

KINDS = ("dense", "jagged", "broadcast_q")
DTYPES = ("bfloat16", "float16", "float32")
SMOKE_MAX_LEN = 40
#: The widest window side of a smoke workload (odd, below the interpreter's 32-row tiles).
SMOKE_WINDOW = 7
#: The block size of a smoke block-sparse workload (the smallest a BlockMask takes).
SMOKE_BLOCK = 64
#: The longest sequence of a smoke block-sparse workload (a few SMOKE_BLOCK blocks).
SMOKE_BS_MAX_LEN = 200


class LengthSpec(Protocol):
    """A seeded distribution of per-sequence lengths."""

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """int64 lengths, one per sequence, in batch order."""
        ...

    def smoke(self) -> LengthSpec:
        """The same family shrunk to a few sequences of at most ``SMOKE_MAX_LEN`` tokens."""
        ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Fixed:
    """``count`` sequences of exactly ``length`` tokens (a dense batch)."""

    count: int
    length: int

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return np.full(self.count, self.length, dtype=np.int64)

    def smoke(self) -> Fixed:
        return Fixed(min(self.count, 2), min(self.length, SMOKE_MAX_LEN))

    def describe(self) -> str:
        return f"{self.count} x {self.length}"


@dataclass(frozen=True)
class Uniform:
    """``count`` lengths drawn uniformly from the integers of ``[lo, hi)``."""

    count: int
    lo: int
    hi: int

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.lo, self.hi, size=self.count, dtype=np.int64)

    def smoke(self) -> Uniform:
        hi = min(self.hi, SMOKE_MAX_LEN + 1)
        lo = min(self.lo, max(hi - 8, 0))
        return Uniform(min(self.count, 3), lo, hi)

    def describe(self) -> str:
        return f"{self.count} x U[{self.lo}, {self.hi})"


@dataclass(frozen=True)
class Lognormal:
    """``count`` lengths ``round(median * exp(sigma * z))``, z ~ N(0, 1), clipped to
    ``[floor, cap]``; the median of the unclipped draw is ``median``."""

    count: int
    median: float
    sigma: float
    cap: int
    floor: int = 1

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        z = rng.standard_normal(self.count)
        lengths = np.rint(self.median * np.exp(self.sigma * z))
        return np.clip(lengths, self.floor, self.cap).astype(np.int64)

    def smoke(self) -> Lognormal:
        return Lognormal(min(self.count, 3), 16, self.sigma, SMOKE_MAX_LEN, min(self.floor, 1))

    def describe(self) -> str:
        return (
            f"{self.count} x lognormal(median {self.median:g}, sigma {self.sigma:g}) "
            f"in [{self.floor}, {self.cap}]"
        )


@dataclass(frozen=True)
class PowerLaw:
    """``count`` Pareto lengths ``round(floor * u ** (-1 / alpha))``, u ~ U(0, 1], clipped to
    ``[1, cap]``: mostly short with a heavy tail (alpha 1.1, floor 6: median ~11 tokens, ~1 %
    of the sequences at ``cap``; a larger alpha thins the tail)."""

    count: int
    alpha: float
    floor: int
    cap: int

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        u = rng.random(self.count)
        return np.clip(np.rint(self.floor * u ** (-1.0 / self.alpha)), 1, self.cap).astype(np.int64)

    def smoke(self) -> PowerLaw:
        return PowerLaw(min(self.count, 4), self.alpha, min(self.floor, 2), SMOKE_MAX_LEN)

    def describe(self) -> str:
        return f"{self.count} x power-law(alpha {self.alpha:g}, floor {self.floor}) in [1, {self.cap}]"


@dataclass(frozen=True)
class Mix:
    """The sequences of every part, shuffled together (so long ones are not all first)."""

    parts: tuple[LengthSpec, ...]
    shuffle: bool = True

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        lengths = np.concatenate([p.sample(rng) for p in self.parts]).astype(np.int64)
        return rng.permutation(lengths) if self.shuffle else lengths

    def smoke(self) -> Mix:
        return Mix(tuple(_smoke_part(p) for p in self.parts), self.shuffle)

    def describe(self) -> str:
        return " + ".join(p.describe() for p in self.parts)


def _smoke_part(p: LengthSpec) -> LengthSpec:
    # One sequence per part keeps a mixed smoke batch at a handful of sequences.
    s = p.smoke()
    return dataclasses.replace(s, count=min(s.count, 2)) if hasattr(s, "count") else s


def Bimodal(short: int, long: int) -> Mix:  # reads as a distribution name
    """``short`` sequences of U[64, 256) and ``long`` sequences of U[2048, 4097), shuffled."""
    return Mix((Uniform(short, 64, 256), Uniform(long, 2048, 4097)))


@dataclass(frozen=True)
class Workload:
    """One benchmark problem.

    ``lengths`` draws the K/V length of every sequence; for ``jagged`` and ``dense`` the queries
    have the same lengths (self-attention), for ``broadcast_q`` one shared query block of
    ``q_len`` rows attends to every K/V sequence; a ``jagged`` workload with ``q_lengths`` is
    cross-attention: sequence ``i`` has ``q_lengths``' i-th draw of queries against
    ``lengths``' i-th draw of keys (both specs draw the same count; ``smoke_q_lengths`` is its
    smoke version, default ``q_lengths.smoke()``). ``kv_heads`` defaults to ``heads`` (GQA when
    smaller). ``window`` is ``(left, right)`` with -1 unbounded, aligned bottom-right like
    ``causal``. ``blocks`` makes it a block-sparse workload (:mod:`jagflash.bench.sparsity`):
    every provider that takes a block mask runs that mask, the others say they take none;
    ``baseline`` names the workload of the same batch without the mask (the dense rows its
    speed-ups are against; the CLI adds it for the jagflash providers).
    """

    name: str
    kind: str
    lengths: LengthSpec
    heads: int = 16
    kv_heads: int | None = None
    head_dim: int = 128
    dtype: str = "bfloat16"
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    q_len: int | None = None
    seed: int = 0
    smoke_lengths: LengthSpec | None = None
    smoke_q_len: int = 8
    q_lengths: LengthSpec | None = None
    smoke_q_lengths: LengthSpec | None = None
    is_smoke: bool = False
    # Run order (lower first) when a time budget may cut the run short; tables keep WORKLOADS order.
    priority: int = 5
    blocks: BlockPattern | None = None
    baseline: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.kind not in KINDS:
            problems.append(f"kind {self.kind!r} not in {KINDS}")
        if self.dtype not in DTYPES:
            problems.append(f"dtype {self.dtype!r} not in {DTYPES}")
        if self.heads % self.hkv:
            problems.append(f"heads {self.heads} not a multiple of kv_heads {self.hkv}")
        if (self.kind == "broadcast_q") != (self.q_len is not None):
            problems.append("q_len is set exactly for broadcast_q workloads")
        if self.blocks is not None and self.kind == "broadcast_q":
            problems.append("block patterns are for dense and jagged workloads")
        if self.q_lengths is not None and self.kind != "jagged":
            problems.append("q_lengths (cross-attention) is for jagged workloads")
        if problems:
            raise ValueError(f"workload {self.name}: " + "; ".join(problems))

    @property
    def hkv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def group(self) -> int:
        return self.heads // self.hkv

    @property
    def gqa(self) -> bool:
        return self.hkv != self.heads

    @property
    def has_window(self) -> bool:
        return tuple(self.window) != (-1, -1)

    def sample_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """``(q_lens, kv_lens)``: int64 per sequence, deterministic in ``seed``."""
        kv = np.asarray(self.lengths.sample(np.random.default_rng(self.seed)), dtype=np.int64)
        if self.kind == "broadcast_q":
            return np.full(kv.shape, self.q_len, dtype=np.int64), kv
        if self.q_lengths is not None:
            q = np.asarray(self.q_lengths.sample(np.random.default_rng([self.seed, 1])), dtype=np.int64)
            if q.shape != kv.shape:
                raise ValueError(f"workload {self.name}: q_lengths drew {q.size} sequences, lengths {kv.size}")
            return q, kv
        return kv.copy(), kv

    def smoke(self, dtype: str = "float32") -> Workload:
        """The tiny version ``--smoke`` runs: same kind, features and GQA ratio; float32 for the
        CPU's interpreter, a 16-bit ``dtype`` for a smoke run on a GPU."""
        if self.is_smoke:
            return self if self.dtype == dtype else dataclasses.replace(self, dtype=dtype)
        hkv = 1 if self.gqa else 2
        return dataclasses.replace(
            self,
            lengths=self.smoke_lengths or self.lengths.smoke(),
            smoke_lengths=None,
            heads=hkv * min(self.group, 4),
            kv_heads=hkv,
            head_dim=32,
            dtype=dtype,
            q_len=None if self.q_len is None else min(self.q_len, self.smoke_q_len),
            q_lengths=None if self.q_lengths is None else (self.smoke_q_lengths or self.q_lengths.smoke()),
            smoke_q_lengths=None,
            window=tuple(s if s < 0 else min(s, SMOKE_WINDOW) for s in self.window),
            blocks=None if self.blocks is None else dataclasses.replace(self.blocks, block=SMOKE_BLOCK),
            is_smoke=True,
        )

    def describe(self) -> str:
        bits = [self.kind]
        if self.kind == "broadcast_q":
            bits.append(f"Lq {self.q_len} vs")
        if self.q_lengths is not None:
            bits.append(f"queries {self.q_lengths.describe()} vs keys")
        bits.append(self.lengths.describe())
        bits.append(f"H{self.heads}" + (f"/{self.hkv}" if self.gqa else "") + f" D{self.head_dim}")
        bits.append(self.dtype)
        if self.causal:
            bits.append("causal")
        if self.has_window:
            bits.append(f"window {tuple(self.window)}")
        if self.blocks is not None:
            bits.append(self.blocks.describe())
        return ", ".join(bits)


_LOGNORMAL = Lognormal(128, 512, 1.0, 4096)
_HEAVY_TAIL = Mix((Fixed(2, 4096), Uniform(120, 32, 768)))
_HEAVY_TAIL_SMOKE = Mix((Fixed(1, SMOKE_MAX_LEN), Uniform(3, 2, 12)))
_TINY = Uniform(2048, 1, 64)
#: Mostly-short histories with a heavy tail (issue 20's batch: most under 30 tokens, a few at 1,024).
_POWER_LAW = PowerLaw(256, 1.1, 6, 1024)
_BIMODAL = Bimodal(112, 16)
#: Smoke lengths of the block-sparse workloads: a few 64-blocks per sequence, partial ones too.
_BS_SMOKE = Mix((Fixed(1, SMOKE_BS_MAX_LEN), Uniform(2, 60, 140)), shuffle=False)


def _bs(batch: str, pattern: str, blocks: BlockPattern, priority: int) -> Workload:
    """A block-sparse workload (causal, H16 D128 bf16) on the batch of its ``baseline``."""
    base = {"lognormal": "jagged-lognormal-causal-d128", "dense8k": "dense-b4h16n8192d128-causal"}[batch]
    kind, lengths = ("jagged", _LOGNORMAL) if batch == "lognormal" else ("dense", Fixed(4, 8192))
    return Workload(
        f"bs-{batch}-{pattern}", kind, lengths, causal=True, blocks=blocks, baseline=base,
        smoke_lengths=_BS_SMOKE if kind == "jagged" else Fixed(2, 3 * SMOKE_BLOCK), priority=priority,
    )


def _bs_set(batch: str, before: int, k: int, priority: int) -> tuple[Workload, ...]:
    rnd = [_bs(batch, f"d{round(100 * d)}", BlockPattern("random", density=d, seed=22), priority + (d != 0.25)) for d in (0.1, 0.25, 0.5)]
    return (
        *rnd,
        _bs(batch, "local-global", BlockPattern("local_global", before=before, sinks=1), priority),
        _bs(batch, "topk", BlockPattern("top_k", k=k, seed=22), priority + 1),
    )


def _bq(q_len: int, count: int, priority: int = 5) -> Workload:
    return Workload(
        f"bq-lq{q_len}-b{count}",
        "broadcast_q",
        Lognormal(count, 512, 1.0, 4096),
        q_len=q_len,
        smoke_q_len=8 if q_len <= 256 else 24,
        priority=priority,
    )


#: Every workload, in the order tables list them (and in which a budget-cut run reaches them).
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        # dense: what every attention kernel is measured on
        Workload("dense-b4h16n4096d128", "dense", Fixed(4, 4096), priority=1),
        Workload("dense-b4h16n4096d128-causal", "dense", Fixed(4, 4096), causal=True, priority=2),
        Workload("dense-b4h32n8192d128", "dense", Fixed(4, 8192), heads=32),
        # jagged: 128 lognormal sequences (median 512, sigma 1, <= 4096) and friends
        Workload("jagged-lognormal-d128", "jagged", _LOGNORMAL, priority=0),
        Workload("jagged-lognormal-causal-d128", "jagged", _LOGNORMAL, causal=True, priority=1),
        Workload("jagged-heavytail-d128", "jagged", _HEAVY_TAIL, smoke_lengths=_HEAVY_TAIL_SMOKE),
        Workload("jagged-tiny-d128", "jagged", _TINY, smoke_lengths=Uniform(6, 1, 9)),
        Workload("jagged-bimodal-d128", "jagged", _BIMODAL),
        Workload("jagged-lognormal-d64", "jagged", _LOGNORMAL, head_dim=64),
        Workload("jagged-lognormal-causal-d64", "jagged", _LOGNORMAL, head_dim=64, causal=True),
        Workload("jagged-lognormal-gqa4-d128", "jagged", _LOGNORMAL, kv_heads=4),
        Workload(
            "jagged-lognormal-causal-gqa4-d128", "jagged", _LOGNORMAL, kv_heads=4, causal=True
        ),
        # sliding windows (causal, bottom-right aligned): the band's cost against the same batch
        # without a window (the rows above and the no-window dense / heavy-tail rows here)
        Workload("jagged-lognormal-causal-left256-d128", "jagged", _LOGNORMAL, causal=True, window=(256, -1), priority=2),
        Workload("jagged-lognormal-causal-left1024-d128", "jagged", _LOGNORMAL, causal=True, window=(1024, -1)),
        Workload("dense-b4h16n8192d128-causal", "dense", Fixed(4, 8192), causal=True),
        Workload("dense-b4h16n8192d128-causal-left1024", "dense", Fixed(4, 8192), causal=True, window=(1024, -1), priority=3),
        Workload("dense-b4h16n8192d128-causal-left4096", "dense", Fixed(4, 8192), causal=True, window=(4096, -1)),
        Workload("jagged-heavytail-causal-d128", "jagged", _HEAVY_TAIL, causal=True, smoke_lengths=_HEAVY_TAIL_SMOKE),
        Workload(
            "jagged-heavytail-causal-left128-d128", "jagged", _HEAVY_TAIL, causal=True, window=(128, -1),
            smoke_lengths=_HEAVY_TAIL_SMOKE,
        ),
        # broadcast-Q: one query block against many lognormal K/V sequences
        _bq(64, 1024),
        _bq(256, 256),
        _bq(256, 64, priority=2),
        _bq(1024, 64),
        # block-sparse (causal; density = share of the causal band's blocks): the lognormal batch
        # (median 4 blocks a sequence) and dense 4 x 8192 (64 blocks), against their baselines
        *_bs_set("lognormal", before=1, k=2, priority=6),
        *_bs_set("dense8k", before=3, k=8, priority=6),
        # short and skewed (issue 20): calls whose work is microseconds, so per-call cost and
        # tile shape decide them; the power-law batches at two exponents, one-token sequences,
        # a few queries against ~1,000 keys (candidates against a history), one query or four
        # (GQA) per sequence against lognormal histories (decode), and one tiny sequence (the
        # fixed cost of a call, eager and with --cuda-graphs)
        Workload("short-powerlaw-a1.1-d128", "jagged", _POWER_LAW, seed=20, priority=7),
        Workload("short-powerlaw-a1.1-causal-d128", "jagged", _POWER_LAW, causal=True, seed=20, priority=7),
        Workload("short-powerlaw-a1.6-d128", "jagged", PowerLaw(256, 1.6, 6, 1024), seed=20, priority=7),
        Workload("short-1tok-b4096-d128", "jagged", Fixed(4096, 1), smoke_lengths=Fixed(5, 1), priority=7),
        Workload(
            "short-xattn-q1-64-k1024-d128", "jagged", Uniform(512, 960, 1089), q_lengths=Uniform(512, 1, 65),
            smoke_lengths=Uniform(3, 20, 41), smoke_q_lengths=Uniform(3, 1, 9), priority=7,
        ),
        Workload(
            "short-decode-q1-lognormal-d128", "jagged", Lognormal(1024, 512, 1.0, 4096), q_lengths=Fixed(1024, 1),
            smoke_q_lengths=Fixed(3, 1), priority=7,
        ),
        Workload(
            "short-decode-q4-gqa4-lognormal-d128", "jagged", Lognormal(1024, 512, 1.0, 4096), kv_heads=4,
            q_lengths=Fixed(1024, 4), smoke_q_lengths=Fixed(3, 4), priority=7,
        ),
        Workload("short-percall-b1n16-d128", "jagged", Fixed(1, 16), smoke_lengths=Fixed(1, 16), priority=7),
    )
}

#: The block-sparse workloads (``bs-*``).
BLOCK_SPARSE_WORKLOADS = tuple(name for name, w in WORKLOADS.items() if w.blocks is not None)

#: The sliding-window workloads (``*-left*``): their smoke versions, the bench's window check.
WINDOW_WORKLOADS = tuple(name for name, w in WORKLOADS.items() if w.has_window)

#: The short-and-skewed workloads (``short-*``, issue 20).
SHORT_WORKLOADS = tuple(name for name in WORKLOADS if name.startswith("short-"))

#: What ``--smoke`` runs unless ``--workloads`` says otherwise: one of each kind and feature.
SMOKE_DEFAULT = (
    "dense-b4h16n4096d128-causal",
    "jagged-lognormal-d128",
    "jagged-heavytail-d128",
    "jagged-lognormal-causal-gqa4-d128",
    "bq-lq256-b64",
)


def run_order(workloads: list[Workload]) -> list[Workload]:
    """The order a run visits ``workloads``: by priority, then as listed."""
    return sorted(workloads, key=lambda w: w.priority)  # sorted() is stable


def get(name: str, *, smoke: bool = False, smoke_dtype: str = "float32") -> Workload:
    w = WORKLOADS[name]
    return w.smoke(smoke_dtype) if smoke else w


def select(
    patterns: str | None, *, smoke: bool = False, smoke_dtype: str = "float32"
) -> list[Workload]:
    """Workloads whose names match any comma-separated glob, in :data:`WORKLOADS` order.

    ``None`` means every workload (``SMOKE_DEFAULT`` with ``smoke``). A pattern that matches
    nothing is an error, so a typo does not silently benchmark nothing.
    """
    if patterns is None:
        names = list(SMOKE_DEFAULT) if smoke else list(WORKLOADS)
    else:
        pats = [p.strip() for p in patterns.split(",") if p.strip()]
        missing = [p for p in pats if not fnmatch.filter(WORKLOADS, p)]
        if missing:
            raise ValueError(
                f"no workload matches {', '.join(missing)}; known: {', '.join(WORKLOADS)}"
            )
        names = [n for n in WORKLOADS if any(fnmatch.fnmatchcase(n, p) for p in pats)]
    return [get(n, smoke=smoke, smoke_dtype=smoke_dtype) for n in names]
