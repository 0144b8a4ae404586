"""Everything the benchmark times: jagflash's own backends and the peers a user would pick today.

A provider names the workload kinds it runs, whether it needs the host's own Triton (anything
that goes through ``torch.compile`` or that the TLX Triton in front of it would break: those run
in a worker process whose PYTHONPATH drops the TLX bundle), a check of what it can run here, and
``prepare(workload, batch, grad)``: the work done *outside* the timing (layout copies, block
masks, NJT views) returning a :class:`Prepared` whose ``fwd()`` is what gets timed. Every
provider is checked against the float32 reference on input set 0 before it is timed; a wrong one
gets no number.

Adding a peer: write ``_prepare_x(w, batch, grad) -> Prepared``, an ``available`` function that
returns why it cannot run here (or None), and append a :class:`Provider` to :data:`PROVIDERS`.
A provider that raises ``NotImplementedError`` (jagflash's ``UnsupportedProblem`` is one) gets an
"unsupported" row with the message; any other exception a "failed" row.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
import importlib.util
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from jagflash.bench.data import Batch
from jagflash.bench.flops import mask_bounds
from jagflash.bench.workloads import Workload

__all__ = ["PROVIDERS", "Prepared", "Provider", "get", "select"]


def _leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    """A fresh autograd leaf sharing ``t``'s storage (no copy), so providers never share .grad."""
    return t.detach().requires_grad_(grad)


def _identity(x: Any) -> Any:
    return x


@dataclass
class Prepared:
    """One provider on one input set, ready to time.

    ``fwd()`` is timed; ``out_canon(out)`` maps its result to the canonical layout (not timed);
    ``leaves`` are the tensors gradients are taken for (provider layout) and ``grads_canon``
    maps their gradients to canonical dQ, dK, dV; ``dout`` is the gradient of ``fwd()``'s
    result in the provider's layout.
    """

    fwd: Callable[[], torch.Tensor]
    leaves: tuple[torch.Tensor, ...]
    dout: torch.Tensor
    out_canon: Callable[[torch.Tensor], torch.Tensor] = _identity
    grads_canon: Callable[[tuple], tuple] = _identity
    note: Callable[[], str] = lambda: ""
    # Block-sparse workloads: building the provider's mask from the pattern's mask_mod, timed
    # as a row of its own ("build"); build_check(result) says why a build is wrong (None: right).
    build: Callable[[], Any] | None = None
    build_check: Callable[[Any], str | None] = lambda built: None
    build_note: str = ""


@dataclass(frozen=True)
class Provider:
    name: str
    kinds: frozenset[str]
    prepare: Callable[[Workload, Batch, bool], Prepared]
    description: str = ""
    devices: frozenset[str] = frozenset({"cuda"})
    # Reason this provider cannot run in this process at all (None: it can).
    available: Callable[[torch.device], str | None] = lambda device: None
    # Reason it cannot run this workload (checked before any tensor is built).
    supports: Callable[[Workload], str | None] = lambda w: None
    # Reason it has no backward on this device (None: it has one).
    no_backward: Callable[[torch.device], str | None] = lambda device: None
    needs_host_triton: bool = False
    # Part of the default set on these devices (None: every device it runs on).
    default_on: frozenset[str] | None = None
    # On a GPU run without an explicit --providers, only these workloads (globs); None: all.
    default_workloads: tuple[str, ...] | None = None
    # Runs block-sparse workloads (``Workload.blocks``) with their mask; the others get an
    # "unsupported" row there.
    block_sparse: bool = False
    # On those workloads it also times building its mask (a "build" row).
    mask_build: bool = False

    def runs_on(self, device_type: str) -> bool:
        return device_type in self.devices

    def is_default(self, device_type: str) -> bool:
        """In the default set on ``device_type``; a provider that cannot run there still is
        (its row says why), unless ``default_on`` leaves that device out."""
        return self.default_on is None or device_type in self.default_on

    def default_for(self, workload_name: str) -> bool:
        if self.default_workloads is None:
            return True
        return any(fnmatch.fnmatchcase(workload_name, p) for p in self.default_workloads)


# --------------------------------------------------------------------------------- helpers


def _cuda_reason(device: torch.device, min_cc: tuple[int, int] | None = None) -> str | None:
    if device.type != "cuda":
        return "needs a CUDA GPU"
    if min_cc is not None:
        cc = torch.cuda.get_device_capability(device)
        if cc < min_cc:
            return f"needs compute capability >= {min_cc[0]}.{min_cc[1]}, have {cc[0]}.{cc[1]}"
    return None


