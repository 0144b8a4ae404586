"""The source of the kernel :mod:`jagflash.core.mask_mod_kernel` generates from a traced
``mask_mod``: for every value of the mask_mod, the statement that computes it on a block's
pairs and the statements that bound it over the block (:func:`generate`).

Bounds, over the block's in-range pairs: an int value by an interval (``l``, ``u``) and whether
it is bounded at all (``k``: not after a narrow dtype could have wrapped, nor after a read the
rules do not bound); a boolean by whether it is true for every pair (``a``) and for some pair
(``p``), so ``a`` lists a block and ``not p`` drops it; a float only when it is one value over the
block. The rules are those of interval arithmetic (``+ - *``, floor ``//`` and ``%`` by a positive
int, ``abs``, ``min`` / ``max`` / ``clamp``, ``where``) and of three-valued logic (comparisons,
``& | ^ ~``); a closed-over tensor read is bounded by the least and greatest element the block's
indices reach (one element, or a run of up to :data:`_RUN` along one dimension). Every rule
only ever widens: a block is decided only where its pairs would all agree.

A boolean is also known true for some pair (``s``) where that is proven without the pairs, which
lists a block whose pairs do not all agree (a document's edge inside it, the band below the
diagonal). It rests on attained bounds: an int whose least and greatest values are each taken by
some in-range pair (``exact``: the positions, sums and ``min`` / ``max`` of values that follow
different sides of the pair, monotone maps, a read over a run of exactly the indices reached), and
``dense`` where every int between them is taken (then a read's run holds exactly the elements
read). A comparison of two attained values that follow different sides (the q side, the kv side;
``sides``), or one of them one value over the block, holds for some pair when it holds for some
pair of their attained bounds; ``a & b`` for some pair where one holds for every pair and the
other for some; ``a | b`` where either does.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from jagflash.core.mask_mod_template import LANES, STORE
from jagflash.core.mask_mod_values import _TL, _V, Untraceable, _Gen

__all__ = ["Untraceable", "generate"]


_FUNCS = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.floordiv: "floordiv",
    operator.mod: "mod", operator.and_: "and", operator.or_: "or", operator.xor: "xor",
    operator.invert: "invert", operator.neg: "neg", operator.lt: "lt", operator.le: "le",
    operator.gt: "gt", operator.ge: "ge", operator.eq: "eq", operator.ne: "ne",
    operator.getitem: "getitem", abs: "abs", operator.abs: "abs", torch.abs: "abs", torch.where: "where",
    torch.minimum: "minimum", torch.maximum: "maximum", torch.clamp: "clamp", torch.clip: "clamp",
    torch.remainder: "mod", torch.floor_divide: "floordiv", torch.logical_and: "logical_and",
    torch.logical_or: "logical_or", torch.logical_xor: "logical_xor", torch.logical_not: "logical_not",
    torch.bitwise_and: "and", torch.bitwise_or: "or", torch.bitwise_xor: "xor", torch.bitwise_not: "invert",
    torch.eq: "eq", torch.ne: "ne", torch.lt: "lt", torch.le: "le", torch.gt: "gt", torch.ge: "ge",
}
_METHODS = {
    "abs": "abs", "clamp": "clamp", "clip": "clamp", "to": "to", "long": "long", "int": "int",
    "bool": "bool", "logical_and": "logical_and", "logical_or": "logical_or", "logical_xor": "logical_xor",
    "logical_not": "logical_not", "remainder": "mod", "eq": "eq", "ne": "ne", "lt": "lt", "le": "le",
    "gt": "gt", "ge": "ge", "new_ones": "new_ones", "new_zeros": "new_zeros", "__getitem__": "getitem",
    "minimum": "minimum", "maximum": "maximum", "neg": "neg",
}
#: Tensor magic methods FX records as methods (``x.__and__(y)``), and their reflected forms
#: (``x.__rand__(y)`` is ``y & x``).
_MAGIC = {
    "add": "add", "sub": "sub", "mul": "mul", "floordiv": "floordiv", "mod": "mod", "and": "and",
    "or": "or", "xor": "xor", "invert": "invert", "neg": "neg", "abs": "abs", "lt": "lt", "le": "le",
    "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne",
}
_METHODS.update({f"__{k}__": v for k, v in _MAGIC.items()})
_REFLECTED = {f"__r{k}__": v for k, v in _MAGIC.items() if k in ("add", "sub", "mul", "floordiv", "mod", "and", "or", "xor")}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


def _pow2(c: int) -> int | None:
    return c.bit_length() - 1 if c > 0 and c & (c - 1) == 0 else None


def _floordiv(x: str, c: int, nonneg: bool) -> str:
    s = _pow2(c)
    if s is not None:
        return f"({x} >> {s})"  # arithmetic shift: floor for negatives too
    return f"({x} // {c})" if nonneg else f"(({x} - ((({x} % {c}) + {c}) % {c})) // {c})"


def _mod(x: str, c: int, nonneg: bool) -> str:
    s = _pow2(c)
    if s is not None:
        return f"({x} & {c - 1})"
    return f"({x} % {c})" if nonneg else f"((({x} % {c}) + {c}) % {c})"


def _minmax(fn: str, *xs: str) -> str:
    out = xs[0]
    for x in xs[1:]:
        out = f"tl.{fn}({out}, {x})"
    return out


def _apart(a, b) -> bool:
    """Whether two values follow different sides of the pair (or neither), so that any value
    of one and any of the other are taken together by some pair."""
    return not (a.sides & b.sides)


def _op(g: _Gen, op: str, args: list, kwargs: dict, dtype) -> _V:
    """The value of ``op`` on ``args`` (values or Python numbers), ``dtype`` its torch dtype."""
    kind = "bool" if dtype is torch.bool else ("float" if dtype is not None and dtype.is_floating_point else "int")

    def val(a, lift=True):
        return a if isinstance(a, _V) else g.const(a, lift)

    if op in ("new_ones", "new_zeros"):
        size = args[1] if len(args) > 1 else kwargs.get("size", ())
        if tuple(size) not in ((), (1,)):
            raise Untraceable([f"{op} of shape {tuple(size)} (only () is supported)"])
        one = op == "new_ones"
        return g.const(one if dtype is torch.bool else (int(one) if kind == "int" else float(one)), lift=False)
    if op in ("to", "long", "int", "bool"):
        x = val(args[0])
        if op == "to" and (len(args) > 2 or set(kwargs) - {"dtype"}):
            raise Untraceable(["Tensor.to with more than a dtype"])
        if kind == "bool":
            return g.as_bool(x)
        if kind == "int":
            if x.kind == "float":
                f, k = g.point(x)
                lo = u = f"{f}.to(tl.int64)"
            else:
                lo, u, k = g.int_bounds(x)
            return g.emit("int", dtype, x.t, (lo, u, k), x.nonneg, exact=x.exact, dense=x.dense)
        f, k = g.point(x)
        return g.emit("float", dtype, x.t, (f, k))
    if op in ("logical_and", "logical_or", "logical_xor"):
        return _op(g, {"logical_and": "and", "logical_or": "or", "logical_xor": "xor"}[op], [g.as_bool(val(a)) for a in args[:2]], {}, torch.bool)
    if op == "logical_not":
        return _op(g, "invert", [g.as_bool(val(args[0]))], {}, torch.bool)
    if op == "getitem":
        return _read(g, args[0], args[1], dtype)
    if op in ("floordiv", "mod"):
        x, c = args[0], args[1]
        if isinstance(c, _V) or not isinstance(c, int) or isinstance(c, bool) or c <= 0:
            raise Untraceable([f"{'//' if op == 'floordiv' else '%'} by {c if not isinstance(c, _V) else 'a tensor'} (only a positive int)"])
        x = val(x)
        if x.kind == "float":
            raise Untraceable([f"{op} of a float"])
        lo, u, k = g.int_bounds(x)
        t = (_floordiv if op == "floordiv" else _mod)(x.t, c, x.nonneg)
        if op == "floordiv":
            return g.emit("int", dtype, t, (_floordiv(lo, c, False), _floordiv(u, c, False), k), x.nonneg, exact=x.exact, dense=x.dense)
        same = f"({_floordiv(lo, c, False)} == {_floordiv(u, c, False)})"
        return g.emit("int", dtype, t, (f"tl.where({same}, {_mod(lo, c, False)}, 0)", f"tl.where({same}, {_mod(u, c, False)}, {c - 1})", k), True)
    if op == "mul":
        a, b = args[0], args[1]
        if not isinstance(a, _V):
            a, b = b, a
        a = val(a)
        if kind == "float":
            return _float(g, "*", a, val(b), dtype)
        la, ua, ka = g.int_bounds(a)
        if isinstance(b, int) and not isinstance(b, bool):  # a factor: a constant of the code
            lo, hi = (f"{la} * {b}", f"{ua} * {b}") if b >= 0 else (f"{ua} * {b}", f"{la} * {b}")
            return g.emit("int", dtype, f"{a.t} * {b}", (lo, hi, ka), a.nonneg and b >= 0, exact=a.exact, dense=a.dense and abs(b) <= 1)
        b = val(b)
        lb, ub, kb = g.int_bounds(b)
        ps = [f"{x} * {y}" for x in (la, ua) for y in (lb, ub)]
        return g.emit("int", dtype, f"{a.t} * {b.t}", (_minmax("minimum", *ps), _minmax("maximum", *ps), f"{ka} & {kb}"), a.nonneg and b.nonneg)
    if op in ("add", "sub"):
        a, b = val(args[0]), val(args[1])
        if kind == "float":
            return _float(g, "+" if op == "add" else "-", a, b, dtype)
        (la, ua, ka), (lb, ub, kb) = g.int_bounds(a), g.int_bounds(b)
        ex, de = _apart(a, b) and a.exact and b.exact, a.dense and b.dense  # each bound at a pair of both sides' extremes
        if op == "add":
            return g.emit("int", dtype, f"{a.t} + {b.t}", (f"{la} + {lb}", f"{ua} + {ub}", f"{ka} & {kb}"), a.nonneg and b.nonneg, exact=ex, dense=de)
        return g.emit("int", dtype, f"{a.t} - {b.t}", (f"{la} - {ub}", f"{ua} - {lb}", f"{ka} & {kb}"), exact=ex, dense=de)
    if op == "neg":
        a = val(args[0])
        if kind == "float":
            f, k = g.point(a)
            return g.emit("float", dtype, f"-{a.t}", (f"-{f}", k))
        lo, u, k = g.int_bounds(a)
        return g.emit("int", dtype, f"-{a.t}", (f"-{u}", f"-{lo}", k), exact=a.exact, dense=a.dense)
    if op == "abs":
        a = val(args[0])
        if kind == "float":
            f, k = g.point(a)
            return g.emit("float", dtype, f"tl.abs({a.t})", (f"tl.abs({f})", k), True)
        lo, u, k = g.int_bounds(a)
        least = f"tl.where({lo} >= 0, {lo}, tl.where({u} <= 0, -{u}, 0))"
        return g.emit("int", dtype, f"tl.abs({a.t})", (least, f"tl.maximum(-{lo}, {u})", k), True)
    if op in ("minimum", "maximum"):
        a, b = val(args[0]), val(args[1])
        if kind != "int":
            raise Untraceable([f"{op} of {kind}s"])
        (la, ua, ka), (lb, ub, kb) = g.int_bounds(a), g.int_bounds(b)
        nonneg = (a.nonneg and b.nonneg) if op == "minimum" else (a.nonneg or b.nonneg)
        ex = _apart(a, b) and a.exact and b.exact  # least at both sides' least, greatest at both greatest
        return g.emit("int", dtype, f"tl.{op}({a.t}, {b.t})", (f"tl.{op}({la}, {lb})", f"tl.{op}({ua}, {ub})", f"{ka} & {kb}"), nonneg,
                      exact=ex, dense=a.dense and b.dense)
    if op == "clamp":
        lo = args[1] if len(args) > 1 else kwargs.get("min")
        hi = args[2] if len(args) > 2 else kwargs.get("max")
        x = val(args[0])
        if kind != "int":
            raise Untraceable([f"clamp of a {kind}"])
        if lo is not None:
            x = _op(g, "maximum", [x, val(lo)], {}, dtype)
        if hi is not None:
            x = _op(g, "minimum", [x, val(hi)], {}, dtype)
        return x
    if op in _CMP:
        a, b = val(args[0]), val(args[1])
        if a.kind == "float" or b.kind == "float":
            (fa, ka), (fb, kb) = g.point(a), g.point(b)
            res = f"({fa} {_CMP[op]} {fb})"
            return g.emit("bool", torch.bool, f"{a.t} {_CMP[op]} {b.t}", (f"{ka} & {kb} & {res}", f"(({ka} & {kb}) == 0) | {res}"))
        (la, ua, ka), (lb, ub, kb) = g.int_bounds(a), g.int_bounds(b)
        if op in ("gt", "ge"):  # as lt / le with the sides swapped
            (la, ua, lb, ub), o = (lb, ub, la, ua), _FLIP[op]
        else:
            o = op
        k = f"({ka} & {kb})"
        if o in ("lt", "le"):
            s = _CMP[o]
            every, some = f"({ua} {s} {lb})", f"({la} {s} {ub})"
            taken = some  # at the pair of the left's least and the right's greatest
        else:
            one = f"(({la} == {ua}) & ({lb} == {ub}) & ({la} == {lb}))"
            apart = f"(({ua} < {lb}) | ({ub} < {la}))"
            every, some = (one, f"({apart} == 0)") if o == "eq" else (apart, f"({one} == 0)")
            sym = "==" if o == "eq" else "!="
            taken = "(" + " | ".join(f"({x} {sym} {y})" for x in (la, ua) for y in (lb, ub)) + ")"
        # some pair: two attained bounds that hold, from one pair (different sides, or one value)
        pair = "_T" if _apart(a, b) else f"(({la} == {ua}) | ({lb} == {ub}))"
        sure = f"{k} & {g.attained(a)} & {g.attained(b)} & {pair} & {taken}"
        return g.emit("bool", torch.bool, f"{a.t} {_CMP[op]} {b.t}", (f"{k} & {every}", f"({k} == 0) | {some}"), sure=sure)
    if op in ("and", "or", "xor", "invert"):
        xs = [val(a, lift=False) for a in args[: 1 if op == "invert" else 2]]
        if kind == "bool":
            xs = [g.as_bool(x) for x in xs]
            if op == "invert":
                a, p = xs[0].bounds
                return g.emit("bool", torch.bool, f"{xs[0].t} == 0", (f"{p} == 0", f"{a} == 0"))
            (aa, pa), (ab, pb) = xs[0].bounds, xs[1].bounds
            sym = {"and": "&", "or": "|", "xor": "^"}[op]
            if op == "xor":
                every = f"({aa} & ({pb} == 0)) | (({pa} == 0) & {ab})"
                some = f"(({aa} & {ab}) | (({pa} == 0) & ({pb} == 0))) == 0"
            else:
                every, some = f"{aa} {sym} {ab}", f"{pa} {sym} {pb}"
            sa, sb = g.surely(xs[0]), g.surely(xs[1])
            sure = {"and": f"({sa} & {ab}) | ({aa} & {sb})", "or": f"{sa} | {sb}"}.get(op)
            return g.emit("bool", torch.bool, f"{xs[0].t} {sym} {xs[1].t}", (every, some), sure=sure)
        if kind != "int":
            raise Untraceable([f"bitwise {op} of {kind}s"])
        pts = [g.point(x) for x in xs]
        if op == "invert":
            return g.emit("int", dtype, f"~{xs[0].t}", (f"~{pts[0][0]}", f"~{pts[0][0]}", pts[0][1]))
        sym = {"and": "&", "or": "|", "xor": "^"}[op]
        v = f"({pts[0][0]} {sym} {pts[1][0]})"
        return g.emit("int", dtype, f"{xs[0].t} {sym} {xs[1].t}", (v, v, f"{pts[0][1]} & {pts[1][1]}"))
    if op == "where":
        if len(args) != 3:
            raise Untraceable(["torch.where with other than three arguments"])
        c, x, y = g.as_bool(val(args[0], lift=False)), val(args[1]), val(args[2])
        ac, pc = c.bounds
        t = f"tl.where({c.t}, {x.t}, {y.t})"
        if kind == "bool":
            (ax, px), (ay, py) = g.as_bool(x).bounds, g.as_bool(y).bounds
            return g.emit("bool", torch.bool, t, (f"tl.where({ac}, {ax}, tl.where({pc}, {ax} & {ay}, {ay}))", f"tl.where({ac}, {px}, tl.where({pc}, {px} | {py}, {py}))"))
        if kind == "float":
            (fx, kx), (fy, ky) = g.point(x), g.point(y)
            return g.emit("float", dtype, t, (f"tl.where({ac}, {fx}, {fy})", f"tl.where({ac}, {kx}, tl.where({pc}, {kx} & {ky} & ({fx} == {fy}), {ky}))"))
        (lx, ux, kx), (ly, uy, ky) = g.int_bounds(x), g.int_bounds(y)
        return g.emit("int", dtype, t, (
            f"tl.where({ac}, {lx}, tl.where({pc}, tl.minimum({lx}, {ly}), {ly}))",
            f"tl.where({ac}, {ux}, tl.where({pc}, tl.maximum({ux}, {uy}), {uy}))",
            f"tl.where({ac}, {kx}, tl.where({pc}, {kx} & {ky}, {ky}))",
        ), x.nonneg and y.nonneg)
    raise Untraceable([f"operation {op}"])


def _float(g: _Gen, sym: str, a: _V, b: _V, dtype) -> _V:
    (fa, ka), (fb, kb) = g.point(a), g.point(b)
    return g.emit("float", dtype, f"{a.t} {sym} {b.t}", (f"{fa} {sym} {fb}", f"{ka} & {kb}"))


def _read(g: _Gen, table, index, dtype) -> _V:
    """``table[index]``: a tensor the mask_mod closes over, read at one element a pair; its
    bounds over a block are the least and greatest element the block's indices reach."""
    if not isinstance(table, _V) or table.const is None or not isinstance(table.const, torch.Tensor):
        raise Untraceable(["indexing a value the mask_mod computed (only tensors it closes over can be read)"])
    tensor = table.const
    index = index if isinstance(index, tuple) else (index,)
    if len(index) != tensor.dim():
        raise Untraceable([f"a {tensor.dim()}-d tensor indexed in {len(index)} dimensions (every dimension must be indexed)"])
    if dtype not in _TL:
        raise Untraceable([f"a tensor of dtype {dtype} read"])
    ptr, sizes, strides = g.tables[id(tensor)]
    tile_off, fixed, inside, dims = [], [], [], []
    for d, i in enumerate(index):
        if isinstance(i, bool) or not isinstance(i, (int, _V)):
            raise Untraceable([f"an index of type {type(i).__name__} (ints and int values only)"])
        if isinstance(i, int):
            j = i + tensor.shape[d] if i < 0 else i
            if not 0 <= j < tensor.shape[d]:
                raise Untraceable([f"index {i} outside dimension {d} of size {tensor.shape[d]}"])
            tile_off.append(f"{j} * {strides[d]}")
            fixed.append(f"{j} * {strides[d]}")
            continue
        if i.kind != "int":
            raise Untraceable([f"a {i.kind} index (int values only)"])
        n = sizes[d]
        t = i.t if i.nonneg else f"tl.where({i.t} < 0, {i.t} + {n}, {i.t})"
        tile_off.append(f"({t}).to(tl.int64) * {strides[d]}")
        inside.append(f"({t} >= 0) & ({t} < {n})" if not i.nonneg else f"({t} < {n})")
        dims.append((i.bounds, n, strides[d]))
    # a pair past the lengths may read any in-bounds element (its value is dropped): only the
    # index bounds mask the read, which then takes the index's shape (a row's term once a row)
    tmask = " & ".join(f"({m})" for m in inside)
    kind = "bool" if dtype is torch.bool else ("float" if dtype.is_floating_point else "int")
    t = f"tl.load({ptr} + {' + '.join(tile_off) or '0'}" + (f", mask={tmask}, other=0)" if tmask else ")")
    # bounds: the elements the block's indices reach, when they are one element or a run of at
    # most _RUN along one dimension (every other index one value), each index on one side of 0
    ok, width, firsts, runs, spans = g.name("r"), g.name("w"), [], [], []
    lines = []
    for (lo, u, k), n, stride in dims:
        a, z, span = g.name("i"), g.name("j"), g.name("d")
        lines += [
            f"{a} = tl.where({u} < 0, {lo} + {n}, {lo})",
            f"{z} = tl.where({u} < 0, {u} + {n}, {u})",
            f"{span} = {z} - {a}",
        ]
        firsts.append((a, stride))
        spans.append(span)
        runs.append(f"{k} & (({lo} >= 0) | ({u} < 0)) & ({a} >= 0) & ({z} < {n})")
    lines.append(f"{width} = {_minmax('maximum', *spans) if spans else '_Z'}")
    several = " + ".join(f"({x} > 0).to(tl.int32)" for x in spans) or "0"
    lines.append(f"{ok} = " + " & ".join(["_T", *(f"({r})" for r in runs), f"(({several}) <= 1)", f"({width} < {_RUN})"]))
    base = " + ".join([*fixed, *(f"{a} * {st}" for a, st in firsts)]) or "0"
    one = f"tl.load({ptr} + tl.where({ok} & inside, {base}, 0), mask={ok} & inside, other=0)"  # no read for a lane past the list's blocks
    if kind == "float":
        lines.append(f"{ok} = {ok} & ({width} == 0)")
        g.lanes.append("\n".join(lines))
        return g.emit("float", dtype, t, (one, ok))
    lo, hi = g.name("m"), g.name("x")
    g.lanes.append("\n".join(lines))
    g.lanes.append(_run_read(g, ptr, ok, width, firsts, spans, fixed, base, lo, hi))
    # the run holds exactly the elements read where every index takes every int between its
    # bounds: its least and greatest are then each read at some pair
    exact = all(isinstance(i, int) or i.dense for i in index)
    if kind == "bool":
        return g.emit("bool", torch.bool, t, (f"{ok} & ({lo} != 0)", f"({ok} == 0) | ({hi} != 0)"), sure=f"{ok} & ({hi} != 0)" if exact else None)
    return g.emit("int", dtype, t, (lo, hi, ok), exact=exact)


