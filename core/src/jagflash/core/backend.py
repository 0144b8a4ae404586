"""Which backend runs a call, and why the others did not.

Backends, fastest first (a variant's spec lists the ones it has, in this order):

=============  ============================================================================
``tlx-sm90``   TLX warp-specialised kernels, Hopper only
``portable``   stock Triton kernels on a CUDA GPU
``interpreter`` the same stock Triton kernels run by Triton's interpreter on the CPU
               (``TRITON_INTERPRET=1`` must be set before jagflash's kernels are imported)
``reference``  plain PyTorch, one sequence at a time (``jagflash.core.reference``)
=============  ============================================================================

Choice per call: the ``backend=`` argument, else the ``JAGFLASH_BACKEND`` environment variable,
else the first backend of the spec that can run the problem. A requested backend that cannot
run the problem raises :class:`~jagflash.core.capability.UnsupportedProblem` with its reasons;
it never falls back. When the automatic choice lands on ``reference`` although the variant has
kernel backends, a :class:`FallbackWarning` names why each faster one could not run.
:func:`last_choice` tells which backend ran last for a variant, and why the others did not.

Nothing here queries a GPU at import time.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from dataclasses import dataclass, field

import torch

from jagflash.core.capability import BackendSpec, Problem, UnsupportedProblem, VariantSpec
from jagflash.core.tuning import PORTABLE_HEAD_DIMS, TLX_HEAD_DIMS

__all__ = [
    "BACKENDS",
    "BackendChoice",
    "FallbackWarning",
    "device_capability",
    "interpreter_reasons",
    "last_choice",
    "plan_backend",
    "portable_family",
    "portable_reasons",
    "select",
    "tlx_reasons",
    "tlx_sm90_backend",
]

BACKENDS = ("tlx-sm90", "portable", "interpreter", "reference")
ENV_VAR = "JAGFLASH_BACKEND"


class FallbackWarning(UserWarning):
    """The automatic choice fell back to the slow PyTorch reference."""


@dataclass(frozen=True)
class BackendChoice:
    """The backend that runs a call, and for every other backend the reasons it did not."""

    variant: str
    name: str
    why: str
    reasons: dict[str, list[str]] = field(default_factory=dict)

    def explain(self) -> str:
        lines = [f"{self.variant}: ran {self.name} ({self.why})"]
        for other, rs in self.reasons.items():
            lines.append(f"  {other}: " + ("; ".join(rs) if rs else "not tried"))
        return "\n".join(lines)


_last: dict[str, BackendChoice] = {}


def last_choice(variant: str) -> BackendChoice | None:
    """The choice made by the latest call of ``variant`` in this process (``None`` before one)."""
    return _last.get(variant)


def _triton_reasons() -> list[str]:
    try:
        import triton  # noqa: F401
    except ImportError as e:  # pragma: no cover - triton is a dependency
        return [f"triton is not importable ({e})"]
    return []


def _kernels_interpreted() -> bool:
    """Whether jagflash's Triton functions were built for the interpreter (fixed at import)."""
    from triton.runtime.interpreter import InterpretedFunction

    from jagflash.core.softmax import finish_softmax  # a @triton.jit function of core, no kernels

    return isinstance(finish_softmax, InterpretedFunction)


def interpreter_reasons() -> list[str]:
    """Reasons the Triton interpreter cannot run jagflash's kernels in this process."""
    reasons = _triton_reasons()
    if reasons:
        return reasons
    if not _kernels_interpreted():
        if os.environ.get("TRITON_INTERPRET") == "1":
            return [
                "TRITON_INTERPRET=1 was set after jagflash's kernels were imported; "
                "set it before importing jagflash"
            ]
        return ["Triton's interpreter is off (set TRITON_INTERPRET=1 before importing jagflash)"]
    return []


def portable_reasons() -> list[str]:
    """Reasons stock Triton cannot compile jagflash's kernels for a GPU in this process."""
    reasons = _triton_reasons()
    if not reasons and _kernels_interpreted():
        reasons.append("TRITON_INTERPRET=1 is set, so Triton only interprets on the CPU")
    if not torch.cuda.is_available():
        reasons.append("no CUDA device")
    return reasons


def tlx_reasons() -> list[str]:
    """Reasons the TLX (Hopper) kernels cannot run in this process."""
    reasons = portable_reasons()
    try:
        import triton.language.extra.tlx  # noqa: F401
    except ImportError as e:
        reasons.append(f"TLX is not importable ({e}); install triton-utlx (the `tlx` extra)")
    return reasons


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))  # type: ignore[return-value]


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """(major, minor) of a CUDA device, cached; ``None`` for other devices."""
    if device.type != "cuda":
        return None
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