def _import_reason(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as e:  # the reason is the point
        return f"{module} not importable ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"
    return None


def _kwargs_for(fn: Callable, **kwargs: Any) -> dict[str, Any]:
    """``kwargs`` restricted to the parameters ``fn`` has (peers' signatures move between
    releases); a function taking ``**kwargs`` gets them all."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def _first(x: Any) -> torch.Tensor:
    return x[0] if isinstance(x, (tuple, list)) else x


def _dense_views(batch: Batch, q, k, v):
    b, n = batch.dense_shape()
    w = batch.workload
    return (
        q.view(b, n, w.heads, w.head_dim),
        k.view(b, n, w.hkv, w.head_dim),
        v.view(b, n, w.hkv, w.head_dim),
    )


def _expand_q(q: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``[Lq, H, D]`` -> ``[B*Lq, H, D]``: the query block repeated once per K/V sequence."""
    return q.unsqueeze(0).expand(batch.num_seqs, *q.shape).reshape(-1, *q.shape[1:])


def _bq_out(out: torch.Tensor, batch: Batch) -> torch.Tensor:
    w = batch.workload
    return out.reshape(batch.num_seqs, w.q_len, w.heads, w.head_dim)


def _no_window(w: Workload) -> str | None:
    return "sliding window not wired for this provider" if w.has_window else None


def _jagflash_supports(w: Workload) -> str | None:
    if w.has_window and w.kind == "broadcast_q":
        return "no jagflash variant takes a window with broadcast-Q"
    return None


# ------------------------------------------------------------------------------ jagflash


def _jagflash_available(device: torch.device) -> str | None:
    return _import_reason("jagflash.variants.jagged")


def _jagflash_choice_note(variant: str, backend: str) -> Callable[[], str]:
    def note() -> str:
        try:
            from jagflash.core.backend import last_choice

            c = last_choice(variant)
        except Exception:
            return ""
        if c is None:
            return ""
        return (
            f"ran {variant}/{c.name}"
            if c.name == backend
            else f"ran {variant}/{c.name} (asked {backend})"
        )

    return note


def _plan_once(make_plan: Callable | None, backend: str, grad: bool, *args: Any, **kw: Any) -> dict[str, Any]:
    """``plan=`` for a jagflash call: the variant's tile schedule, built once here, outside the
    timing, as a model builds it once per batch for all its layers (and as FlexAttention's
    block mask is built outside the timing). Nothing for the reference backend or a variant
    without ``make_plan``."""
    if make_plan is None or backend == "reference":
        return {}
    return {"plan": make_plan(*args, **_kwargs_for(make_plan, backend=backend, backward=grad, **kw))}


def _jagflash_prepare(backend: str) -> Callable[[Workload, Batch, bool], Prepared]:
    def prepare(w: Workload, batch: Batch, grad: bool) -> Prepared:
        q, k, v = (_leaf(t, grad) for t in (batch.q, batch.k, batch.v))
        if w.kind == "broadcast_q":
            try:
                mod = importlib.import_module("jagflash.variants.broadcast_q")
            except ImportError as e:
                raise _Unavailable(f"jagflash-broadcast_q is not installed ({e})") from None
            fn = mod.broadcast_q_attention
            kw = _kwargs_for(fn, causal=w.causal, max_seqlen_kv=batch.max_kv, backend=backend)
            if w.causal and "causal" not in kw:
                raise NotImplementedError("broadcast_q_attention takes no causal mask")
            ko = batch.kv_offsets
            if "plan" in inspect.signature(fn).parameters:
                kw.update(_plan_once(getattr(mod, "make_plan", None), backend, grad, q, k, ko, max_seqlen_kv=batch.max_kv))
            return Prepared(
                fwd=lambda: _first(fn(q, k, v, ko, **kw)),
                leaves=(q, k, v),
                dout=batch.dout,
                note=_jagflash_choice_note("broadcast_q", backend),
            )
        if w.blocks is not None:
            return _block_sparse_prepare(w, batch, grad, backend, q, k, v)
        if w.has_window:
            return _sliding_window_prepare(w, batch, grad, backend, q, k, v)
        if w.kind == "dense":
            try:
                from jagflash.variants.dense import dense_attention
                from jagflash.variants.dense import make_plan as dense_plan
            except ImportError:
                dense_attention = None
            if dense_attention is not None:
                q4, k4, v4 = _dense_views(batch, q, k, v)
                b, n = batch.dense_shape()
                dkw = _plan_once(dense_plan, backend, grad, q4, k4, causal=w.causal)
                return Prepared(
                    fwd=lambda: dense_attention(q4, k4, v4, causal=w.causal, backend=backend, **dkw),
                    leaves=(q, k, v),
                    dout=batch.dout.view(b, n, w.heads, w.head_dim),
                    out_canon=lambda o: o.reshape(batch.out_shape()),
                    note=_jagflash_choice_note("dense", backend),
                )
        from jagflash.variants.jagged import jagged_attention
        from jagflash.variants.jagged import make_plan as jagged_plan

        qo, ko, mq, mk = batch.q_offsets, batch.kv_offsets, batch.max_q, batch.max_kv
        via = " via jagged (jagflash-dense not installed)" if w.kind == "dense" else ""
        choice = _jagflash_choice_note("jagged", backend)
        jkw = _plan_once(jagged_plan, backend, grad, q, k, qo, ko, causal=w.causal, max_seqlen_q=mq, max_seqlen_kv=mk)
        return Prepared(
            fwd=lambda: jagged_attention(
                q, k, v, qo, ko, causal=w.causal, max_seqlen_q=mq, max_seqlen_kv=mk, backend=backend, **jkw
            ),
            leaves=(q, k, v),
            dout=batch.dout,
            note=lambda: choice() + via,
        )

    return prepare


def _sliding_window_prepare(w: Workload, batch: Batch, grad: bool, backend: str, q, k, v) -> Prepared:
    """A windowed workload on the sliding-window variant: dense ``[B, N, H, D]`` views for a
    dense workload, the jagged rows and offsets otherwise; its plan built once, outside the
    timing, for the window."""
    try:
        mod = importlib.import_module("jagflash.variants.sliding_window")
    except ImportError as e:
        raise _Unavailable(f"jagflash-sliding-window is not installed ({e})") from None
    fn = mod.sliding_window_attention
    mask = dict(window=tuple(w.window), causal=w.causal)
    if w.kind == "dense":
        q4, k4, v4 = _dense_views(batch, q, k, v)
        b, n = batch.dense_shape()
        kw = _plan_once(mod.make_plan, backend, grad, q4, k4, **mask)
        return Prepared(
            fwd=lambda: fn(q4, k4, v4, **mask, backend=backend, **kw),
            leaves=(q, k, v),
            dout=batch.dout.view(b, n, w.heads, w.head_dim),
            out_canon=lambda o: o.reshape(batch.out_shape()),
            note=_jagflash_choice_note("sliding_window", backend),
        )
    qo, ko, mq, mk = batch.q_offsets, batch.kv_offsets, batch.max_q, batch.max_kv
    kw = _plan_once(mod.make_plan, backend, grad, q, k, qo, ko, **mask, max_seqlen_q=mq, max_seqlen_kv=mk)
    return Prepared(
        fwd=lambda: fn(q, k, v, qo, ko, **mask, max_seqlen_q=mq, max_seqlen_kv=mk, backend=backend, **kw),
        leaves=(q, k, v),
        dout=batch.dout,
        note=_jagflash_choice_note("sliding_window", backend),
    )


def _block_sparse_prepare(w: Workload, batch: Batch, grad: bool, backend: str, q, k, v) -> Prepared:
    """A block-sparse workload on the block-sparse variant (jagged rows and offsets, dense
    batches too), its plan built once outside the timing for the batch's mask; the ``build``
    row times ``BlockMask.from_mask_mod`` of the pattern's mask_mod on the device, checked to
    list exactly the workload's blocks."""
    try:
        mod = importlib.import_module("jagflash.variants.block_sparse")
    except ImportError as e:
        raise _Unavailable(f"jagflash-block-sparse is not installed ({e})") from None
    from jagflash.bench.sparsity import mask_mod, mask_mod_reads_b

    fn, m = mod.block_sparse_attention, batch.block_mask
    qo, ko, mq, mk = batch.q_offsets, batch.kv_offsets, batch.max_q, batch.max_kv
    mask = dict(causal=w.causal, window=tuple(w.window) if w.has_window else None)
    kw = _plan_once(mod.make_plan, backend, grad, q, k, qo, ko, m, **mask)
    rule, want, per_sequence = mask_mod(w.blocks, m), m.to_dense(), mask_mod_reads_b(w.blocks)

    def build():
        return mod.BlockMask.from_mask_mod(
            rule, qo, ko, 1, m.block_size, max_seqlen_q=mq, max_seqlen_kv=mk, total_q=batch.total_q, total_kv=batch.total_kv,
            per_sequence=per_sequence,
        )

    def check(built) -> str | None:
        got = built.to_dense()
        if got.shape != want.shape or not torch.equal(got, want):
            return "BlockMask.from_mask_mod listed other blocks than the workload's mask"
        return None

    return Prepared(
        fwd=lambda: fn(q, k, v, qo, ko, m, **mask, backend=backend, **kw),
        leaves=(q, k, v),
        dout=batch.dout,
        note=_jagflash_choice_note("block_sparse", backend),
        build=build,
        build_check=check,
        build_note=(
            f"BlockMask.from_mask_mod on the device ({w.blocks.kind} mask_mod"
            f"{'' if per_sequence else ', per_sequence=False: b not read'}, max lengths and totals given: no sync)"
        ),
    )


class _Unavailable(RuntimeError):
    """Raised from prepare when a provider turns out to be missing for this workload kind."""


# --------------------------------------------------------------------------- torch SDPA


def _sdpa_available(device: torch.device) -> str | None:
    return _cuda_reason(device) or _import_reason("torch.nn.attention")


def _bhnd(t: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Canonical ``[B*N, H, D]`` -> contiguous ``[B, H, N, D]`` (a copy, made outside timing)."""
    b, n = batch.dense_shape()
    return t.detach().view(b, n, t.shape[-2], t.shape[-1]).transpose(1, 2).contiguous()


def _from_bhnd(t: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, D]`` -> canonical ``[B*N, H, D]``."""
    return t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])


