"""jagflash's own evaluation of a FlexAttention ``mask_mod`` for
:meth:`jagflash.core.block_mask.BlockMask.from_mask_mod`: the mask_mod traced once
(``torch.fx``) into a Triton kernel of its own that evaluates the blocks and writes the block
lists in one launch (:func:`build_lists`).

A program takes one (sequence, q-block) row or one (sequence, kv-block) column of the padded
grid, reads the sequence's lengths from the offsets (nothing enumerated on the host, no sync),
and decides the blocks along it in two steps, the first for all of them at once (a lane each):

1. **Bounds.** Every value of the mask_mod is bounded over the block's in-range pairs: positions
   by the block's first and last in-range row and column, arithmetic by interval rules, a
   comparison or a boolean as "true for every pair" / "true for some pair" (three-valued logic),
   a tensor read by the least and greatest element the block's indices reach (rules:
   :mod:`jagflash.core.mask_mod_codegen`). A block whose result is true for every pair, or
   proven true for some pair, is listed, one true for no pair is not: a few scalar
   instructions a block, which decide every block of a block-arithmetic rule (local + global,
   strided, a lookup of a block grid at the block's own size) and, of a causal document mask,
   every block but the diagonal ones a document's edge cuts.
2. **Pairs.** Any other block evaluates the mask_mod on its ``bm x bn`` in-range pairs (rows
   ``[bm, 1]``, columns ``[1, bn]``: a term of the row or the column alone is computed once a
   row or a column) and reduces with ``any``.

The bounds are conservative (a block is decided only where the rules prove it), so the lists
are the pairs' ``any`` exactly, as the other evaluators compute it. Supported: ``+ - * abs neg``,
``//`` and ``%`` by a positive int, comparisons, ``& | ^ ~``, ``torch.where``, ``minimum`` /
``maximum``, ``clamp``, ``.to`` / ``.long()`` / ``.int()`` / ``.bool()``, the ``logical_*``
functions, ``new_ones`` / ``new_zeros`` of shape ``()`` (as FlexAttention's ``and_masks`` /
``or_masks`` start) and reads of tensors the mask_mod closes over, indexed in every dimension
by values or ints (a negative index counts from the end, as in torch). Anything else, or a
mask_mod that ``torch.fx`` cannot trace (Python control flow on its arguments), is refused
with :class:`Untraceable` and its reasons. An index outside a tensor it reads (an error in
torch) reads 0 (False) here.

Python ints the mask_mod closes over are run-time parameters of the kernel (a new window or grid
size reuses the compiled kernel), except divisors and factors, which stay constants (a shift,
not a division). A trace holds the closure's contents: the tensors it reads are read when the
kernel runs (changed in place, they are read as they are then), at the shapes and strides they
had when traced; a rebound closure cell is traced again.
"""

from __future__ import annotations

import functools
import hashlib
import linecache
import operator
import weakref

import torch
import torch.fx
import triton
import triton.language as tl
from triton import knobs
from triton.compiler.errors import CompilationError
from triton.runtime import driver

from jagflash.core.capability import UnsupportedProblem
from jagflash.core.jagged import cdiv
from jagflash.core.mask_mod import function_of
from jagflash.core.mask_mod_codegen import Untraceable, generate

__all__ = ["Untraceable", "build_lists", "kernel_reasons", "traced"]


#: Compiled kernels by source text (the :class:`Untraceable` of a source the GPU compiler refused).
_KERNELS: dict[str, object] = {}
#: Traces per mask_mod object (weakly held): ``[(heads, index dtype, closure contents, (source, generator) or the refusal)]``.
_TRACES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _baked(fn) -> tuple:
    """What a trace of ``fn`` bakes in besides its code: its closure's contents, defaults and a
    partial's arguments (held, and compared by identity: a rebound cell is a new trace)."""
    parts: list = []
    inner = fn
    while isinstance(inner, functools.partial):
        parts += [*inner.args, *inner.keywords.items()]
        inner = inner.func
    fn = function_of(fn)
    for c in getattr(fn, "__closure__", None) or ():
        try:
            parts.append(c.cell_contents)
        except ValueError:  # an empty cell
            parts.append(None)
    return (*parts, *(getattr(fn, "__defaults__", None) or ()))


