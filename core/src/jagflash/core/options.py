"""The keywords every attention call and every ``make_plan`` share: their types, defaults, docs and
the check of their names, in one place.

A variant's public function takes its own keywords explicitly and the shared ones as
``**options: Unpack[JaggedOptions]`` (PEP 692: type checkers and IDEs see every keyword with its
type); :func:`takes` gives the function the explicit signature ``inspect.signature``, ``help()``
and sphinx show (keyword-only parameters with their defaults, in the variant's order) and appends
the shared keywords' docs; the body's first line, :func:`resolve`, applies the defaults and
refuses unknown keywords with Python's own ``TypeError``.

Which set a function takes:

==========================  =====================================================================
:class:`MaskedOptions`      ``causal``, ``scale``, ``return_lse``, ``deterministic``, ``plan``,
                            ``backend`` (dense, block-sparse)
:class:`JaggedOptions`      those and ``max_seqlen_q``, ``max_seqlen_kv`` (jagged, sliding window)
:class:`BroadcastQOptions`  :class:`MaskedOptions` less ``causal``, with ``max_seqlen_kv``
:class:`MaskedPlanOptions`  ``causal``, ``schedule``, ``backward_schedule``, ``workers``,
                            ``backward``, ``backend`` (``make_plan``: dense, block-sparse)
:class:`JaggedPlanOptions`  those and ``max_seqlen_q``, ``max_seqlen_kv``
:class:`BroadcastQPlanOptions`  :class:`MaskedPlanOptions` less ``causal``, with ``max_seqlen_kv``
==========================  =====================================================================
"""

from __future__ import annotations

import inspect
import re
import sys
import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from jagflash.core.tuning import BACKEND_DEFAULT

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # Python 3.10: torch's own dependency brings it
    from typing_extensions import Unpack

if TYPE_CHECKING:
    from jagflash.core.plan.model import Plan

__all__ = [
    "BroadcastQOptions",
    "BroadcastQPlanOptions",
    "CallOptions",
    "JaggedOptions",
    "JaggedPlanOptions",
    "MaskedOptions",
    "MaskedPlanOptions",
    "PlanOptions",
    "Unpack",
    "resolve",
    "takes",
]


class CallOptions(TypedDict, total=False):
    """The keywords of every public attention function."""

    scale: float | None
    return_lse: bool
    deterministic: bool
    plan: Plan | None
    backend: str | None


class PlanOptions(TypedDict, total=False):
    """The keywords of every variant's ``make_plan``."""

    schedule: str
    backward_schedule: str | None
    workers: int | None
    backward: bool
    backend: str | None


class _Causal(TypedDict, total=False):
    causal: bool


class _KvLength(TypedDict, total=False):
    max_seqlen_kv: int | None


class _Lengths(_KvLength, total=False):
    max_seqlen_q: int | None


class MaskedOptions(CallOptions, _Causal, total=False):
    """:class:`CallOptions` and ``causal``."""


class JaggedOptions(CallOptions, _Causal, _Lengths, total=False):
    """:class:`MaskedOptions` and the jagged lengths' bounds."""


class BroadcastQOptions(CallOptions, _KvLength, total=False):
    """:class:`CallOptions` and the K/V lengths' bound (no mask: the queries belong to no sequence)."""


class MaskedPlanOptions(PlanOptions, _Causal, total=False):
    """:class:`PlanOptions` and ``causal``."""


class JaggedPlanOptions(PlanOptions, _Causal, _Lengths, total=False):
    """:class:`MaskedPlanOptions` and the jagged lengths' bounds."""


class BroadcastQPlanOptions(PlanOptions, _KvLength, total=False):
    """:class:`PlanOptions` and the K/V lengths' bound."""


#: Every shared keyword's default.
DEFAULTS: dict[str, Any] = {
    "causal": False,
    "scale": None,
    "max_seqlen_q": None,
    "max_seqlen_kv": None,
    "return_lse": False,
    "deterministic": False,
    "backend": None,
    "plan": None,
    "schedule": BACKEND_DEFAULT,
    "backward_schedule": BACKEND_DEFAULT,
    "workers": None,
    "backward": True,
}

#: The order the keywords stand in a signature unless a function gives its own (``takes(order=)``).
_ORDER = (
    "causal", "scale", "schedule", "backward_schedule", "workers", "max_seqlen_q", "max_seqlen_kv",
    "return_lse", "deterministic", "backward", "backend", "plan",
)

