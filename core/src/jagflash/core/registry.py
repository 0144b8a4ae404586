"""Installed variants, and the front door that sends a problem to the best one.

Each variant distribution declares an entry point in the group ``jagflash.variants`` naming its
:class:`Variant` object (``jagged = "jagflash.variants.jagged:VARIANT"``). Source trees put on
``PYTHONPATH`` without being installed have no entry points; their modules under the
``jagflash.variants`` namespace are found as well.

:func:`attention` is the front door: it works out the layout from the arguments, asks every
installed variant for that layout whether it can run the problem, calls the first that can
(highest ``priority`` first) and otherwise raises
:class:`~jagflash.core.capability.UnsupportedProblem` listing each variant's reasons.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import torch

from jagflash.core.backend import select
from jagflash.core.capability import (
    InvalidInput,
    Problem,
    UnsupportedProblem,
    VariantSpec,
    not_supported_reasons,
)

__all__ = ["GROUP", "Variant", "attention", "broken_variants", "variants"]

GROUP = "jagflash.variants"


@dataclass(frozen=True)
class Variant:
    """What a variant exports to the registry.

    ``problem(**call)`` describes a front-door call in spec terms without touching data;
    ``run(**call)`` performs it with the variant's public function.
    ``backward(dout, q, k, v, out, lse, **call) -> (dq, dk, dv)``, where a variant has one: the
    gradients of ``run(q, k, v, **call)`` at the given ``out`` and ``lse``, which may be those
    of a larger attention this call is a part of (the same queries over more keys, merged by
    LSE): the gradients are then that attention's, restricted to this call's keys
    (``jagflash.core.context_parallel`` runs its ring backward on it).
    """

    spec: VariantSpec
    problem: Callable[..., Problem]
    run: Callable[..., Any]
    priority: int = 0
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None


_broken: dict[str, str] = {}
# The table of the last scan, which the front door reuses while torch.compile traces it (the
# entry-point scan itself cannot be traced): an eager call before compiling fills it.
_last_scan: dict[str, Variant] | None = None


def variants() -> dict[str, Variant]:
    """Every variant importable in this process, by name (entry points, then the namespace).

    A variant that fails to load (a half-written scaffold, a missing dependency) is left out and
    its error kept in :func:`broken_variants`, so one broken package does not take the front
    door down for the others."""
    global _last_scan
    found: dict[str, Variant] = {}
    _broken.clear()
    _last_scan = found

    def load(name: str, get: Callable[[], object]) -> None:
        try:
            obj = get()
        except Exception as e:  # any import-time failure of a third-party package
            _broken[name] = f"{type(e).__name__}: {e}"
            return
        if isinstance(obj, Variant):
            found[name] = obj
        else:
            _broken[name] = f"exports {type(obj).__name__}, not a Variant"

    for ep in entry_points(group=GROUP):
        load(ep.name, ep.load)
    try:
        ns = importlib.import_module("jagflash.variants")
    except ImportError:
        return found
    for mod in pkgutil.iter_modules(ns.__path__):
        if mod.name not in found and mod.name not in _broken:
            load(mod.name, lambda m=mod.name: importlib.import_module(f"jagflash.variants.{m}").VARIANT)
    return found


def broken_variants() -> dict[str, str]:
    """Variants the last :func:`variants` call could not load, with the error of each."""
    return dict(_broken)


def _neutral(name: str, value: Any) -> bool:
    """Whether a front-door keyword asks for nothing (so a variant without it may ignore it)."""
    if name == "window":
        return value is None or tuple(value) == (-1, -1)
    return value is None or value is False


def _accepted(run: Callable[..., Any], call: dict[str, Any]) -> dict[str, Any]:
    """The keywords of ``call`` to pass to ``run``: those it takes, less the neutral ones it does
    not (``causal=False`` for a variant without a mask, ``q_offsets=None`` for dense). Anything
    else reaches it and fails loudly; the spec has refused unsupported features before."""
    params = inspect.signature(run).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return call
    return {k: v for k, v in call.items() if k in params or not _neutral(k, v)}


def _layout(q: torch.Tensor, q_offsets: object, kv_offsets: object) -> str:
    if q_offsets is not None and kv_offsets is not None:
        return "jagged"
    if kv_offsets is not None:
        return "broadcast_q"
    if q_offsets is not None:
        raise InvalidInput("attention", ["q_offsets given without kv_offsets"])
    if q.dim() == 4:
        return "dense"
    raise InvalidInput(
        "attention",
        [f"q of rank {q.dim()} with no offsets: pass [B, N, H, D] tensors, or offsets"],
    )


def _cannot_run(spec: VariantSpec, problem: Problem, device: torch.device, backend: str | None) -> list[str]:
    """Why a variant would not run a front-door call: its own backend choice decides (a dry run
    of :func:`~jagflash.core.backend.select`), so one whose only fit is the reference is passed
    over unless the caller asked for the reference. While torch.compile traces, the same rule
    from the specs alone (``select`` reads the environment, which cannot be traced): a kernel
    backend takes it, or the backend asked for does."""
    if torch.compiler.is_compiling():
        if backend is not None:
            return not_supported_reasons(spec, problem, backend)
        kernels = [b for b in spec.backends if b.name != "reference"]
        fits = [b for b in kernels if not b.reasons(problem)]
        return [] if fits else [f"{b.name}: {r}" for b in kernels for r in b.reasons(problem)]
    try:
        select(spec, problem, device, backend, record=False)
    except UnsupportedProblem as e:
        return [f"{backend}: {r}" if backend else r for r in e.reasons]
    return []


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **call: Any) -> Any:
    """Attention through the best installed variant.

    Layout from the arguments: ``q_offsets`` and ``kv_offsets`` -> jagged ``[T, H, D]``;
    ``kv_offsets`` alone -> broadcast-Q (dense ``q [Lq, Hq, D]`` against every K/V sequence);
    neither -> dense ``[B, N, H, D]``. Other keywords (``causal``, ``scale``, ``window``,
    ``return_lse``, ``backend``, ...) go to the variant. ``variant="name"`` forces one.

    Under ``torch.compile(fullgraph=True)`` it traces when the process has looked up its
    variants once before (any eager call of it or of :func:`variants`): the compiled call uses
    that table, as the entry-point scan cannot be traced.
    """
    layout = _layout(q, call.get("q_offsets"), call.get("kv_offsets"))
    wanted = call.pop("variant", None)
    reasons: list[str] = []
    installed = _last_scan if torch.compiler.is_compiling() and _last_scan is not None else variants()
    candidates = sorted(installed.items(), key=lambda kv: -kv[1].priority)
    for name, var in candidates:
        if wanted is not None and name != wanted:
            continue
        if layout not in var.spec.layouts:
            continue
        rs = _cannot_run(var.spec, var.problem(q, k, v, **call), q.device, call.get("backend"))
        if not rs:
            return var.run(q, k, v, **_accepted(var.run, call))
        reasons.extend(f"{name}: {r}" for r in rs)
    reasons.extend(f"{name}: failed to load ({err})" for name, err in broken_variants().items())
    if not reasons:
        reasons.append(
            f"no installed variant takes the {layout} layout"
            + (f" under the name {wanted!r}" if wanted else "")
            + f" (installed: {sorted(n for n, _ in candidates) or 'none'})"
        )
    raise UnsupportedProblem("jagflash.attention", reasons)
