"""What a variant can run, as data, and the errors that explain a refusal.

A variant declares one frozen :class:`VariantSpec`. Each of its backends (stock Triton on CUDA,
the Triton interpreter on CPU, plain PyTorch, TLX on Hopper) is a :class:`BackendSpec` with the
devices, compute capability, dtypes, head dims and features it handles forward and backward.
:func:`not_supported_reasons` compares a :class:`Problem` against a spec and returns *every*
reason it cannot run, so an error names all of them at once instead of the first one found.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch

__all__ = [
    "DEFAULT_ATOL",
    "FEATURES",
    "BackendSpec",
    "InterpreterChanged",
    "InvalidInput",
    "Problem",
    "UnsupportedProblem",
    "VariantSpec",
    "not_supported_reasons",
]

#: Features a problem may ask for; specs list the ones each backend handles.
FEATURES = frozenset(
    {
        "causal",  # bottom-right aligned causal mask
        "window",  # sliding window (left, right)
        "gqa",  # Hq > Hkv
        "lse",  # log-sum-exp returned to the caller
        "deterministic",  # bitwise repeatable backward
    }
)


#: Absolute slack of the tolerance rule per dtype, for specs that have no reason to differ.
DEFAULT_ATOL = {
    torch.float64: 1e-10,
    torch.float32: 2e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1e-2,
}


class UnsupportedProblem(NotImplementedError):
    """A valid problem that this variant (or backend) does not implement.

    ``reasons`` holds every reason; the message lists them all, e.g.
    ``jagged (portable) cannot run this: head_dim 96 not in {32, 64, 128}; dtype torch.float64
    not in {float16, bfloat16}``.
    """

    def __init__(self, who: str, reasons: Iterable[str]):
        self.who = who
        self.reasons = list(reasons)
        super().__init__(f"{who} cannot run this: " + "; ".join(self.reasons))


class InvalidInput(ValueError):
    """The inputs break the semantics (bad offsets, shapes, devices): no variant could run them.

    ``reasons`` holds every problem found, and the message lists them all.
    """

    def __init__(self, who: str, reasons: Iterable[str]):
        self.who = who
        self.reasons = list(reasons)
        super().__init__(f"{who}: invalid input: " + "; ".join(self.reasons))


class InterpreterChanged(RuntimeError):
    """``TRITON_INTERPRET`` changed after jagflash's kernels were imported (they are built for
    the interpreter or for the GPU at import): the process cannot run them as it is now.
    The message says what to do."""

    def __init__(self, who: str, reason: str):
        self.who = who
        self.reason = reason
        super().__init__(f"{who} cannot run: {reason}")


@dataclass(frozen=True)
class Problem:
    """What a call asks for, in the terms a spec is written in. Built without touching data."""

    layout: str  # "dense", "jagged" or "broadcast_q"
    device_type: str  # "cpu", "cuda", ...
    dtype: torch.dtype
    head_dim: int
    hq: int
    hkv: int
    features: frozenset[str] = frozenset()
    backward: bool = False
    # (major, minor) for CUDA devices; None elsewhere. Filled lazily by the backend selector so
    # that building a Problem never queries a GPU.
    capability: tuple[int, int] | None = None

    def with_capability(self, capability: tuple[int, int] | None) -> Problem:
        return dataclasses.replace(self, capability=capability)


def _names(items: Iterable[object]) -> str:
    def key(x: object) -> tuple[int, str]:
        return (x, "") if isinstance(x, int) else (0, str(x).removeprefix("torch."))  # type: ignore[return-value]

    return "{" + ", ".join(key(x)[1] or str(x) for x in sorted(items, key=key)) + "}"


@dataclass(frozen=True)
class BackendSpec:
    """One backend of a variant: where it runs and what it computes.

    ``available`` is called at selection time (never at import) and returns the reasons the
    backend cannot run in this process at all (Triton missing, interpreter off, ...).
    """

    name: str
    devices: frozenset[str]
    dtypes: frozenset[torch.dtype]
    head_dims_fwd: frozenset[int] | range
    head_dims_bwd: frozenset[int] | range
    features_fwd: frozenset[str]
    features_bwd: frozenset[str]
    min_capability: tuple[int, int] | None = None
    max_capability: tuple[int, int] | None = None
    available: Callable[[], list[str]] = field(default=lambda: [], compare=False)
    notes: str = ""

    def reasons(self, problem: Problem) -> list[str]:
        out = list(self.available())
        if problem.device_type not in self.devices:
            out.append(f"device {problem.device_type} not in {_names(self.devices)}")
        elif problem.device_type == "cuda" and problem.capability is not None:
            cap = problem.capability
            if self.min_capability is not None and cap < self.min_capability:
                out.append(
                    f"compute capability {cap[0]}.{cap[1]} below "
                    f"{self.min_capability[0]}.{self.min_capability[1]}"
                )
            if self.max_capability is not None and cap > self.max_capability:
                out.append(
                    f"compute capability {cap[0]}.{cap[1]} above "
                    f"{self.max_capability[0]}.{self.max_capability[1]}"
                )
        if problem.dtype not in self.dtypes:
            out.append(f"dtype {_names([problem.dtype])[1:-1]} not in {_names(self.dtypes)}")
        dims = self.head_dims_bwd if problem.backward else self.head_dims_fwd
        if problem.backward and not dims:
            out.append("backward not implemented (forward only)")
        elif problem.head_dim not in dims:
            what = "backward with head_dim" if problem.backward else "head_dim"
            shown = f"{dims.start}..{dims.stop - 1}" if isinstance(dims, range) else _names(dims)
            out.append(f"{what} {problem.head_dim} not in {shown}")
        feats = self.features_bwd if problem.backward else self.features_fwd
        if problem.backward and not dims:
            return out
        for feat in sorted(problem.features - feats):
            out.append(f"{'backward' if problem.backward else 'forward'} with {feat} not supported")
        return out


@dataclass(frozen=True)
class VariantSpec:
    """Everything a variant can do, per backend, in preference order (fastest first).

    ``atol`` is the absolute slack of the tolerance rule per dtype (see
    ``jagflash.testing.tolerance``); ``layouts`` the input layouts the variant accepts.
    """

    name: str
    layouts: frozenset[str]
    backends: tuple[BackendSpec, ...]
    atol: Mapping[torch.dtype, float] = field(default_factory=dict)

    def backend(self, name: str) -> BackendSpec:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(f"{self.name} has no backend {name!r}; it has {[b.name for b in self.backends]}")

    def backend_names(self) -> list[str]:
        return [b.name for b in self.backends]


def not_supported_reasons(
    spec: VariantSpec, problem: Problem, backend: str | None = None
) -> list[str]:
    """Every reason ``spec`` cannot run ``problem`` (on ``backend``, or on any of its backends).

    Empty when it can. With ``backend=None`` the problem is supported when any backend takes it;
    the reasons then name each backend's own reasons.
    """
    if problem.layout not in spec.layouts:
        return [f"layout {problem.layout} not in {_names(spec.layouts)}"]
    if backend is not None:
        return [f"{backend}: {r}" for r in spec.backend(backend).reasons(problem)]
    out: list[str] = []
    for b in spec.backends:
        rs = b.reasons(problem)
        if not rs:
            return []
        out.extend(f"{b.name}: {r}" for r in rs)
    return out
