"""What every variant's ``torch.library`` op shares: the problem it poses, the autograd wiring,
and the dtype rule of the interpreter (input checks are ``jagflash.core.checks``').

A variant defines two custom ops with the same trailing arguments ("extras": offsets, lengths,
flags, scale, backend name)::

    fwd(q, k, v, *extras) -> (out, lse)
    bwd(dout, q, k, v, out, lse, *extras) -> (dq, dk, dv)

and calls :func:`register_autograd` once, which returns the caller the public function uses; the
forward then saves what the backward needs and the backward never recomputes anything the
forward knew.
"""

from __future__ import annotations

import functools
import importlib
import math
import numbers

import torch
from torch.autograd import forward_ad

from jagflash.core.capability import InvalidInput, Problem
from jagflash.core.checks import check_qkv, raise_if, readable
from jagflash.core.memo import capturing, plain_eager
from jagflash.core.tuning import BACKEND_DEFAULT, resolve_schedules

__all__ = [
    "OpCall",
    "alloc",
    "alloc_like",
    "attention_ops",
    "call_problem",
    "call_result",
    "default_scale",
    "for_kernel",
    "jagged_rows",
    "layout_plan",
    "make_problem",
    "op_tail",
    "plain_eager",
    "plan_maker",
    "poison_outputs",
    "register_autograd",
    "stepped_arange",
]


_poison = False


def poison_outputs(enabled: bool) -> bool:
    """Fill every buffer the kernels allocate with NaN (tests: an unwritten element then fails
    the comparison instead of passing on leftover memory). Returns the previous setting."""
    global _poison
    previous, _poison = _poison, bool(enabled)
    return previous


def alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output buffer for a kernel to fill (NaN-filled while :func:`poison_outputs` is on)."""
    if _poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def alloc_like(t: torch.Tensor) -> torch.Tensor:
    return alloc(tuple(t.shape), t.dtype, t.device)


def default_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale of a call: ``1/sqrt(head_dim)`` for ``None``; else ``scale``, which
    must be a finite real number (0 and negative scales are valid: uniform and reversed
    attention). Anything else raises :class:`InvalidInput`: a NaN or infinite scale would make
    every output NaN, silently."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise InvalidInput("attention", [f"scale must be a real number or None, got {type(scale).__name__}"])
    if not math.isfinite(scale):
        raise InvalidInput("attention", [f"scale must be finite, got {float(scale)}"])
    return float(scale)


def make_problem(
    layout: str,
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    causal: bool,
    window: tuple[int, int] = (-1, -1),
    return_lse: bool = False,
    backward: bool = False,
    deterministic: bool = False,
    features: frozenset[str] = frozenset(),
) -> Problem:
    """The :class:`Problem` a call poses, from shapes and flags only (no data is read);
    ``features``: those the variant's op always poses (``block_sparse``). Every call poses one
    or two: kept per (layout, device type, dtype, head dim, heads, flags), all it depends on
    (not while traced, where the sizes may be symbolic)."""
    if torch.compiler.is_compiling():
        return _make_problem(layout, q, k, causal, window, return_lse, backward, deterministic, features)
    key = (
        layout, q.device.type, q.dtype, q.shape[-1], q.shape[-2], k.shape[-2], bool(causal), tuple(window),
        bool(return_lse), bool(backward), bool(deterministic), features,
    )
    try:
        problem = _problems.get(key)
    except TypeError:  # an unhashable size (a symbolic int outside tracing): not kept
        return _make_problem(layout, q, k, causal, window, return_lse, backward, deterministic, features)
    if problem is None:
        if len(_problems) >= _PROBLEMS_KEEP:
            _problems.clear()
        problem = _problems[key] = _make_problem(
            layout, q, k, causal, window, return_lse, backward, deterministic, features
        )
    return problem


#: make_problem's problems by their key (a new shape every call: cleared rather than grown).
_problems: dict[tuple, Problem] = {}
_PROBLEMS_KEEP = 256


def _make_problem(layout, q, k, causal, window, return_lse, backward, deterministic, features) -> Problem:
    feats = set(features)
    if causal:
        feats.add("causal")
    if tuple(window) != (-1, -1):
        feats.add("window")
    if q.shape[-2] != k.shape[-2]:
        feats.add("gqa")
    if return_lse:
        feats.add("lse")
    if deterministic:
        feats.add("deterministic")
    return Problem(
        layout=layout,
        device_type=q.device.type,
        dtype=q.dtype,
        head_dim=int(q.shape[-1]),
        hq=int(q.shape[-2]),
        hkv=int(k.shape[-2]),
        features=frozenset(feats),
        backward=backward,
    )


def _mask_features(block_mask) -> frozenset[str]:
    """The features a call with ``block_mask`` (a BlockMask or None) poses (``block_sparse``
    alone for anything else: the variant refuses it with its own reason)."""
    from jagflash.core.block_mask import BlockMask, mask_features

    if block_mask is None:
        return frozenset()
    return mask_features(block_mask.block_size) if isinstance(block_mask, BlockMask) else frozenset({"block_sparse"})


def call_problem(layout: str):
    """``Variant.problem`` for a variant whose public function takes ``(q, k, v, **flags)``:
    describes a front-door call from its tensors and flags without reading data.
    ``deterministic`` is a property of the backward: a call that will not take one (no input
    requires grad) does not pose it, as the variants' forward ops do not. A ``block_mask``
    poses ``block_sparse`` and its block size (``jagflash.core.block_mask.mask_features``)."""

    def problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **call: object) -> Problem:
        grad = any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
        return make_problem(
            layout, q, k, causal=bool(call.get("causal", False)),
            window=call.get("window") or (-1, -1),  # type: ignore[arg-type]
            return_lse=bool(call.get("return_lse", False)), backward=grad,
            deterministic=grad and bool(call.get("deterministic", False)),
            features=_mask_features(call.get("block_mask")),
        )

    return problem


#: Row strides (elements) from which a view is copied before a portable kernel reads it:
#: 128 rows of it must stay below 2^31.
MAX_ROW_STRIDE = 1 << 24


def for_kernel(t: torch.Tensor, backend: str) -> torch.Tensor:
    """A tensor as the portable kernels take it: head dim contiguous, and under the interpreter
    bf16 upcast to fp32, because the interpreter computes bf16 wrongly (its ``tl.dot`` reads
    the raw bits). Results are cast back to the input dtype by the caller. A view whose rows are
    ``MAX_ROW_STRIDE`` or more elements apart is copied: the kernels form a tile's row offsets
    (up to 128 rows) in int32 (:func:`jagflash.core.seqlen.row_ptrs`)."""
    if t.stride(-1) != 1 or (t.dim() >= 3 and t.stride(-3) >= MAX_ROW_STRIDE):
        t = t.contiguous()
    if backend == "interpreter" and t.dtype == torch.bfloat16:
        t = t.float()
    return t


def _save(ctx, inputs, output) -> None:
    """What the backward needs: q, k, v, out, lse and the tensor extras (the rest kept as is)."""
    q, k, v, *extras = inputs
    out, lse = output
    pos, saved = [], [q, k, v, out, lse]
    for i, e in enumerate(extras):  # one pass: every forward with grad runs it
        if isinstance(e, torch.Tensor):
            pos.append(i)
            saved.append(e)
            extras[i] = None
    ctx.tensor_pos, ctx.extras = pos, extras
    ctx.save_for_backward(*saved)
    ctx.mark_non_differentiable(lse)


def _grads(ctx, bwd, dout) -> tuple:
    """The gradients of one of :func:`_save`'s contexts through ``bwd`` (the op or its body)."""
    q, k, v, out, lse, *tensors = ctx.saved_tensors
    extras = list(ctx.extras)
    if dout is None:  # not materialized (the eager path): no gradient reached the output
        return (None,) * (3 + len(extras))
    for i, t in zip(ctx.tensor_pos, tensors):
        extras[i] = t
    dq, dk, dv = bwd(dout.contiguous(), q, k, v, out, lse, *extras)
    return (dq, dk, dv, *([None] * len(extras)))


def stepped_arange(n: int, step: int, device: torch.device, dtype: torch.dtype, args: tuple = ()) -> torch.Tensor:
    """``arange(n) * step``. In plain eager mode (of the call's ``args``: :func:`plain_eager`)
    the last few are kept per (n, step, device, dtype) and returned again, so a call does not
    launch two kernels to remake them (nothing may write them); under modes and tracing they
    are made fresh, and so during a CUDA graph capture (a tensor made there holds its values
    only once the graph replays). The offsets of a batch of n - 1 sequences of ``step`` rows
    each (dense, broadcast-Q) and the like."""
    if plain_eager(args) and not capturing(device):
        return _stepped_arange(n, step, device, dtype)
    return torch.arange(n, device=device, dtype=dtype) * step