def _run_read(g: _Gen, ptr: str, ok: str, width: str, firsts, spans, fixed, base: str, lo: str, hi: str) -> str:
    """The lanes' statements that bound a read (``lo`` / ``hi``: the least and greatest element
    of the run from ``base``, ``width`` more elements along one dimension, where ``ok``): the
    first element, then the rest, :data:`_RUN_CHUNK` elements a step. A lane each (``[NW]``,
    no read past the list's blocks), unless the index follows only the list's fixed side (the
    row's q-block in a row's program, the column's kv-block in a column's; ``BY_ROW``): then one
    run (``[1]``) for every lane."""

    def form(zl: str, inside: str) -> list[str]:
        ok_l, w_l, r, c, m, v = g.name("ol"), g.name("wl"), g.name("rr"), g.name("cc"), g.name("mm"), g.name("vv")
        along = " + ".join([*fixed, *(f"(({a} + {zl})[:, None] + tl.minimum({c}, ({sp} + {zl})[:, None])) * {st}" for (a, st), sp in zip(firsts, spans))]) or "0"
        return [
            f"{ok_l} = {ok} & {inside}",
            f"{w_l} = {width} + {zl}",
            f"{lo} = tl.load({ptr} + tl.where({ok_l}, {base}, 0), mask={ok_l}, other=0).to(tl.int64) + {zl}",
            f"{hi} = {lo}",
            f"for {r} in range(1, (tl.max(tl.where({ok_l}, {w_l}, 0)) + 1).to(tl.int32), {_RUN_CHUNK}):",
            f"    {c} = {r} + tl.arange(0, {_RUN_CHUNK})[None, :]",
            f"    {m} = {ok_l}[:, None] & ({c} <= {w_l}[:, None])",
            f"    {v} = tl.load({ptr} + tl.where({m}, {along}, 0), mask={m}, other=0).to(tl.int64)",
            f"    {lo} = tl.minimum({lo}, tl.min(tl.where({m}, {v}, {2**62}), axis=1))",
            f"    {hi} = tl.maximum({hi}, tl.max(tl.where({m}, {v}, {-(2**62)}), axis=1))",
        ]

    if not g.sides:
        return "\n".join(form("_Z1", "_IN1"))
    if len(g.sides) == 2:
        return "\n".join(form("_ZL", "inside"))
    one, each = form("_Z1", "_IN1"), form("_ZL", "inside")
    first, second = (one, each) if g.sides == {"q"} else (each, one)
    return "\n".join(["if BY_ROW:", *(f"    {x}" for x in first), "else:", *(f"    {x}" for x in second)])