def _sdpa_prepare(backend_name: str) -> Callable[[Workload, Batch, bool], Prepared]:
    def prepare(w: Workload, batch: Batch, grad: bool) -> Prepared:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        be = getattr(SDPBackend, backend_name)
        # SDPA's own layout, [B, H, N, D] contiguous, as its users (and its benchmarks) hold it.
        q, k, v = (_bhnd(t, batch).requires_grad_(grad) for t in (batch.q, batch.k, batch.v))
        kw = {"enable_gqa": True} if w.gqa else {}
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def fwd() -> torch.Tensor:
            with sdpa_kernel([be]):
                return sdpa(q, k, v, is_causal=w.causal, **kw)

        return Prepared(
            fwd=fwd,
            leaves=(q, k, v),
            dout=_bhnd(batch.dout, batch),
            out_canon=_from_bhnd,
            grads_canon=lambda g: tuple(None if x is None else _from_bhnd(x) for x in g),
        )

    return prepare


def _sdpa_nested_prepare(w: Workload, batch: Batch, grad: bool) -> Prepared:
    q, k, v = (_leaf(t, grad) for t in (batch.q, batch.k, batch.v))
    nt = torch.nested.nested_tensor_from_jagged
    qo, ko = batch.q_offsets64, batch.kv_offsets64
    lq = dict(min_seqlen=min(batch.q_lens, default=0), max_seqlen=batch.max_q)
    lk = dict(min_seqlen=min(batch.kv_lens, default=0), max_seqlen=batch.max_kv)
    # Views of the leaves built once, outside the timing (a user holds NJTs already).
    qn = nt(q, qo, **lq).transpose(1, 2)
    kn = nt(k, ko, **lk).transpose(1, 2)
    vn = nt(v, ko, **lk).transpose(1, 2)
    kw = {"enable_gqa": True} if w.gqa else {}

    def fwd() -> torch.Tensor:
        try:
            o = torch.nn.functional.scaled_dot_product_attention(
                qn, kn, vn, is_causal=w.causal, **kw
            )
        except RuntimeError as e:
            if "No viable backend" in str(e):  # torch's own refusal (causal, GQA, device, ...)
                raise NotImplementedError(
                    "torch SDPA has no nested-tensor backend for this problem"
                    + (" (causal)" if w.causal else "")
                    + (" (GQA)" if w.gqa else "")
                ) from None
            raise
        return o.transpose(1, 2).values()

    return Prepared(fwd=fwd, leaves=(q, k, v), dout=batch.dout)


