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
it never falls back.

No silent slow path: the automatic choice never lands on ``reference`` for a variant that has
kernel backends. A problem none of them takes raises ``UnsupportedProblem`` listing every
backend's reasons, unless the caller asked for the reference: ``backend="reference"``
(or ``JAGFLASH_BACKEND=reference``), or the opt-in ``JAGFLASH_ALLOW_REFERENCE=1`` in the
environment (read at every call), which lets the automatic choice end on the reference;
:func:`last_choice` then says why each faster backend could not run.

``TRITON_INTERPRET`` is fixed for jagflash's kernels when they are imported. A call that finds
it changed since (set after the import, or unset) raises
:class:`~jagflash.core.capability.InterpreterChanged` naming what to do, instead of running
kernels built for one mode under the other; ``backend="reference"`` needs no Triton and runs.
:func:`last_choice` tells which backend ran last for a variant, and why the others did not.

Nothing here queries a GPU at import time.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field

import torch

from jagflash.core.capability import (
    BackendSpec,
    InterpreterChanged,
    Problem,
    UnsupportedProblem,
    VariantSpec,
)
from jagflash.core.tuning import PORTABLE_HEAD_DIMS, TLX_HEAD_DIMS

__all__ = [
    "ALLOW_REFERENCE_ENV",
    "BACKENDS",
    "BackendChoice",
    "device_capability",
    "interpreter_mismatch",
    "interpreter_reasons",
    "kernel_backends",
    "last_choice",
    "plan_backend",
    "portable_family",
    "portable_reasons",
    "record_path",
    "reference_allowed",
    "select",
    "tlx_reasons",
    "tlx_sm90_backend",
]

BACKENDS = ("tlx-sm90", "portable", "interpreter", "reference")
ENV_VAR = "JAGFLASH_BACKEND"
#: Set to ``1`` to let the automatic choice end on the PyTorch reference (module docstring).
ALLOW_REFERENCE_ENV = "JAGFLASH_ALLOW_REFERENCE"


def reference_allowed() -> bool:
    """Whether ``JAGFLASH_ALLOW_REFERENCE=1`` is set now (read at every call)."""
    return os.environ.get(ALLOW_REFERENCE_ENV, "") == "1"


@dataclass(frozen=True)
class BackendChoice:
    """The backend that runs a call, and for every other backend the reasons it did not;
    ``path``: which of the backend's kernels ran where it has a choice (``"decode"`` or
    ``"tiles"``: ``jagflash.core.tuning.use_decode``), and why (``path_why``), in the pass
    ``path_pass`` (``"forward"`` or ``"backward"``)."""

    variant: str
    name: str
    why: str
    reasons: dict[str, list[str]] = field(default_factory=dict)
    path: str | None = None
    path_why: str = ""
    path_pass: str = "forward"

    def explain(self) -> str:
        lines = [f"{self.variant}: ran {self.name} ({self.why})"]
        if self.path is not None:
            lines.append(f"  {self.path_pass} path: {self.path} ({self.path_why})")
        for other, rs in self.reasons.items():
            lines.append(f"  {other}: " + ("; ".join(rs) if rs else "not tried"))
        return "\n".join(lines)


_last: dict[str, BackendChoice] = {}


def last_choice(variant: str) -> BackendChoice | None:
    """The choice made by the latest call of ``variant`` in this process (``None`` before one)."""
    return _last.get(variant)


def record_path(variant: str, path: str, why: str, direction: str = "forward") -> None:
    """Add to ``variant``'s :func:`last_choice` (the ``direction`` pass's, just made: forward or
    backward) which of its kernels ran and why (:attr:`BackendChoice.path`)."""
    choice = _last.get(variant)
    if choice is None:
        return
    key = (id(choice), path, why, direction)
    hit = _with_path.get(key)
    if hit is None or hit[0] is not choice:  # the choice kept so that its id stays its own
        if len(_with_path) >= _CHOICES_KEEP:
            _with_path.clear()
        hit = _with_path[key] = (
            choice, dataclasses.replace(choice, path=path, path_why=why, path_pass=direction)
        )
    _last[variant] = hit[1]


#: record_path's choices with their path: (choice, with path) by (id of the choice, path, why);
#: a choice is frozen, so the same choice with the same path is one object, made once.
_with_path: dict[tuple, tuple] = {}


@functools.cache
def _triton_knobs():
    """``triton.knobs``, or the ImportError that importing triton raised (asked once: every
    call's selection reads the interpreter mode)."""
    try:
        from triton import knobs
    except ImportError as e:  # pragma: no cover - triton is a dependency
        return e
    return knobs


def _triton_reasons() -> list[str]:
    knobs = _triton_knobs()
    if isinstance(knobs, ImportError):  # pragma: no cover - triton is a dependency
        return [f"triton is not importable ({knobs})"]
    return []


@functools.cache
def _kernels_interpreted() -> bool:
    """Whether jagflash's Triton functions were built for the interpreter (fixed at import, so
    asked once: every call's selection asks it several times)."""
    from triton.runtime.interpreter import InterpretedFunction

    from jagflash.core.softmax import finish_softmax  # a @triton.jit function of core, no kernels

    return isinstance(finish_softmax, InterpretedFunction)