def traced(mask_mod, heads: int, idx: torch.dtype):
    """``(kernel, generator, source)`` for ``mask_mod`` (cached per mask_mod object and its
    closure's contents, kernels per source text); raises :class:`Untraceable` with the reasons,
    a source the GPU compiler refused included."""
    baked = _baked(mask_mod)
    try:
        per_mod = _TRACES.setdefault(mask_mod, [])
    except TypeError:
        per_mod = []
    for h, i, b, found in per_mod:
        if h == heads and i == idx and len(b) == len(baked) and all(map(operator.is_, b, baked)):
            if isinstance(found, Untraceable):
                raise found
            return _kernel(*found)

    def root(b, h, q_idx, kv_idx):
        return mask_mod(b, h, q_idx, kv_idx)

    try:
        try:
            gm = torch.fx.symbolic_trace(root)
        except Exception as e:  # any tracing failure is a refusal with its reason
            raise Untraceable([f"torch.fx cannot trace it ({type(e).__name__}: {e})"]) from None
        text, g = generate(gm, idx, heads)
    except Untraceable as e:
        per_mod.append((heads, idx, baked, e))  # refused once, not traced again
        raise
    if text not in _KERNELS:
        _KERNELS[text] = _compile(text)
    per_mod.append((heads, idx, baked, (text, g)))
    return _kernel(text, g)


def _kernel(text: str, g):
    kernel = _KERNELS[text]
    if isinstance(kernel, Untraceable):
        raise kernel
    return kernel, g, text


def _compile(text: str):
    """``text`` as a Triton kernel (its source kept in ``linecache``, where Triton reads it)."""
    name = f"<jagflash-mask-mod-{hashlib.sha1(text.encode()).hexdigest()[:16]}>"
    linecache.cache[name] = (len(text), None, text.splitlines(True), name)
    scope = {"__name__": __name__, "triton": triton, "tl": tl, "_length": _length}
    exec(compile(text, name, "exec"), scope)  # jagflash's own generated source
    return scope["mask_mod_build"]


def kernel_reasons(device: torch.device) -> list[str]:
    """Why the generated kernels cannot run on ``device`` in this process."""
    from jagflash.core.backend import interpreter_mismatch, interpreter_reasons

    mismatch = interpreter_mismatch()
    if mismatch:
        return [mismatch]
    if device.type == "cuda":
        return []
    if device.type == "cpu":
        return [f"on the CPU only under Triton's interpreter: {r}" for r in interpreter_reasons()]
    return [f"device {device.type} (CUDA, or the CPU under TRITON_INTERPRET=1)"]


#: Triton's compiled kernel per (source, constants, tensor arguments' dtypes, CUDA device), launched without
#: Triton's per-call argument binding (:func:`_launch`).
_BOUND: dict = {}


def _launch(kernel, text: str, programs: int, args: tuple, consts: tuple, dev: torch.device) -> None:
    """``kernel[(programs,)](*args, **consts)``. The generated kernel specialises on nothing but
    its constants and argument dtypes (``do_not_specialize`` ints, ``do_not_specialize_on_alignment``
    pointers; the ints' dtype is int32 for every value below 2**31, which the caller keeps them
    under), so on CUDA its compiled kernel, kept from the first call, is launched directly by the
    next ones: the call costs the launch itself, not Triton's binding of ~20 arguments (~half the
    build's host time, H200)."""
    if dev.type == "cuda":
        device = driver.active.get_current_device()
        key = (text, consts, *[a.dtype for a in args if type(a) is not int], device)  # the dtypes Triton's binary is for
        compiled = _BOUND.get(key)
        if compiled is not None:
            stream = driver.active.get_current_stream(device)
            values = tuple(v for _, v in consts)
            hook = knobs.runtime.launch_enter_hook
            meta = None if hook is None else compiled.launch_metadata((programs, 1, 1), stream, *args, *values)
            compiled.run(programs, 1, 1, stream, compiled.function, compiled.packed_metadata, meta,
                         hook, knobs.runtime.launch_exit_hook, *args, *values)
            return
    compiled = kernel[(programs,)](*args, **dict(consts), num_warps=4)
    if dev.type == "cuda" and all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata", "launch_metadata")):
        _BOUND[key] = compiled