def select(
    spec: VariantSpec,
    problem: Problem,
    device: torch.device,
    requested: str | None = None,
    *,
    record: bool = True,
) -> BackendChoice:
    """Pick the backend of ``spec`` that runs ``problem`` (see the module docstring).
    ``record=False``: a look-ahead (:func:`plan_backend`), which neither warns nor changes
    :func:`last_choice`."""
    problem = problem.with_capability(device_capability(device))
    how = "backend= argument"
    if requested is None and os.environ.get(ENV_VAR):
        requested, how = os.environ[ENV_VAR], f"{ENV_VAR}={os.environ[ENV_VAR]}"
    if requested is not None and problem.backward and requested in spec.backend_names():
        asked = spec.backend(requested)
        missing = asked.reasons(problem)
        if missing and (not asked.head_dims_bwd or not asked.reasons(dataclasses.replace(problem, backward=False))):
            # The backend asked for runs this forward but not its backward (forward-only, or
            # not this head dim): the backward of its calls runs on the fastest backend that
            # has one (they share the LSE convention, so they compose).
            forward_only, requested = requested, None
            how = f"{forward_only} has no backward for this problem ({'; '.join(missing)})"
    if requested is not None and requested != "auto":
        if requested not in spec.backend_names():
            raise UnsupportedProblem(
                f"{spec.name} ({requested})",
                [f"no backend {requested!r}; this variant has {spec.backend_names()}"],
            )
        reasons = spec.backend(requested).reasons(problem)
        if reasons:
            raise UnsupportedProblem(f"{spec.name} ({requested})", reasons)
        others = {b.name: [f"not chosen: {how} asked for {requested}"] for b in spec.backends if b.name != requested}
        choice = BackendChoice(spec.name, requested, f"requested by {how}", others)
    else:
        tried: dict[str, list[str]] = {}
        choice = None
        for b in spec.backends:
            rs = b.reasons(problem)
            if not rs:
                rest = {o.name: ["not tried: a faster backend runs this"] for o in spec.backends if o.name not in tried and o.name != b.name}
                why = "fastest backend that runs this"
                if how != "backend= argument":
                    why += f" ({how})"
                choice = BackendChoice(spec.name, b.name, why, {**tried, **rest})
                break
            tried[b.name] = rs
        if choice is None:
            raise UnsupportedProblem(
                spec.name, [f"{name}: {r}" for name, rs in tried.items() for r in rs]
            )
        if choice.name == "reference" and tried and record:
            warnings.warn(
                f"{spec.name}: falling back to the slow PyTorch reference; "
                + "; ".join(f"{n}: {', '.join(rs)}" for n, rs in tried.items()),
                FallbackWarning,
                stacklevel=3,
            )
    if record:
        _last[spec.name] = choice
    return choice


def plan_backend(spec: VariantSpec, problem: Problem, device: torch.device, requested: str | None) -> str:
    """The backend whose kernels a call's Plan is laid out for: the one :func:`select` will
    pick for the call's forward (a call refused there is refused by its op: then any)."""
    try:
        return select(spec, problem, device, requested or None, record=False).name
    except UnsupportedProblem:
        return "portable"


def tlx_sm90_backend(features: frozenset[str]) -> BackendSpec:
    """The TLX warp-specialised kernels of ``jagflash.core.tlx`` (Hopper only):
    forward, and a backward that runs in one pass with dQ reduce-added from every kv-tile where
    ``jagflash.core.tuning.use_one_pass`` says so (D 64 and 128, causal or not, no left bound, not
    ``deterministic``), and otherwise as a portable dQ pass and a TLX dK/dV pass, without
    atomics in the jagged and dense variants: deterministic."""
    return BackendSpec(
        name="tlx-sm90",
        devices=frozenset({"cuda"}),
        min_capability=(9, 0),
        max_capability=(9, 0),
        dtypes=frozenset({torch.float16, torch.bfloat16}),
        head_dims_fwd=frozenset(TLX_HEAD_DIMS),
        head_dims_bwd=frozenset(TLX_HEAD_DIMS),
        features_fwd=features,
        features_bwd=features | {"deterministic"},
        available=tlx_reasons,
        notes="TMA producer + two ping-pong wgmma consumer warpgroups; one-pass backward with TMA dQ reduce-adds unless windowed or deterministic",
    )


def portable_family(features: frozenset[str]) -> tuple[BackendSpec, ...]:
    """The backends of a variant built on ``jagflash.core.portable``: stock Triton on CUDA, the
    same kernels interpreted on the CPU, and the PyTorch reference, in that order.

    ``features`` are the problem features the variant implements forward; the backward adds
    ``deterministic`` (the portable backward uses no atomics).
    """
    bwd = features | {"deterministic"}
    return (
        BackendSpec(
            name="portable",
            devices=frozenset({"cuda"}),
            min_capability=(8, 0),
            dtypes=frozenset({torch.float16, torch.bfloat16}),
            head_dims_fwd=PORTABLE_HEAD_DIMS,
            # dK and dV of a 256-wide head do not fit in registers beside K and V.
            head_dims_bwd=PORTABLE_HEAD_DIMS - {256},
            features_fwd=features,
            features_bwd=bwd,
            available=portable_reasons,
            notes="stock Triton; deterministic backward",
        ),
        BackendSpec(
            name="interpreter",
            devices=frozenset({"cpu"}),
            # bf16 is upcast to fp32 before the kernel: the interpreter computes bf16 wrongly.
            dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16}),
            head_dims_fwd=PORTABLE_HEAD_DIMS,
            head_dims_bwd=PORTABLE_HEAD_DIMS,
            features_fwd=features,
            features_bwd=bwd,
            available=interpreter_reasons,
            notes="the portable kernels under TRITON_INTERPRET=1; bf16 runs as fp32",
        ),
        BackendSpec(
            name="reference",
            devices=frozenset({"cpu", "cuda"}),
            dtypes=frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16}),
            head_dims_fwd=range(1, 513),
            head_dims_bwd=range(1, 513),
            features_fwd=features,
            features_bwd=bwd,
            notes="plain PyTorch, one sequence at a time, fp32 math",
        ),
    )