# --------------------------------------------------------------------------- varlen_attn


def _varlen_fn():
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn


def _varlen_available(device: torch.device) -> str | None:
    r = _cuda_reason(device)
    if r:
        return r
    try:
        _varlen_fn()
    except Exception as e:
        return f"torch.nn.attention.varlen.varlen_attn not importable ({type(e).__name__}: {e})"
    return None


def _varlen_kwargs(w: Workload) -> dict[str, Any]:
    fn = _varlen_fn()
    params = inspect.signature(fn).parameters
    kw: dict[str, Any] = {}
    if w.causal or w.has_window:
        if "window_size" in params:
            kw["window_size"] = mask_bounds(w.causal, w.window)
        elif "is_causal" in params and not w.has_window:
            kw["is_causal"] = True
        else:
            raise NotImplementedError(
                "this torch's varlen_attn takes neither window_size nor is_causal"
            )
    if w.gqa and "enable_gqa" in params:
        kw["enable_gqa"] = True
    return kw


def _varlen_supports(w: Workload) -> str | None:
    if w.kind == "dense" and not w.has_window:
        return "dense rows without a window are SDPA's (varlen_attn runs the windowed dense rows)"
    return None


def _varlen_prepare(w: Workload, batch: Batch, grad: bool) -> Prepared:
    fn = _varlen_fn()
    kw = _varlen_kwargs(w)
    q, k, v = (_leaf(t, grad) for t in (batch.q, batch.k, batch.v))
    qo, ko, mq, mk = batch.q_offsets, batch.kv_offsets, batch.max_q, batch.max_kv
    if w.kind == "broadcast_q":
        # What a user writes today: repeat Q per sequence; autograd sums dQ over the copies.
        return Prepared(
            fwd=lambda: _bq_out(fn(_expand_q(q, batch), k, v, qo, ko, mq, mk, **kw), batch),
            leaves=(q, k, v),
            dout=batch.dout,
        )
    return Prepared(
        fwd=lambda: fn(q, k, v, qo, ko, mq, mk, **kw), leaves=(q, k, v), dout=batch.dout
    )


# -------------------------------------------------------------------------------- FA4


def _fa4_available(device: torch.device) -> str | None:
    r = _cuda_reason(device, (9, 0))
    if r:
        return r
    return _import_reason("flash_attn.cute")


def _fa4_funcs():
    mod = importlib.import_module("flash_attn.cute")
    func = getattr(mod, "flash_attn_func", None)
    varlen = getattr(mod, "flash_attn_varlen_func", None)
    if func is None or varlen is None:
        iface = importlib.import_module("flash_attn.cute.interface")
        func, varlen = iface.flash_attn_func, iface.flash_attn_varlen_func
    return func, varlen