@functools.lru_cache(maxsize=16)
def _stepped_arange(n: int, step: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(n, device=device, dtype=dtype) * step


def _records_graph(q, k, v) -> bool:
    """Whether an ``autograd.Function`` applied to ``q, k, v`` records anything: grad mode on and
    one of them requiring grad, or a forward-mode AD level open (dual tensors: the Function then
    refuses them, which a call that skipped it would not)."""
    if forward_ad._current_level >= 0:
        return True
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def register_autograd(fwd_op, bwd_op):
    """Wire ``bwd_op`` as the gradient of ``fwd_op`` (signatures in the module docstring) and
    return the variant's caller, ``call(q, k, v, *extras) -> (out, lse)``.

    Saves q, k, v, out, lse and the tensor extras; the LSE output carries no gradient.

    The caller runs the custom op wherever torch needs to see it (torch.compile, modes,
    functorch, tensor subclasses: :func:`plain_eager`); in plain eager mode it runs the op's own
    Python body, forward and backward, through a plain ``torch.autograd.Function``
    (``<op>_eager``): the same code without the dispatcher's round trip and torch.compile's
    ``disable`` wrapper, which cost ~100 us a call on the CPU (bench/NOTES.md, session 6), as
    much as a small batch's kernels. A plain eager call that autograd would not record (grad
    mode off, or no input requiring grad, and no forward-mode AD level open:
    :func:`_records_graph`) runs the body alone: ``apply`` would return its outputs unchanged,
    without a graph node, after ~15-20 us of binding and saving."""
    fwd_op.register_autograd(lambda ctx, dout, _dlse: _grads(ctx, bwd_op, dout), setup_context=_save)
    fwd_body, bwd_body = getattr(fwd_op, "_init_fn", None), getattr(bwd_op, "_init_fn", None)
    if fwd_body is None or bwd_body is None:  # a torch without the op's own function: no shortcut
        return fwd_op

    # forward(ctx, ...) rather than a separate setup_context: with one, every apply binds its
    # arguments through inspect.signature (tens of us a call)
    def forward(ctx, *inputs):
        output = fwd_body(*inputs)
        _save(ctx, inputs, output)
        # The LSE carries no gradient: no zero-filled [Hq, Tq] for it every backward.
        ctx.set_materialize_grads(False)
        return output

    def backward(ctx, dout, _dlse):
        return _grads(ctx, bwd_body, dout)

    eager = type(
        f"{getattr(fwd_op, '_name', 'op')}_eager", (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )

    def call(q, k, v, *extras):
        if plain_eager((q, k, v, *extras)):
            if _records_graph(q, k, v):
                return eager.apply(q, k, v, *extras)
            return fwd_body(q, k, v, *extras)
        return fwd_op(q, k, v, *extras)

    return call


def call_plan_layout(
    spec, layout: str, q: torch.Tensor, k: torch.Tensor, *, causal: bool, backend: str | None,
    schedule: str = BACKEND_DEFAULT, backward_schedule: str | None = BACKEND_DEFAULT,
    equal_costs: bool = False, window: tuple[int, int] = (-1, -1), block_mask=None,
    planned: str | None = None, batch: int | None = None,
) -> tuple[dict[str, tuple[int, int]], str, str | None]:
    """Tile sizes and schedules ``(blocks, schedule, backward_schedule)`` of the Plan a call (or
    ``make_plan``) lays out: for the backend the call's forward will run on
    (``jagflash.core.backend.plan_backend``; the reference backend takes no plan, so a call
    headed there gets the portable kernels'), ``"default"`` schedules resolved for it
    (``jagflash.core.tuning.default_schedules``; ``equal_costs``: see there). ``window``:
    ``(left, right)`` as the call passes it (causal clips ``right``). ``planned``: that backend,
    where the caller has already asked ``plan_backend`` the same question. ``batch``: the
    sequences (default: a dense layout's ``q.shape[0]``, else unknown), for
    ``jagflash.core.tuning.grouped_backward`` with ``k``'s rows and heads."""
    from jagflash.core.backend import plan_backend
    from jagflash.core.mask import mask_bounds
    from jagflash.core.tile_scheduler import default_workers
    from jagflash.core.tuning import grouped_backward, plan_blocks

    name = planned
    if name is None:
        feats = _mask_features(block_mask)
        name = plan_backend(spec, make_problem(layout, q, k, causal=causal, window=window, features=feats), q.device, backend)
    if name == "reference":
        name = "interpreter" if q.device.type == "cpu" else "portable"
    dim = q.shape[-1]
    blocks = plan_blocks(name, dim, block_mask.block_size if block_mask is not None else None)
    batch = q.shape[0] if batch is None and layout == "dense" else batch
    grouped = batch is not None and grouped_backward(
        math.prod(k.shape[:-2]), batch, k.shape[-2], blocks["dkdv"][1], default_workers(q.device)
    )
    fwd, bwd = resolve_schedules(
        schedule, backward_schedule, name, dim, window=mask_bounds(causal, window), equal_costs=equal_costs,
        grouped=grouped,
    )
    return blocks, fwd, bwd


def layout_plan(
    spec, layout: str, q: torch.Tensor, k: torch.Tensor, q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor, *, total_q: int, causal: bool, backend: str | None, schedule: str,
    backward_schedule: str | None, workers: int | None, max_seqlen_q: int | None,
    max_seqlen_kv: int | None, backward: bool, window: tuple[int, int] = (-1, -1), block_mask=None,
):
    """A variant's ``make_plan`` over a jagged batch of rows: the tile sizes and schedules of
    :func:`call_plan_layout`, then ``jagflash.core.plan.build.make_plan`` on ``q_offsets`` /
    ``kv_offsets`` (the offsets of the rows the kernels walk: the output rows for broadcast-Q)
    with ``total_q`` query rows; ``k`` ``[Tk, Hkv, D]`` gives the kv rows, the heads from ``q``'s
    and ``k``'s dim -2; ``causal`` and ``window`` the mask (and a ``block_mask``: its blocks
    tile every pass and cost the tiles). Returns the :class:`~jagflash.core.plan.model.Plan`."""
    from jagflash.core.plan.build import make_plan

    blocks, schedule, backward_schedule = call_plan_layout(
        spec, layout, q, k, causal=causal, backend=backend, schedule=schedule,
        backward_schedule=backward_schedule, window=window, block_mask=block_mask, batch=q_offsets.numel() - 1,
    )
    return make_plan(
        q_offsets, kv_offsets, total_q=total_q, total_kv=k.shape[0], heads_q=q.shape[-2],
        heads_kv=k.shape[-2], causal=causal, window=window, block_m=blocks["fwd"][0], block_n=blocks["fwd"][1],
        dq_blocks=blocks["dq"], dkdv_blocks=blocks["dkdv"], max_seqlen_q=max_seqlen_q,
        max_seqlen_kv=max_seqlen_kv, workers=workers, schedule=schedule,
        backward_schedule=backward_schedule, backward=backward, block_mask=block_mask,
    )


def jagged_rows(q, k, q_offsets, kv_offsets, o: dict) -> tuple[list[str], dict]:
    """:func:`plan_maker`'s ``rows`` for a jagged batch ``[T, H, D]`` with its offsets: the
    structural problems of q, k and :func:`layout_plan`'s rows (every sequence's queries)."""
    reasons = check_qkv(q, k, k, rank=3, layout_doc="[T, H, D]")
    return reasons, {"q": q, "k": k, "q_offsets": q_offsets, "kv_offsets": kv_offsets, "total_q": q.shape[0]}


def plan_maker(spec, *, layout: str, who: str, options: type, rows=jagged_rows):
    """The body of a variant's ``make_plan`` over rows the kernels walk as a jagged batch:
    ``make(q, k, q_offsets, kv_offsets, given, **own) -> Plan``, ``given`` the call's shared
    keywords (``options``: a ``jagflash.core.options`` set, resolved with its defaults, unknown
    ones refused), ``own`` the variant's own (its mask). ``rows(q, k, q_offsets, kv_offsets, o,
    **own)`` (``o``: the resolved keywords) returns ``(reasons, lay)``: every problem of the
    inputs (raised together as :class:`InvalidInput` of ``who``) and :func:`layout_plan`'s
    ``q, k, q_offsets, kv_offsets, total_q`` and whatever it sets beside ``o`` (``window``,
    ``block_mask``, lengths the variant knows); :func:`jagged_rows` by default."""
    from jagflash.core.options import resolve

    def make(q, k, q_offsets, kv_offsets, given: dict, **own):
        o = resolve("make_plan", options, given)
        reasons, lay = rows(q, k, q_offsets, kv_offsets, o, **own)
        raise_if(who, reasons)
        return layout_plan(spec, layout, **{**o, **lay})

    return make


# --- the op factory ------------------------------------------------------------------------

#: The arguments every variant's ops end with, after the variant's own.
_TAIL = (
    "float scale, bool return_lse, bool deterministic, str backend, Tensor? plan_tiles=None, "
    "Tensor? plan_meta=None, SymInt[]? plan_info=None"
)


def op_tail(o: dict, q: torch.Tensor) -> tuple[float, bool, bool, str]:
    """``scale, return_lse, deterministic, backend`` of :data:`_TAIL` from a public call's
    resolved keywords (``jagflash.core.options.resolve``): the scale checked and defaulted for
    q's head dim (:func:`default_scale`), the flags as bools, ``""`` for no backend."""
    return default_scale(o["scale"], q.shape[-1]), bool(o["return_lse"]), bool(o["deterministic"]), o["backend"] or ""


def call_result(out: torch.Tensor, lse: torch.Tensor, o: dict):
    """What a public call returns: ``(out, lse)`` where it asked for the LSE, else ``out``."""
    return (out, lse) if o["return_lse"] else out


_FWD_HEAD, _BWD_HEAD = ("q", "k", "v"), ("dout", "q", "k", "v", "out", "lse")


#: The kernel modules :attr:`OpCall.kernels` imported, by name (an import per call costs more
#: than this lookup).
_kernel_modules: dict[str, object] = {}


class OpCall:
    """One run of a variant's op body: its arguments by schema name (``q``, ``k``, ``v``, the
    variant's own, ``scale`` … ``plan_info``; the backward's also ``dout``, ``out``, ``lse``),
    ``causal`` (False where the op has none), ``ran`` (the backend chosen: ``reference``,
    ``tlx-sm90``, ``portable`` or ``interpreter``), the mask bounds ``left``/``right`` (the
    op's own ``int left, int right`` where it has them, -1 where not; causal clips ``right``:
    ``jagflash.core.mask.mask_bounds``), and whatever the variant's ``check`` set on it."""

    def __init__(self, names: tuple[str, ...], defaults: int, args: tuple, kwargs: dict) -> None:
        values = dict(zip(names, args))
        values.update(kwargs)
        for name in names[len(names) - defaults :]:
            values.setdefault(name, None)
        values.setdefault("causal", False)
        values.setdefault("left", -1)
        values.setdefault("right", -1)
        self.__dict__.update(values)

    @property
    def kernels(self):
        """The variant's kernel module for the backend that runs: ``<package>.kernels_tlx_sm90``
        for ``tlx-sm90``, else ``<package>.kernels_portable`` (imported on first use)."""
        name = f"{self.package}.{'kernels_tlx_sm90' if self.ran == 'tlx-sm90' else 'kernels_portable'}"
        module = _kernel_modules.get(name)
        if module is None:
            module = _kernel_modules[name] = importlib.import_module(name)
        return module

    @property
    def mask(self) -> dict[str, object]:
        """``left``, ``right`` and ``scale``: the keywords every kernel wrapper takes."""
        return {"left": self.left, "right": self.right, "scale": self.scale}

    def plan(self, who: str, passes: tuple[str, ...], block_mask=None, **layout: object):
        """The Plan the call passed, checked against it, or one built for ``passes``
        (``jagflash.core.plan.check.resolve_plan``) with the tile sizes of the backend that runs
        (a ``block_mask``'s blocks where given); ``layout``: the offsets and sizes the plan is
        checked against."""
        from jagflash.core.plan.check import resolve_plan
        from jagflash.core.tuning import plan_blocks

        size = block_mask.block_size if block_mask is not None else None
        extra = {"block_mask": block_mask} if block_mask is not None else {}
        return resolve_plan(
            who, self.plan_tiles, self.plan_meta, self.plan_info, heads_q=self.q.shape[-2],
            heads_kv=self.k.shape[-2], left=self.left, right=self.right,
            blocks=plan_blocks(self.ran, self.q.shape[-1], size), passes=passes, **layout, **extra,
        )


def _arg_names(schema: str) -> tuple[str, ...]:
    return tuple(a.split("=")[0].split()[-1] for a in schema.split(", ") if a)


def attention_ops(
    name: str, spec, package: str, args: str, *, check, forward, backward, fake_forward, fake_backward,
    layout: str | None = None, features: frozenset[str] = frozenset(), tail: str = "",
):
    """Register a variant's ops ``jagflash::<name>_fwd`` / ``<name>_bwd`` and their autograd
    (:func:`register_autograd`) from its semantics; returns ``(fwd_op, bwd_op, call_fwd)``.

    ``package``: the variant's package (its kernel modules: :attr:`OpCall.kernels`).
    ``args``: the schema of the variant's own arguments (``"Tensor kv_offsets, SymInt n"``),
    which stand after q, k, v (backward: dout, q, k, v, out, lse) and before the shared tail
    ``scale, return_lse, deterministic, backend, plan_tiles, plan_meta, plan_info``.

    Each body makes an :class:`OpCall` ``c``, runs ``check(c)`` (the input errors that need
    values, raised whatever backend would run), poses the :class:`Problem` (``layout``, default
    ``name``; with the window of ``int left, int right`` where ``args`` has them),
    selects the backend (``jagflash.core.backend.select`` with ``spec``) and returns
    ``forward[backend](c)`` / ``backward[backend](c)``: tables over ``reference``,
    ``tlx-sm90`` and ``portable`` (which also serves ``interpreter``).
    ``fake_forward(c)`` / ``fake_backward(c)``: the outputs' shapes for the fake (meta) kernels.
    ``features``: problem features every call of these ops poses, or a function of the
    :class:`OpCall` giving them (a block-sparse op's: its mask's, after ``check``).
    ``tail``: the schema of arguments with defaults after the shared tail (``"bool? decode=None"``),
    which a caller may leave out (then ``None`` on the :class:`OpCall`).
    """
    from jagflash.core.backend import select
    from jagflash.core.mask import mask_bounds

    layout = layout or name
    tail_schema = _TAIL + (f", {tail}" if tail else "")
    schema_fwd = f"({', '.join(f'Tensor {n}' for n in _FWD_HEAD)}, {args}, {tail_schema}) -> (Tensor, Tensor)"
    schema_bwd = f"({', '.join(f'Tensor {n}' for n in _BWD_HEAD)}, {args}, {tail_schema}) -> (Tensor, Tensor, Tensor)"
    own = _arg_names(args) + _arg_names(tail_schema)
    defaults = 3 + len(_arg_names(tail))
    names = {"fwd": _FWD_HEAD + own, "bwd": _BWD_HEAD + own}

    def body(pass_: str, table):
        def run(*args, **kwargs):
            c = OpCall(names[pass_], defaults, args, kwargs)
            c.package = package
            check(c)
            c.q, c.k, c.v = (readable(t) for t in (c.q, c.k, c.v))
            window = (c.left, c.right)
            feats = features(c) if callable(features) else features
            if pass_ == "fwd":
                problem = make_problem(
                    layout, c.q, c.k, causal=c.causal, window=window, return_lse=c.return_lse, features=feats
                )
            else:
                problem = make_problem(
                    layout, c.q, c.k, causal=c.causal, window=window, backward=True, deterministic=c.deterministic,
                    features=feats,
                )
            c.ran = select(spec, problem, c.q.device, c.backend or None).name
            c.left, c.right = mask_bounds(c.causal, window)
            return table["portable" if c.ran == "interpreter" else c.ran](c)

        return run

    def fake(pass_: str, shapes):
        return lambda *args, **kwargs: shapes(OpCall(names[pass_], defaults, args, kwargs))

    fwd_op = torch.library.custom_op(f"jagflash::{name}_fwd", body("fwd", forward), mutates_args=(), schema=schema_fwd)
    bwd_op = torch.library.custom_op(f"jagflash::{name}_bwd", body("bwd", backward), mutates_args=(), schema=schema_bwd)
    fwd_op.register_fake(fake("fwd", fake_forward))
    bwd_op.register_fake(fake("bwd", fake_backward))
    return fwd_op, bwd_op, register_autograd(fwd_op, bwd_op)