_CALLS = (CallOptions, MaskedOptions, JaggedOptions, BroadcastQOptions)
_PLANS = (PlanOptions, MaskedPlanOptions, JaggedPlanOptions, BroadcastQPlanOptions)

#: Each set's keywords (read by :func:`resolve` on every call: a plain dict, no class introspection).
KEYS: dict[type, tuple[str, ...]] = {t: tuple(t.__annotations__) for t in (*_CALLS, *_PLANS)}

#: The docs of the attention calls' shared keywords: an entry of several names is written once
#: for a function that takes them all.
CALL_DOCS: dict[tuple[str, ...], str] = {
    ("causal",): """bottom-right aligned: query ``i`` of a sequence with Lq queries and Lk keys
    sees keys ``j <= i + Lk - Lq``; a query that sees no key outputs 0 with LSE -inf and zero
    gradients (``docs/semantics.md``).""",
    ("scale",): "softmax scale, default ``1/sqrt(D)``.",
    ("max_seqlen_q", "max_seqlen_kv"): """upper bounds of the lengths. Given both, no call on a
    GPU synchronises with the host (the offsets are then checked on the device); without them one
    synchronisation reads them and validates the offsets.""",
    ("max_seqlen_kv",): """an upper bound of the K/V lengths. Given, no call on a GPU
    synchronises with the host (the offsets are then checked on the device); without it one
    synchronisation reads it and validates the offsets.""",
    ("return_lse",): "also return LSE, fp32, natural log, for merging partial attentions; it carries no gradient.",
    ("deterministic",): """make the backward bitwise repeatable. With ``False`` (the default) a
    backend may sum dQ in a varying order where that is faster: the TLX backward then runs one
    pass that adds dQ from every kv-tile (``jagflash.core.tuning.use_one_pass``); with ``True``
    it runs two passes without atomics, like the portable backward always does.""",
    ("plan",): """the load-balancing schedule of this batch (the variant's ``make_plan`` with the
    same mask), built once and passed to every call that shares its offsets and shapes; its
    backward reuses it. Without one the call builds its own. A plan built for other shapes,
    heads, mask, tile sizes or offsets is refused. The ``reference`` backend ignores it.""",
    ("backend",): """``"tlx-sm90"``, ``"portable"``, ``"interpreter"``, ``"reference"``, or
    ``None`` for the fastest that runs the problem (``JAGFLASH_BACKEND`` overrides ``None``);
    ``jagflash.core.backend.last_choice("{variant}")`` tells which ran and why.""",
}

#: The docs of ``make_plan``'s shared keywords.
PLAN_DOCS: dict[tuple[str, ...], str] = {
    ("causal",): "the mask of the calls the plan is for.",
    ("schedule",): """``"default"`` (the fastest measured for the backend the plan is for:
    ``jagflash.core.tuning.default_schedules``; ``"dynamic"`` for the TLX kernels,
    ``"grouped"`` for the portable ones), ``"grouped"`` (sequences sorted by cost, each one's
    tiles kept together for L2 locality, dealt zigzag to persistent workers), ``"static"``
    (tiles sorted by cost, dealt zigzag), ``"dynamic"`` (sorted, taken from an atomic counter),
    ``"dynamic-grouped"`` (grouped's order, taken from an atomic counter) or ``"none"`` (batch
    order, one program a tile: the baseline).""",
    ("backward_schedule",): """the backward passes' own kind (``"default"``: as for
    ``schedule``; the TLX one-pass backward's is ``"dynamic"``, or ``"dynamic-grouped"`` where
    ``jagflash.core.tuning.grouped_backward`` says so, else ``"none"``, batch order; ``None``:
    ``schedule``'s).""",
    ("workers",): "persistent programs per launch; default the GPU's SM count (4 on the CPU).",
    ("max_seqlen_q", "max_seqlen_kv"): "as for the calls (they only tighten the table's size).",
    ("max_seqlen_kv",): "as for the calls (it only tightens the table's size).",
    ("backward",): "lay out the backward passes too (``False`` for inference).",
    ("backend",): """the kernels the plan is for (their tile sizes): default the backend a call
    with these shapes and mask picks (``tlx-sm90`` on an H100/H200 with TLX for head dims 64
    and 128, else ``portable`` on a GPU, ``interpreter`` on the CPU).""",
}