def _fa4_window_kw(w: Workload) -> dict[str, Any]:
    if not w.has_window:
        return {}
    left, right = mask_bounds(w.causal, w.window)  # causal: right 0
    return {"window_size": (None if left < 0 else left, None if right < 0 else right)}


#: Why FA4 has no block-sparse backward here (its own sources, flash-attn-4 4.0.0b36).
FA4_NO_SPARSE_BWD = (
    "FA4 block-sparse backward: flash_attn/cute/interface.py _flash_attn_bwd asserts 'Varlen "
    "backward with block sparsity is not yet supported' (4.0.0b36); its varlen forward is timed"
)


def _fa4_block_sparse_prepare(w: Workload, batch: Batch, grad: bool) -> Prepared:
    """FA4's varlen block-sparse forward on the workload's mask, fed both of FA4's lists: the
    listed blocks every pair of which the workload's causal band (``w.causal``) and the
    sequences' lengths leave visible as "full" blocks, the others as "mask" blocks (FA4 masks
    inside them); :func:`jagflash.bench.sparsity.fa4_block_sparse`. Refused, with every reason:
    the backward, a window, an FA4 without the varlen block-sparse forward."""
    reasons = []
    if grad:
        reasons.append(FA4_NO_SPARSE_BWD)
    if w.has_window:
        reasons.append("window with a block mask not wired for FA4")
    varlen = None
    try:
        from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch

        _, varlen = _fa4_funcs()
    except ImportError as e:
        reasons.append(f"flash_attn.cute.block_sparsity not importable ({e})")
    if varlen is not None and "block_sparse_tensors" not in inspect.signature(varlen).parameters:
        reasons.append("this flash_attn_varlen_func takes no block_sparse_tensors")
    if reasons:
        raise NotImplementedError("; ".join(reasons))
    from jagflash.bench.sparsity import fa4_block_sparse

    sparse = fa4_block_sparse(batch.block_mask, BlockSparseTensorsTorch, causal=w.causal)
    q, k, v = (_leaf(t, False) for t in (batch.q, batch.k, batch.v))
    kw = dict(cu_seqlens_q=batch.q_offsets, cu_seqlens_k=batch.kv_offsets)
    kw.update(_kwargs_for(varlen, max_seqlen_q=batch.max_q, max_seqlen_k=batch.max_kv))
    return Prepared(
        fwd=lambda: _first(varlen(q, k, v, softmax_scale=None, causal=w.causal, block_sparse_tensors=sparse, **kw)),
        leaves=(q, k, v),
        dout=batch.dout,
        note=lambda: "FA4 varlen block-sparse forward",
    )


def _fa4_prepare(w: Workload, batch: Batch, grad: bool) -> Prepared:
    if w.blocks is not None:
        return _fa4_block_sparse_prepare(w, batch, grad)
    func, varlen = _fa4_funcs()
    q, k, v = (_leaf(t, grad) for t in (batch.q, batch.k, batch.v))
    extra = _fa4_window_kw(w)
    if w.kind == "dense":
        q4, k4, v4 = _dense_views(batch, q, k, v)
        b, n = batch.dense_shape()
        return Prepared(
            fwd=lambda: _first(func(q4, k4, v4, softmax_scale=None, causal=w.causal, **extra)),
            leaves=(q, k, v),
            dout=batch.dout.view(b, n, w.heads, w.head_dim),
            out_canon=lambda o: o.reshape(batch.out_shape()),
        )
    # cu_seqlens are required; the max_seqlen hints are passed where this FA4 takes them.
    kw = dict(cu_seqlens_q=batch.q_offsets, cu_seqlens_k=batch.kv_offsets)
    kw.update(_kwargs_for(varlen, max_seqlen_q=batch.max_q, max_seqlen_k=batch.max_kv))
    if w.kind == "broadcast_q":
        return Prepared(
            fwd=lambda: _bq_out(
                _first(
                    varlen(
                        _expand_q(q, batch),
                        k,
                        v,
                        softmax_scale=None,
                        causal=w.causal,
                        **kw,
                        **extra,
                    )
                ),
                batch,
            ),
            leaves=(q, k, v),
            dout=batch.dout,
        )
    return Prepared(
        fwd=lambda: _first(varlen(q, k, v, softmax_scale=None, causal=w.causal, **kw, **extra)),
        leaves=(q, k, v),
        dout=batch.dout,
    )


# ------------------------------------------------------------------------- FlexAttention


@functools.cache
def _flex_compiled():
    # One compiled function for every workload: each new shape recompiles; keep dynamo from
    # silently falling back to the (full-score-matrix) eager path after a handful of shapes.
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    for knob in (
        "cache_size_limit",
        "recompile_limit",
        "accumulated_cache_size_limit",
        "accumulated_recompile_limit",
    ):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 256))
    # The bench replays one backward graph many times (retain_graph=True); AOT autograd's
    # donated buffers forbid that ("compiled with non-empty donated buffers", seen on the H200
    # for most jagged workloads): keep every buffer alive instead.
    import torch._functorch.config

    if hasattr(torch._functorch.config, "donated_buffer"):
        torch._functorch.config.donated_buffer = False
    return torch.compile(flex_attention, dynamic=False)