def _lists(batch: int, heads: int, nq: int, nk: int, dev: torch.device) -> tuple[torch.Tensor, ...]:
    """The four lists' tensors (:func:`build_lists`) as views of one allocation, each contiguous
    and starting on a 128-byte boundary (on the H200's host one ``torch.empty`` and four views
    took 16 us, four ``torch.empty`` 19 us: session 23)."""
    kv, q, kv_pairs = batch * heads * nq, batch * heads * nk, batch * heads * nq * nk
    kv_at = cdiv(kv, 32) * 32  # each list's slots rounded up to 128 bytes
    q_at = kv_at + cdiv(kv_pairs, 32) * 32
    q_pairs_at = q_at + cdiv(q, 32) * 32
    buf = torch.empty(q_pairs_at + kv_pairs, dtype=torch.int32, device=dev)
    return (
        buf.as_strided((batch, heads, nq), (heads * nq, nq, 1), 0),
        buf.as_strided((batch, heads, nq, nk), (heads * nq * nk, nq * nk, nk, 1), kv_at),
        buf.as_strided((batch, heads, nk), (heads * nk, nk, 1), q_at),
        buf.as_strided((batch, heads, nk, nq), (heads * nk * nq, nk * nq, nq, 1), q_pairs_at),
    )


def build_lists(mask_mod, heads: int, block_size: tuple[int, int], q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
                nq: int, nk: int, *, per_sequence: bool, index_dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The four lists (kv counts ``[B, heads, nq]``, kv indices ``[B, heads, nq, nk]``, q counts
    ``[B, heads, nk]``, q indices ``[B, heads, nk, nq]``, int32; slots past a count zero) of the
    blocks ``mask_mod`` lists in every sequence's own grid, in one launch of the generated kernel:
    a program per q-block row (its kv list) and per kv-block column (its q list) of the padded
    grid, each deciding all blocks along its list at once (then the open ones' pairs one by one),
    for every head, and compacting them in order; a program past its sequence's blocks writes an
    empty list. Every block is decided twice (once for its row, once for its column): no program
    waits for another's, nothing is stored but the lists, no host sync. Raises
    :class:`Untraceable`, and :class:`UnsupportedProblem` for a grid of ``2**31`` programs or more."""
    kernel, g, text = traced(mask_mod, heads, index_dtype)
    batch = q_offsets.numel() - 1
    dev = q_offsets.device
    programs = batch * (nq + nk)
    if programs >= 2**31:
        raise UnsupportedProblem("BlockMask.from_mask_mod (evaluator='kernel')", [
            f"{batch} sequences of {nq} q-blocks and {nk} kv-blocks take {programs} programs, more than one launch's 2**31 - 1"])
    lists = _lists(batch, heads, nq, nk, dev)
    if not (batch and nq and nk):
        lists[0].zero_()
        lists[2].zero_()
        return lists
    bm, bn = block_size
    args = (*lists, q_offsets, kv_offsets, nq, nk, g.param_tensor(dev), *g.values, batch * nq)
    consts = (("HEADS", heads), ("BM", bm), ("BN", bn), ("B_ZERO", not per_sequence), ("NW", 1 << (max(nq, nk) - 1).bit_length()))
    try:
        _launch(kernel, text, programs, args, consts, dev)
    except CompilationError as e:  # jagflash's bug, not the user's: refused (and reported) like an untraceable one
        last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        _KERNELS[text] = Untraceable([f"the generated kernel did not compile ({last}); please report this mask_mod"])
        raise _KERNELS[text] from None
    return lists


@triton.jit
def _length(offsets, seq):
    """Sequence ``seq``'s length from its offsets, int64."""
    return tl.load(offsets + seq + 1).to(tl.int64) - tl.load(offsets + seq).to(tl.int64)
