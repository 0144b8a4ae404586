"""The values of a traced ``mask_mod`` as :mod:`jagflash.core.mask_mod_codegen` generates them: a
value (``_V``: its pairs' expression and the names of its bounds) and the generated source's
builder (``_Gen``: the statements, the arguments, the lifted parameters), with the refusal
(:class:`Untraceable`) and the dtype tables both use. The rules live in the codegen module.
"""

from __future__ import annotations

import torch

__all__ = ["Untraceable"]


class Untraceable(Exception):
    """The mask_mod cannot be evaluated by the generated kernel; ``reasons`` lists why."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("; ".join(reasons))


_TL = {
    torch.bool: "tl.int1", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32", torch.float64: "tl.float64",
}
#: Ranges of the narrow int dtypes: a bound past one means the pairs wrapped, so nothing is decided.
_RANGE = {torch.int8: (-(2**7), 2**7 - 1), torch.uint8: (0, 255), torch.int16: (-(2**15), 2**15 - 1), torch.int32: (-(2**31), 2**31 - 1)}


class _V:
    """One value of the mask_mod: its kind ("bool", "int", "float"), torch dtype (None for a
    Python number), whether it is known >= 0, a constant's value, and the names of its pairs'
    expression (``t``) and of its bounds (ints ``lo``/``u`` with ``k`` "bounded"; bools ``a``
    "every pair" / ``p`` "some pair"; floats ``lo`` with ``k`` "one value")."""

    def __init__(self, kind, dtype, t, bounds, nonneg=False, const=None, *, sides=frozenset(), exact=False, dense=False):
        self.kind, self.dtype, self.t, self.bounds, self.nonneg, self.const = kind, dtype, t, bounds, nonneg, const
        # sides: which positions it follows ("q", "k"); exact / dense: an int's attained bounds
        # (jagflash.core.mask_mod_codegen's docstring); sure: a bool's "true for some pair" (None: only where it is for every)
        self.sides, self.exact, self.dense, self.sure = sides, exact, dense, None


class _Gen:
    """The generated kernel's source: the pairs' statements, the bounds' statements, its
    arguments (the tensors read) and its parameters (their sizes and strides, the ints lifted
    out of the code: one int64 tensor the kernel reads once, so that a launch binds a few
    arguments only; fixed for the trace, as the closure's contents are)."""

    def __init__(self):
        self.tile: list[str] = []
        self.lanes: list[str] = []  # the bounds' statements, for every block along a list at once (a lane each)
        self.pre: list[str] = []  # the parameters' loads, before the loops
        self.args: list[str] = []
        self.values: list = []  # the run-time values of the arguments, in order
        self.params: list[int] = []
        self.on_device: dict = {}  # the parameters' tensor per device
        self.tables: dict[int, tuple] = {}
        self.n = 0
        self.reads_h = False
        # which of the pair's positions the node being generated depends on ("q", "k"): a read
        # whose index follows one side only is one run for every lane of a list along the other
        self.sides: frozenset = frozenset()

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def arg(self, prefix: str, value) -> str:
        name = self.name(prefix)
        self.args.append(name)
        self.values.append(value)
        return name

    def param(self, prefix: str, value: int, narrow: bool = False) -> str:
        """A parameter's name in the kernel; ``narrow``: int32 where it fits (as Triton would
        have passed it as an int argument)."""
        name = self.name(prefix)
        cast = ".to(tl.int32)" if narrow and -(2**31) <= value < 2**31 else ""
        self.pre.append(f"{name} = tl.load(_P + {len(self.params)}){cast}")
        self.params.append(int(value))
        return name

    def param_tensor(self, device: torch.device) -> torch.Tensor:
        """The parameters on ``device`` (copied there at the first launch on it)."""
        if device not in self.on_device:
            self.on_device[device] = torch.tensor(self.params or [0], dtype=torch.int64, device=device)
        return self.on_device[device]

    # -- values -------------------------------------------------------------------------------
    def const(self, c, lift: bool) -> _V:
        if isinstance(c, bool):
            word = "_T" if c else "_F"
            return _V("bool", None, repr(c), (word, word), const=c)
        if isinstance(c, int):
            text = self.param("c", c, narrow=True) if lift else repr(c)
            return _V("int", None, text, (f"({text} + _Z)", f"({text} + _Z)", "_T"), nonneg=c >= 0, const=c, exact=True, dense=True)
        if isinstance(c, float):
            return _V("float", None, repr(c), (repr(c), "_T"), const=c)
        raise Untraceable([f"a constant of type {type(c).__name__} ({c!r})"])

    def emit(self, kind, dtype, tile_expr, bounds_exprs, nonneg=False, *, exact=False, dense=False, sure=None) -> _V:
        t = self.name("t")
        if kind != "bool" and dtype in _TL:
            tile_expr = f"({tile_expr}).to({_TL[dtype]})"
        self.tile.append(f"{t} = {tile_expr}")
        names = tuple(self.name(p) for p in ("l", "u", "k") if kind == "int" or p != "u") if kind != "bool" else (self.name("a"), self.name("p"))
        for n, e in zip(names, bounds_exprs):
            self.lanes.append(f"{n} = {e}")
        if kind == "int" and dtype in _RANGE:
            least, most = _RANGE[dtype]
            lo, u, k = names
            self.lanes.append(f"{k} = {k} & ({lo} >= {least}) & ({u} <= {most})")
        if not self.sides:  # one value over the block (b, h, reads at them): its bounds are that value
            exact = dense = True
        v = _V(kind, dtype, t, names, nonneg, sides=self.sides, exact=exact and kind == "int", dense=dense and exact and kind == "int")
        if sure is not None and kind == "bool":
            v.sure = self.name("s")
            self.lanes.append(f"{v.sure} = {sure}")
        return v

    def surely(self, v: _V) -> str:
        """A bool's "true for some pair" (proven), or its "true for every pair"."""
        return f"({v.sure} | {v.bounds[0]})" if v.sure else v.bounds[0]

    def attained(self, v: _V) -> str:
        """Whether an int's bounds are each taken by some pair: always if ``exact``, else
        where they are one value (the value of every pair)."""
        lo, u, _ = v.bounds
        return "_T" if v.exact else f"({lo} == {u})"

    def as_bool(self, v: _V) -> _V:
        if v.kind == "bool":
            return v
        if v.kind == "int":
            lo, u, k = v.bounds
            return self.emit("bool", torch.bool, f"{v.t} != 0", (f"{k} & (({lo} > 0) | ({u} < 0))", f"({k} == 0) | ({lo} != 0) | ({u} != 0)"),
                             sure=f"{k} & {self.attained(v)} & (({lo} != 0) | ({u} != 0))")
        f, k = v.bounds
        return self.emit("bool", torch.bool, f"{v.t} != 0", (f"{k} & ({f} != 0)", f"({k} == 0) | ({f} != 0)"))

    def int_bounds(self, v: _V) -> tuple[str, str, str]:
        if v.kind == "int":
            return v.bounds
        if v.kind == "bool":
            a, p = v.bounds
            return (f"{a}.to(tl.int64)", f"{p}.to(tl.int64)", "_T")
        raise Untraceable(["a float where an int is needed"])

    def point(self, v: _V) -> tuple[str, str]:
        """A value's one value over the block, and whether it is one."""
        if v.kind == "float":
            return v.bounds
        if v.kind == "bool":
            a, p = v.bounds
            return (a, f"({a} == {p})")
        lo, u, k = v.bounds
        return (lo, f"({k} & ({lo} == {u}))")