def _flex_available(device: torch.device) -> str | None:
    return _import_reason("torch.nn.attention.flex_attention")


def _flex_no_backward(device: torch.device) -> str | None:
    return "FlexAttention has no backward on CPU" if device.type == "cpu" else None


def _flex_document_mask(batch: Batch, left: int, right: int, block_mask=None) -> Callable:
    """FlexAttention's ``mask_mod`` over the concatenated sequences (indices into the packed
    rows): same document (sequence), the band ``[left, right]`` around each document's
    bottom-right diagonal (-1 unbounded) and, given a ``block_mask`` (a block-sparse
    workload's), its listed blocks in the document's own coordinates. One function (a grid
    lookup) for every block pattern, so one compiled kernel serves every workload of a shape."""
    dev = batch.device
    q_lens = torch.tensor(batch.q_lens, device=dev, dtype=torch.int64)
    kv_lens = torch.tensor(batch.kv_lens, device=dev, dtype=torch.int64)
    docs = torch.arange(batch.num_seqs, device=dev)
    q_doc = torch.repeat_interleave(docs, q_lens)
    kv_doc = torch.repeat_interleave(docs, kv_lens)
    q_start, kv_start = batch.q_offsets64[:-1], batch.kv_offsets64[:-1]
    shift = kv_lens - q_lens
    grid = None if block_mask is None else block_mask.to_dense()[:, 0]  # [B, nQ, nK]
    (bm, bn) = (1, 1) if block_mask is None else block_mask.block_size

    def document_mask(b, h, q_idx, kv_idx):
        d = q_doc[q_idx]
        m = d == kv_doc[kv_idx]
        qi, kj = q_idx - q_start[d], kv_idx - kv_start[d]
        if grid is not None:
            nq, nk = grid.shape[1], grid.shape[2]
            m = m & grid[d, (qi // bm).clamp(0, nq - 1), (kj // bn).clamp(0, nk - 1)]
        if left >= 0 or right >= 0:
            rel = kj - qi - shift[d]  # key offset relative to document d's bottom-right diagonal
            if right >= 0:
                m = m & (rel <= right)
            if left >= 0:
                m = m & (rel >= -left)
        return m

    return document_mask


def _flex_prepare(w: Workload, batch: Batch, grad: bool, compiled: bool | None = None) -> Prepared:
    """Document mask over the concatenated sequences (and a block-sparse workload's blocks:
    :func:`_flex_document_mask`); compiled on a GPU (``compiled`` forces it either way, e.g. to
    try the compiled path on a CPU). ``build`` is ``create_block_mask`` itself (the "build" row
    of block-sparse workloads; the mask the forward uses was built outside the timing)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    dev = batch.device
    on_gpu = dev.type == "cuda" if compiled is None else compiled
    nseq, hq, dim = batch.num_seqs, w.heads, w.head_dim
    bq = w.kind == "broadcast_q"
    left, right = mask_bounds(w.causal, w.window)
    tq, tk = batch.total_q, batch.total_kv
    kw = _kwargs_for(create_block_mask, _compile=on_gpu)
    rule = _flex_document_mask(batch, left, right, batch.block_mask)

    def build():
        return create_block_mask(rule, None, None, tq, tk, device=dev, **kw)

    block_mask = build()
    flex = _flex_compiled() if on_gpu else flex_attention

    def bhtd(t: torch.Tensor) -> torch.Tensor:  # [T, H, D] -> [1, H, T, D], contiguous
        return t.detach().transpose(0, 1).unsqueeze(0).contiguous()

    q = bhtd(batch.q).requires_grad_(grad)
    k = bhtd(batch.k).requires_grad_(grad)
    v = bhtd(batch.v).requires_grad_(grad)
    gqa = {"enable_gqa": True} if w.gqa else {}
    dout_rows = batch.dout.reshape(-1, hq, dim)  # broadcast_q: [B*Lq, H, D]

    def fwd() -> torch.Tensor:
        qq = q.repeat(1, 1, nseq, 1) if bq else q  # the expand-Q a user writes for flex
        return flex(qq, k, v, block_mask=block_mask, **gqa)

    def out_canon(o: torch.Tensor) -> torch.Tensor:
        o = o[0].transpose(0, 1)
        return o.reshape(batch.out_shape())

    def grads_canon(g: tuple) -> tuple:
        return tuple(None if x is None else x[0].transpose(0, 1) for x in g)

    return Prepared(
        fwd=fwd,
        leaves=(q, k, v),
        dout=bhtd(dout_rows),
        out_canon=out_canon,
        grads_canon=grads_canon,
        note=lambda: "" if on_gpu else "eager (no torch.compile on CPU)",
        build=None if w.blocks is None else build,
        build_note="create_block_mask over the packed batch (document + band + blocks)"
        + ("" if on_gpu else ", not compiled"),
    )


# ------------------------------------------------------------------- uTLX tutorial kernels

UTLX_TUTORIALS = (
    "hopper_fa_ws",
    "hopper_fa_ws_pipelined",
    "hopper_fa_ws_pipelined_pingpong",
    "hopper_fa_ws_pipelined_pingpong_persistent",
)


def _utlx_path(stem: str) -> Path | None:
    try:
        spec = importlib.util.find_spec("tlx")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        path = Path(loc) / "tutorials" / f"{stem}.py"
        if path.is_file():
            return path
    return None


def _utlx_available(stem: str) -> Callable[[torch.device], str | None]:
    def available(device: torch.device) -> str | None:
        r = _cuda_reason(device, (9, 0))
        if r:
            return r
        if torch.cuda.get_device_capability(device)[0] != 9:
            return "the Hopper tutorial kernels need sm_90"
        if _utlx_path(stem) is None:
            return f"tlx/tutorials/{stem}.py not found (uTLX not importable)"
        return _import_reason("triton.language.extra.tlx")

    return available


@functools.cache
def _utlx_module(stem: str):
    path = _utlx_path(stem)
    spec = importlib.util.spec_from_file_location(f"_jagflash_bench_utlx_{stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _utlx_supports(w: Workload) -> str | None:
    reasons = []
    if w.causal or w.has_window:
        reasons.append("the tutorial kernels are non-causal")
    if w.gqa:
        reasons.append("no GQA")
    if w.dtype not in ("bfloat16", "float16"):
        reasons.append(f"dtype {w.dtype}")
    return "; ".join(reasons) or None


def _utlx_prepare(stem: str) -> Callable[[Workload, Batch, bool], Prepared]:
    def prepare(w: Workload, batch: Batch, grad: bool) -> Prepared:
        mod = _utlx_module(stem)
        _, n = batch.dense_shape()
        if n % 128:
            raise NotImplementedError(f"N={n} is not a multiple of the tutorial's BLOCK_M=128")

        q, k, v = (_bhnd(t, batch) for t in (batch.q, batch.k, batch.v))
        scale = 1.0 / math.sqrt(w.head_dim)
        return Prepared(
            fwd=lambda: mod.attention(q, k, v, scale),
            leaves=(),
            dout=batch.dout,
            out_canon=_from_bhnd,
        )

    return prepare


# -------------------------------------------------------- per-sequence SDPA loop (CPU peer)


def _sdpa_loop_prepare(w: Workload, batch: Batch, grad: bool) -> Prepared:
    """One ``scaled_dot_product_attention`` call per sequence: the naive peer that runs anywhere."""
    q, k, v = (_leaf(t, grad) for t in (batch.q, batch.k, batch.v))
    qo, ko = batch.q_offsets.tolist(), batch.kv_offsets.tolist()
    left, right = mask_bounds(w.causal, w.window)
    bq = w.kind == "broadcast_q"
    sdpa = torch.nn.functional.scaled_dot_product_attention
    masks = []
    for lq, lk in zip(batch.q_lens, batch.kv_lens):
        if (left < 0 and right < 0) or lq == 0 or lk == 0:
            masks.append((None, False))
        elif left < 0 and right == 0 and lq == lk:
            masks.append((None, True))
        else:
            i = torch.arange(lq, device=batch.device)[:, None]
            j = torch.arange(lk, device=batch.device)[None, :]
            m = torch.ones(lq, lk, dtype=torch.bool, device=batch.device)
            if right >= 0:
                m &= j <= i + lk - lq + right
            if left >= 0:
                m &= j >= i + lk - lq - left
            masks.append((m, False))
    kw = {"enable_gqa": True} if w.gqa else {}

    def fwd() -> torch.Tensor:
        outs = []
        for b, (mask, causal) in enumerate(masks):
            qs = q if bq else q[qo[b] : qo[b + 1]]
            ks, vs = k[ko[b] : ko[b + 1]], v[ko[b] : ko[b + 1]]
            if qs.shape[0] == 0 or ks.shape[0] == 0:
                outs.append(torch.zeros_like(qs))
                continue
            o = sdpa(
                qs.transpose(0, 1),
                ks.transpose(0, 1),
                vs.transpose(0, 1),
                attn_mask=mask,
                is_causal=causal,
                **kw,
            )
            outs.append(o.transpose(0, 1))
        out = torch.stack(outs) if bq else torch.cat(outs)
        return out

    return Prepared(fwd=fwd, leaves=(q, k, v), dout=batch.dout)


# ---------------------------------------------------------------------------- the table

_JAGGED_KINDS = frozenset({"dense", "jagged", "broadcast_q"})


def _jagflash(
    name: str, backend: str, devices: set[str], default_on: set[str] | None = None, desc: str = ""
) -> Provider:
    return Provider(
        name=name,
        kinds=_JAGGED_KINDS,
        prepare=_jagflash_prepare(backend),
        description=desc or f"jagflash, backend={backend!r}",
        devices=frozenset(devices),
        available=_jagflash_available,
        supports=_jagflash_supports,
        default_on=None if default_on is None else frozenset(default_on),
        block_sparse=True,
        mask_build=True,
    )


#: Every provider, in the order tables list them.
PROVIDERS: dict[str, Provider] = {
    p.name: p
    for p in (
        _jagflash("jagflash-tlx", "tlx-sm90", {"cuda"}, desc="jagflash TLX Hopper kernels"),
        _jagflash("jagflash-portable", "portable", {"cuda"}, desc="jagflash stock-Triton kernels"),
        _jagflash(
            "jagflash-interpreter",
            "interpreter",
            {"cpu"},
            default_on={"cpu"},
            desc="jagflash kernels under the Triton interpreter",
        ),
        _jagflash(
            "jagflash-reference",
            "reference",
            {"cpu", "cuda"},
            default_on={"cpu"},
            desc="jagflash's plain-PyTorch reference backend",
        ),
        Provider(
            "fa4",
            frozenset({"dense", "jagged"}),
            _fa4_prepare,
            "FlashAttention-4 (flash_attn.cute flash_attn_func / flash_attn_varlen_func; "
            "block-sparse workloads: its varlen block-sparse forward)",
            available=_fa4_available,
            needs_host_triton=True,
            block_sparse=True,
        ),
        Provider(
            "fa4-expand-q",
            frozenset({"broadcast_q"}),
            _fa4_prepare,
            "FlashAttention-4 varlen with Q repeated per sequence",
            available=_fa4_available,
            needs_host_triton=True,
        ),
        Provider(
            "varlen-fa2",
            frozenset({"dense", "jagged"}),
            _varlen_prepare,
            "torch.nn.attention.varlen.varlen_attn (FlashAttention-2)",
            available=_varlen_available,
            supports=_varlen_supports,
        ),
        Provider(
            "expand-q-varlen",
            frozenset({"broadcast_q"}),
            _varlen_prepare,
            "Q repeated per sequence through varlen_attn, dQ summed by autograd",
            available=_varlen_available,
        ),
        Provider(
            "sdpa-flash",
            frozenset({"dense"}),
            _sdpa_prepare("FLASH_ATTENTION"),
            "torch SDPA, flash backend",
            available=_sdpa_available,
            supports=_no_window,
        ),
        Provider(
            "sdpa-cudnn",
            frozenset({"dense"}),
            _sdpa_prepare("CUDNN_ATTENTION"),
            "torch SDPA, cuDNN backend",
            available=_sdpa_available,
            supports=_no_window,
        ),
        Provider(
            "sdpa-nested",
            frozenset({"jagged"}),
            _sdpa_nested_prepare,
            "torch SDPA on torch.nested jagged tensors",
            devices=frozenset({"cpu", "cuda"}),
            supports=_no_window,
        ),
        Provider(
            "flex",
            frozenset({"dense", "jagged", "broadcast_q"}),
            _flex_prepare,
            "FlexAttention with a document mask (block mask built once, compiled)",
            devices=frozenset({"cpu", "cuda"}),
            available=_flex_available,
            no_backward=_flex_no_backward,
            needs_host_triton=True,
            # Each new shape costs a compile of tens of seconds: by default only the headline
            # workloads; name the provider with --providers to run it everywhere.
            default_workloads=(
                "jagged-lognormal-d128",
                "jagged-lognormal-causal-d128",
                "bq-lq256-b64",
                "*-left*",  # the sliding-window rows (block mask: window + document)
                "bs-*",  # block-sparse rows: one compile per batch shape (one mask_mod for all)
            ),
            block_sparse=True,
            mask_build=True,
        ),
        *(
            Provider(
                f"utlx-{stem.removeprefix('hopper_fa_').replace('_', '-')}",
                frozenset({"dense"}),
                _utlx_prepare(stem),
                f"uTLX Hopper FA tutorial tlx/tutorials/{stem}.py (forward only)",
                available=_utlx_available(stem),
                supports=_utlx_supports,
                no_backward=lambda device: "forward-only tutorial kernel",
            )
            for stem in UTLX_TUTORIALS
        ),
        Provider(
            "sdpa-loop",
            _JAGGED_KINDS,
            _sdpa_loop_prepare,
            "one torch SDPA call per sequence (naive peer)",
            devices=frozenset({"cpu", "cuda"}),
            default_on=frozenset({"cpu"}),
        ),
    )
}


def get(name: str) -> Provider:
    return PROVIDERS[name]


def select(patterns: str | None, device_type: str) -> tuple[list[Provider], bool]:
    """Providers matching comma-separated globs (None: the default set for ``device_type``),
    in :data:`PROVIDERS` order, and whether the user named them explicitly."""
    if patterns is None:
        return [p for p in PROVIDERS.values() if p.is_default(device_type)], False
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    missing = [p for p in pats if not fnmatch.filter(PROVIDERS, p)]
    if missing:
        raise ValueError(f"no provider matches {', '.join(missing)}; known: {', '.join(PROVIDERS)}")
    return [p for n, p in PROVIDERS.items() if any(fnmatch.fnmatchcase(n, q) for q in pats)], True