def resolve(who: str, options: type, given: dict[str, Any]) -> dict[str, Any]:
    """The keywords ``given`` to ``who`` (a function taking ``**given: Unpack[options]``) with
    every one of ``options`` that was not given at its default (:data:`DEFAULTS`). An unknown
    keyword raises ``TypeError`` as Python does for a function without it
    (``who() got an unexpected keyword argument 'x'``), naming every unknown one."""
    keys = KEYS[options]
    unknown = [name for name in given if name not in keys]
    if unknown:
        if len(unknown) == 1:
            raise TypeError(f"{who}() got an unexpected keyword argument {unknown[0]!r}")
        raise TypeError(f"{who}() got unexpected keyword arguments {', '.join(repr(n) for n in unknown)}")
    return {name: given[name] if name in given else DEFAULTS[name] for name in keys}


F = TypeVar("F", bound=Callable[..., Any])

#: An argument's line in a docstring's ``Args:`` (``    name:`` or ``    name, other:``).
_ARG_LINE = re.compile(r"^    (\w+(?:, \w+)*):", re.MULTILINE)


def _annotation(options: type, name: str) -> object:
    hint = options.__annotations__[name]
    return getattr(hint, "__forward_arg__", hint)  # the source text, as the function's own annotations


def _docs(options: type, names: list[str], own: tuple[str, ...], variant: str) -> str:
    table = PLAN_DOCS if options in _PLANS else CALL_DOCS
    lines, done = [], set(own)
    for entry, text in table.items():
        if set(entry) <= set(names) and not set(entry) & done:
            done.update(entry)
            body = " ".join(text.replace("{variant}", variant).split())
            lines.append(textwrap.fill(f"{', '.join(entry)}: {body}", 96, initial_indent="    ", subsequent_indent="        "))
    return "\n".join(["Keyword Args:", *lines]) if lines else ""


def takes(options: type, *, order: str | None = None) -> Callable[[F], F]:
    """Decorates a function ``f(..., *, <own keywords>, **options: Unpack[options])``: sets its
    ``__signature__`` to the explicit one (the shared keywords as keyword-only parameters with
    their :data:`DEFAULTS` and annotations, where ``**options`` stood) and appends the docs of
    the shared keywords its docstring's ``Args:`` does not give itself (there their meaning is
    the function's own) under ``Keyword Args:``, from :data:`CALL_DOCS` / :data:`PLAN_DOCS`
    (``{variant}``: the name of the package ``jagflash.variants.<name>`` the function is in).
    ``order``: the keyword-only parameters' names (the function's own and the shared ones),
    space-separated, in the order the signature shows them; default the shared ones in
    ``_ORDER``'s order, then the function's own. Returns the function itself (nothing wraps it:
    calls and tracing see it as written)."""

    def apply(fn: F) -> F:
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        if not params or params[-1].kind is not inspect.Parameter.VAR_KEYWORD:
            raise TypeError(f"{fn.__qualname__} must end with **options: Unpack[{options.__name__}]")
        head = [p for p in params[:-1] if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        own = {p.name: p for p in params[:-1] if p.kind is inspect.Parameter.KEYWORD_ONLY}
        shared = {
            name: inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=DEFAULTS[name], annotation=_annotation(options, name)
            )
            for name in KEYS[options]
        }
        names = order.split() if order else [n for n in _ORDER if n in shared] + list(own)
        if sorted(names) != sorted([*own, *shared]):
            raise TypeError(f"{fn.__qualname__}: order {names} is not its keywords {[*own, *shared]}")
        fn.__signature__ = sig.replace(parameters=[*head, *({**own, **shared}[n] for n in names)])  # type: ignore[attr-defined]
        variant = fn.__module__.split(".")[2] if fn.__module__.startswith("jagflash.variants.") else fn.__module__
        doc = inspect.cleandoc(fn.__doc__ or "")
        documented = tuple(n for entry in _ARG_LINE.findall(doc) for n in entry.split(", "))
        docs = _docs(options, [n for n in names if n in shared], documented, variant)
        if docs:
            fn.__doc__ = f"{doc}\n\n{docs}\n"
        return fn

    return apply