def interpreter_mismatch() -> str | None:
    """Why jagflash's kernels cannot run in this process's current ``TRITON_INTERPRET`` mode,
    or ``None``: they are built in one mode when imported and Triton reads the variable again
    at launch, so a process that changed it since would run them half in each."""
    if _triton_reasons():
        return None
    from triton import knobs

    now, built = bool(knobs.runtime.interpret), _kernels_interpreted()
    if now and not built:
        return (
            "TRITON_INTERPRET=1 was set after jagflash's kernels were imported (they are built "
            "for the GPU); set it before importing jagflash (a new process), unset it again, or "
            "pass backend='reference'"
        )
    if built and not now:
        return (
            "TRITON_INTERPRET was unset after jagflash's kernels were imported under it (they "
            "are built for the interpreter); set TRITON_INTERPRET=1 again, or import jagflash "
            "in a new process without it"
        )
    return None


def interpreter_reasons() -> list[str]:
    """Reasons the Triton interpreter cannot run jagflash's kernels in this process."""
    reasons = _triton_reasons()
    if reasons:
        return reasons
    if not _kernels_interpreted():
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
    ``record=False``: a look-ahead (:func:`plan_backend`), which does not change
    :func:`last_choice`. Raises :class:`UnsupportedProblem` (every backend's reasons) or
    :class:`InterpreterChanged`. A choice is kept per (spec, problem, device, request, the
    environment variables and interpreter mode it read): every call of a model's layers asks
    the same question twice (the plan's look-ahead and the op); refusals are not kept."""
    key = (id(spec), problem, device, device_capability(device), requested, *_env_now(), _interpret_now())
    hit = _choices.get(key)
    if hit is not None and hit[0] is spec:
        choice = hit[1]
    else:
        choice = _select(spec, problem, device, requested)
        if len(_choices) >= _CHOICES_KEEP:
            _choices.clear()
        _choices[key] = (spec, choice)
    if record:
        _last[spec.name] = choice
    return choice


#: select's choices: (spec, choice) by key (the spec kept, so that its id stays its own).
_choices: dict[tuple, tuple[VariantSpec, BackendChoice]] = {}
_CHOICES_KEEP = 256


def _env_now() -> tuple:
    """What :func:`select` reads from the environment (:data:`ENV_VAR`,
    :data:`ALLOW_REFERENCE_ENV`), as a key: the values ``os.environ`` holds now, read from its
    underlying mapping where it has one (``os.environ.get`` encodes the name on every call,
    ~1 us each, twice a call)."""
    data = getattr(os.environ, "_data", None)
    if not isinstance(data, dict):
        return os.environ.get(ENV_VAR), os.environ.get(ALLOW_REFERENCE_ENV)
    return data.get(_env_name(ENV_VAR)), data.get(_env_name(ALLOW_REFERENCE_ENV))


@functools.cache
def _env_name(name: str):
    return os.environ.encodekey(name)  # type: ignore[attr-defined]


def _interpret_now() -> bool | None:
    knobs = _triton_knobs()
    if isinstance(knobs, ImportError):  # pragma: no cover - triton is a dependency
        return None
    return bool(knobs.runtime.interpret)


def _select(spec: VariantSpec, problem: Problem, device: torch.device, requested: str | None) -> BackendChoice:
    problem = problem.with_capability(device_capability(device))
    how = "backend= argument"
    if requested is None and os.environ.get(ENV_VAR):
        requested, how = os.environ[ENV_VAR], f"{ENV_VAR}={os.environ[ENV_VAR]}"
    if requested != "reference":
        changed = interpreter_mismatch()
        if changed is not None:
            raise InterpreterChanged(spec.name, changed)
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
        if choice.name == "reference" and tried:
            if not reference_allowed():
                raise UnsupportedProblem(
                    spec.name,
                    [f"{name}: {r}" for name, rs in tried.items() for r in rs]
                    + [
                        "reference: would run it, but the slow PyTorch reference runs only when "
                        f"asked for (backend='reference', or {ALLOW_REFERENCE_ENV}=1)"
                    ],
                )
            choice = dataclasses.replace(
                choice, why=f"no kernel backend runs this; {ALLOW_REFERENCE_ENV}=1 allows the reference"
            )
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
    ``jagflash.core.tuning.use_one_pass`` says so (D 64 and 128, any mask, not
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
        notes="TMA producer + two ping-pong wgmma consumer warpgroups; one-pass backward with TMA dQ reduce-adds unless deterministic",
    )


def kernel_backends(features: frozenset[str]) -> tuple[BackendSpec, ...]:
    """Every backend of a variant built on core's kernels, fastest first: the TLX kernels
    (:func:`tlx_sm90_backend`: on the H200 their forward and D 128 backward beat the portable
    ones on every bench workload but the many-tiny-sequence one, bench/NOTES.md), then
    :func:`portable_family`."""
    return (tlx_sm90_backend(features), *portable_family(features))


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