#: The longest run of elements along one dimension a block's bounds read (the rows of a 128-block
#: and then some: a per-token table indexed by a position plus a per-sequence start).
_RUN = 256
#: Elements of every lane's run one step of the lanes' read takes.
_RUN_CHUNK = 16


def generate(gm: torch.fx.GraphModule, idx: torch.dtype, heads: int) -> tuple[str, _Gen]:
    """The kernel's source for the traced mask_mod, and its generator (the arguments)."""
    g = _Gen()
    env: dict = {}
    meta: dict = {}
    out = None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 4:
        raise Untraceable([f"a mask_mod of {len(placeholders)} arguments (b, h, q_idx, kv_idx)"])
    leaves = {  # every position from the block's first to its last in-range one is some pair's
        0: _V("int", idx, "b", ("b_val", "b_val", "_T"), True, exact=True, dense=True),
        1: _V("int", idx, "h", ("h_val", "h_val", "_T"), True, exact=True, dense=True),
        2: _V("int", idx, "q_idx", ("q0", "q_last", "_T"), True, sides=frozenset({"q"}), exact=True, dense=True),
        3: _V("int", idx, "kv_idx", ("k0", "k_last", "_T"), True, sides=frozenset({"k"}), exact=True, dense=True),
    }
    for i, n in enumerate(placeholders):
        env[n], meta[n] = leaves[i], torch.zeros(1, dtype=idx, device="meta")
    g.reads_h = len(placeholders[1].users) > 0

    def resolve(a, m):
        return torch.fx.node.map_arg(a, lambda n: (env if m is None else meta)[n])

    for n in gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            out = resolve(n.args[0], None)
            break
        g.sides = frozenset().union(*(env[a].sides for a in n.all_input_nodes))  # what this node's values follow
        if n.op == "get_attr":
            tensor = getattr(gm, n.target)
            if not isinstance(tensor, torch.Tensor):
                raise Untraceable([f"attribute {n.target} is not a tensor"])
            if id(tensor) not in g.tables:
                ptr = g.arg("T", tensor)
                g.tables[id(tensor)] = (ptr, [g.param("n", int(s)) for s in tensor.shape], [g.param("s", int(s)) for s in tensor.stride()])
            env[n], meta[n] = _V("table", tensor.dtype, None, None, const=tensor), tensor.to("meta")
            if tensor.dim() == 0:  # a 0-d tensor used as a number: read once, a value like the indices
                env[n] = _read(g, env[n], (), tensor.dtype)
                meta[n] = torch.zeros(1, dtype=tensor.dtype, device="meta")
            continue
        op = (_FUNCS.get(n.target) if n.op == "call_function" else _METHODS.get(n.target) if n.op == "call_method" else None)
        reflected = n.op == "call_method" and n.target in _REFLECTED
        if reflected:
            op = _REFLECTED[n.target]
        if op is None:
            raise Untraceable([f"{n.op} {getattr(n.target, '__name__', n.target)} (not supported by the generated kernel)"])
        args, kwargs = list(resolve(n.args, None)), resolve(n.kwargs, None)
        if reflected:
            args[0], args[1] = args[1], args[0]
        margs, mkwargs = resolve(n.args, "meta"), resolve(n.kwargs, "meta")
        try:
            fn = n.target if n.op == "call_function" else getattr(margs[0], n.target)
            m = fn(*margs, **mkwargs) if n.op == "call_function" else fn(*margs[1:], **mkwargs)
        except Exception as e:  # any failure of torch's own dtype rules is a refusal
            raise Untraceable([f"{op} failed on meta tensors ({type(e).__name__}: {e})"]) from None
        if op != "getitem" and any(isinstance(a, _V) and a.kind == "table" for a in (*args, *kwargs.values())):
            raise Untraceable([f"{op} of a whole tensor the mask_mod closes over (index it in every dimension)"])
        dtype = m.dtype if isinstance(m, torch.Tensor) else None
        if isinstance(m, torch.Tensor) and m.dtype not in _TL:
            raise Untraceable([f"{op} gives dtype {m.dtype}"])
        env[n], meta[n] = _op(g, op, list(args), dict(kwargs), dtype), m
    if not isinstance(out, _V):
        out = g.const(bool(out), lift=False) if isinstance(out, (bool, int, float)) else None
    if out is None:
        raise Untraceable(["the mask_mod returns no value the kernel can read"])
    res = g.as_bool(out)
    every, some = f"({g.surely(res)})", res.bounds[1]  # listed: true for some pair, proven
    evals, stores = (heads, 1) if g.reads_h else (1, heads)
    args, pre = "".join(f"{a}, " for a in g.args), "".join(f"    {p}\n" for p in g.pre)
    lanes = "".join(f"    {line}\n" for s in g.lanes for line in s.split("\n"))
    names = "".join(f'"{a}", ' for a in g.args)
    text = LANES.format(args=args, names=names, idx=_TL[idx], evals=evals, pre=pre, lanes=lanes, every=every, some=some)
    text += "".join(f"            {s}\n" for s in g.tile)
    text += f"            hit = tl.max(tl.where(_live & ({res.t}), 1, 0))\n"
    text += STORE.format(stores=stores)
    return text, g
