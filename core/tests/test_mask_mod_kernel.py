"""The generated mask_mod kernel (``jagflash.core.mask_mod_kernel``): random mask_mod expressions
over hypothesis-drawn jagged batches list exactly the eager evaluation's blocks (which
test_block_mask_mod.py holds against a pair-by-pair brute force), so the bounds that decide a
block without its pairs never decide one wrongly; reads of closed-over tensors (strided,
negative indices, int / float / 0-d); the trace cache; refusals with their reasons. On the CPU
under ``TRITON_INTERPRET=1``, on a GPU where one is present."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from jagflash.core import mask_mod_kernel as mk
from jagflash.core.block_mask import BlockMask
from jagflash.core.capability import UnsupportedProblem
from jagflash.testing.strategies import length_lists


@pytest.fixture(scope="module", params=[pytest.param("cpu", marks=pytest.mark.interpret), pytest.param("cuda", marks=pytest.mark.gpu)])
def dev(request) -> torch.device:
    """The CPU under Triton's interpreter, or a GPU."""
    return torch.device(request.param)


def _offsets(lengths, dev) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32, device=dev)


def _same(mm, lq, lk, dev, heads=1, size=(64, 64), **kw) -> BlockMask:
    qo, ko = _offsets(lq, dev), _offsets(lk, dev)
    got = BlockMask.from_mask_mod(mm, qo, ko, heads, size, evaluator="kernel", **kw)
    want = BlockMask.from_mask_mod(mm, qo, ko, heads, size, evaluator="eager", **kw)
    for x, y in zip((got.kv_counts, got.kv_indices, got.q_counts, got.q_indices), (want.kv_counts, want.kv_indices, want.q_counts, want.q_indices)):
        assert x.dtype == torch.int32
        assert x.is_contiguous()
        assert torch.equal(x, y)
    return got


# -- random mask_mod expressions ---------------------------------------------------------------
_INT_TABLE = torch.randint(-50, 400, (7, 5), generator=torch.Generator().manual_seed(1))
_BOOL_TABLE = torch.rand(3, 6, 6, generator=torch.Generator().manual_seed(2)) < 0.4


def _ints(depth: int):
    leaves = st.sampled_from(["q", "k", "b", "h"]) | st.integers(-20, 300)
    if depth == 0:
        return leaves
    sub = _ints(depth - 1)
    return st.one_of(
        leaves,
        st.tuples(st.sampled_from(["+", "-", "min", "max"]), sub, sub),
        st.tuples(st.just("*"), sub, st.integers(-3, 3)),
        st.tuples(st.sampled_from(["//", "%"]), sub, st.integers(1, 130)),
        st.tuples(st.sampled_from(["abs", "neg"]), sub),
        st.tuples(st.just("clamp"), sub, st.integers(-10, 100), st.integers(100, 400)),
        st.tuples(st.just("where"), _bools(depth - 1), sub, sub),
        st.tuples(st.just("read"), sub, sub),
    )


def _bools(depth: int):
    cmp = st.tuples(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), _ints(depth), _ints(depth))
    if depth == 0:
        return cmp
    sub = _bools(depth - 1)
    return st.one_of(
        cmp,
        st.tuples(st.sampled_from(["&", "|", "^"]), sub, sub),
        st.tuples(st.just("~"), sub),
        st.tuples(st.just("bread"), _ints(depth - 1), _ints(depth - 1)),
    )


def _number(x) -> bool:
    return isinstance(x, (bool, int, float))


def _build(t, dev):
    """A mask_mod sub-expression (a function of b, h, q, k) from a drawn tree; a sub-expression
    of constants alone is folded with Python's rules (torch's for Python numbers)."""
    if isinstance(t, int):
        return lambda b, h, q, k: t
    ints, bools = _INT_TABLE.to(dev), _BOOL_TABLE.to(dev)
    if isinstance(t, str):
        return {"q": lambda b, h, q, k: q, "k": lambda b, h, q, k: k, "b": lambda b, h, q, k: b, "h": lambda b, h, q, k: h}[t]
    op, *args = t
    n = {"*": 1, "//": 1, "%": 1, "clamp": 2}.get(op, 0)
    consts = args[len(args) - n :]
    fs = [_build(a, dev) for a in args[: len(args) - len(consts)]]

    def ev(*x):
        v = [f(*x) for f in fs]
        if op == "read":
            return ints[v[0] % 7, v[1] % 5]
        if op == "bread":
            return bools[x[0] % 3, v[0] % 6, v[1] % 6]
        if op == "where":
            if _number(v[0]):
                return v[1] if v[0] else v[2]
            return torch.where(v[0], v[1], v[2])
        if op in ("min", "max"):
            if _number(v[0]) and _number(v[1]):
                return (min if op == "min" else max)(v[0], v[1])
            if _number(v[0]):
                v = v[::-1]
            if _number(v[1]):
                return v[0].clamp(max=v[1]) if op == "min" else v[0].clamp(min=v[1])
            return (torch.minimum if op == "min" else torch.maximum)(v[0], v[1])
        if op == "clamp":
            return max(consts[0], min(consts[1], v[0])) if _number(v[0]) else v[0].clamp(consts[0], consts[1])
        if op == "~":
            return (not v[0]) if _number(v[0]) else ~v[0]
        if op in ("&", "|", "^") and _number(v[0]) and _number(v[1]):
            return {"&": v[0] and v[1], "|": v[0] or v[1], "^": v[0] != v[1]}[op]
        if op in ("*", "//", "%"):
            return {"*": lambda a: a * consts[0], "//": lambda a: a // consts[0], "%": lambda a: a % consts[0]}[op](v[0])
        return {
            "+": lambda a, c: a + c, "-": lambda a, c: a - c, "abs": lambda a: abs(a), "neg": lambda a: -a,
            "<": lambda a, c: a < c, "<=": lambda a, c: a <= c, ">": lambda a, c: a > c, ">=": lambda a, c: a >= c,
            "==": lambda a, c: a == c, "!=": lambda a, c: a != c, "&": lambda a, c: a & c, "|": lambda a, c: a | c,
            "^": lambda a, c: a ^ c,
        }[op](*v)

    return ev


def _tensor_valued(t) -> bool:
    """Whether the drawn expression depends on an argument (a constant one is not a mask_mod)."""
    return isinstance(t, str) or (isinstance(t, tuple) and any(_tensor_valued(a) for a in t[1:]))


@given(
    lq=length_lists(max_batch=3, max_len=260),
    extra=st.lists(st.integers(-40, 140), min_size=3, max_size=3),
    tree=_bools(2),
    heads=st.sampled_from([1, 2]),
    size=st.sampled_from([(64, 64), (128, 128)]),
)
def test_random_expressions_list_the_eager_blocks(dev, lq, extra, tree, heads, size) -> None:
    lk = [max(0, a + e) for a, e in zip(lq, extra)]
    if not _tensor_valued(tree):
        tree = ("&", tree, ("<=", "k", "q"))
    _same(_build(tree, dev), lq, lk, dev, heads, size)


def test_bounds_at_block_edges(dev) -> None:
    """Bands whose edge falls on, just before and just after a block edge: an off-by-one in a
    bound decides a block wrongly here."""
    forms = [
        lambda w: lambda b, h, q, k: q - k <= w,
        lambda w: lambda b, h, q, k: k - q < w,
        lambda w: lambda b, h, q, k: (q - k).abs() >= w,
        lambda w: lambda b, h, q, k: q * 2 - k * 3 > w,
        lambda w: lambda b, h, q, k: -(q // 3) + k // 5 == w // 8,
        lambda w: lambda b, h, q, k: torch.minimum(q, k + w) != q,
    ]
    for form in forms:
        for w in (-129, -128, -65, -64, -63, -1, 0, 1, 63, 64, 65, 127, 128, 129):
            _same(form(w), [256, 131], [192, 200], dev)


def test_reads_see_every_element_of_a_run(dev) -> None:
    """A read's bounds over a block take every element its run reaches: one set element at each
    place of a 64-row run (its first, the edges of the steps it is read in, its last), read by
    the q side, the kv side and at an offset, lists the block that holds it and no other."""
    for place in (0, 1, 15, 16, 17, 31, 32, 47, 48, 62, 63, 64, 127):
        tab = torch.zeros(200, dtype=torch.int64, device=dev)
        tab[place] = 1
        for rule in _run_rules(tab):
            _same(rule, [190, 130], [200, 129], dev)


def test_a_read_of_every_other_element_is_not_taken_for_its_run(dev) -> None:
    """The bounds of ``tab[q * 2]`` span a run that holds elements no pair reads (the odd ones):
    set only there, they must not list a block (a read is "true for some pair" only where its
    index takes every int of its run); a dense index (``tab[q]``) lists the same table's blocks."""
    tab = (torch.arange(400, device=dev) % 2).to(torch.int64)
    flags = tab.bool()
    for rule in (
        lambda b, h, q, k: tab[(q * 2).clamp(max=399)] > 0,
        lambda b, h, q, k: tab[(k * 2).clamp(max=399)] == 1,
        lambda b, h, q, k: flags[(q * 2 + k * 0).clamp(max=399)],
        lambda b, h, q, k: (tab[(q * 2).clamp(max=399)] != 0) & (k <= q),
    ):
        got = _same(rule, [190, 130], [200, 129], dev)
        assert int(got.kv_counts.sum()) == 0
    assert int(_same(lambda b, h, q, k: tab[q.clamp(max=399)] > 0, [190, 130], [200, 129], dev).kv_counts.sum()) > 0


def _run_forms(rule) -> list[tuple[str, str]]:
    """``(mode, form)`` of each run read in the generated lanes: mode ``row`` / ``col`` (inside
    the lanes' ``BY_ROW`` branch or its ``else``) or ``both``; form ``one`` (one run for every
    lane) or ``each`` (a run a lane)."""
    import re

    _, _, text = mk.traced(rule, 1, torch.int32)
    forms, mode = [], "both"
    for line in text.split("def mask_mod_build")[0].splitlines():
        s, indent = line.strip(), len(line) - len(line.lstrip())
        if s == "if BY_ROW:":
            mode = "row"
        elif s == "else:" and mode == "row":
            mode = "col"
        elif indent == 4:
            mode = "both"
        hit = re.fullmatch(r"ol\d+ = .* & (_IN1|inside)", s)
        if hit:
            forms.append((mode, "one" if hit.group(1) == "_IN1" else "each"))
    return forms


def test_a_read_that_follows_the_fixed_side_is_one_run_for_every_lane() -> None:
    """In a row's program every lane shares the row's q-block, so a read indexed by q alone is
    one run there (and a run a lane in a column's program); a kv-indexed read the other way
    round; a read of neither (a per-sequence start) is one everywhere, one of both a run a lane
    everywhere. (The bounds are the same either way: this is the work the lanes do.)"""
    tab, start = torch.zeros(200, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
    grid = torch.zeros(3, 4, 4, dtype=torch.bool)
    assert _run_forms(lambda b, h, q, k: tab[q.clamp(max=199)] > k) == [("row", "one"), ("col", "each")]
    assert _run_forms(lambda b, h, q, k: tab[k.clamp(max=199)] > q) == [("row", "each"), ("col", "one")]
    assert _run_forms(lambda b, h, q, k: (start[b] + q) > k) == [("both", "one")]
    assert _run_forms(lambda b, h, q, k: grid[b, (q // 64).clamp(max=3), (k // 64).clamp(max=3)]) == [("both", "each")]
    assert _run_forms(lambda b, h, q, k: tab[(start[b] + q).clamp(max=199)] == tab[(start[b] + k).clamp(max=199)]) == [
        ("both", "one"), ("row", "one"), ("col", "each"), ("both", "one"), ("row", "each"), ("col", "one"),
    ]


def _run_rules(tab: torch.Tensor) -> tuple:
    return (
        lambda b, h, q, k: tab[q.clamp(max=199)] > 0,
        lambda b, h, q, k: tab[k.clamp(max=199)] > 0,
        lambda b, h, q, k: tab[(q + 5).clamp(max=199)] + tab[k.clamp(max=199)] >= 2,
    )


def _above(tab: torch.Tensor):
    return lambda b, h, q, k: tab[k.clamp(max=tab.numel() - 1)] > q


def test_one_mask_mod_over_tables_of_several_dtypes(dev) -> None:
    """Closures of one mask_mod over tables of different dtypes: each build reads its own table
    as its dtype, warm calls included (on CUDA the launch kept from a first call is kept per
    dtype of every tensor argument)."""
    values = torch.arange(0, 600, 3)
    for _ in range(2):
        for dtype in (torch.int64, torch.int32, torch.int16, torch.float32):
            _same(_above(values.to(dtype).to(dev)), [190, 1, 64], [200, 70, 129], dev)


# -- the forms the bench and users write -------------------------------------------------------
def test_named_forms_and_reads(dev) -> None:
    """Local + global in block arithmetic, a lookup of a block grid (decided from bounds), a
    document mask (pairs), per-head rules, a strided 2-d table read through negative indices,
    int64 and float tables, a 0-d tensor, FlexAttention's and_masks start (``new_ones``), constant
    rules, int64 indices, per_sequence=False."""
    lq, lk = [300, 0, 64, 130, 1], [250, 70, 0, 130, 129]
    bs = 64
    grid = torch.rand(5, 2, 6, 6, generator=torch.Generator().manual_seed(3)).to(dev) < 0.3
    doc = torch.randint(0, 4, (300,), generator=torch.Generator().manual_seed(4)).sort().values.to(dev)
    wide = torch.randint(0, 9, (6, 40), generator=torch.Generator().manual_seed(5)).to(dev).t()  # strided [40, 6]
    scores = torch.rand(8, generator=torch.Generator().manual_seed(6), dtype=torch.float64).to(dev)
    shift = torch.tensor(17, device=dev)
    big = torch.arange(400, dtype=torch.int64, device=dev) * 3

    def local_global(b, h, q, k):
        qb, kb = q // bs, k // bs
        return ((kb <= qb) & (kb >= qb - 1)) | (kb < 1)

    rules = [
        (local_global, 1),
        (lambda b, h, q, k: grid[b, h, (q // bs).clamp(0, 5), (k // bs).clamp(0, 5)], 2),
        (lambda b, h, q, k: doc[q.clamp(max=299)] == doc[k.clamp(max=299)], 1),
        (lambda b, h, q, k: torch.where(h == 0, k <= q, (q - k).abs() < 40), 2),
        (lambda b, h, q, k: wide[q % 40, -1 - (k % 6)] > 4, 1),
        (lambda b, h, q, k: big[k.clamp(max=399)] < q * 2 + 100, 1),
        (lambda b, h, q, k: scores[(q // 37) % 8] > 0.5, 1),
        (lambda b, h, q, k: k < q + shift, 1),
        (lambda b, h, q, k: b.new_ones((), dtype=torch.bool) & (k <= q), 1),
        (lambda b, h, q, k: ((q ^ k) & 64) == 0, 1),
        (lambda b, h, q, k: True, 1),
        (lambda b, h, q, k: False, 2),
    ]
    for rule, heads in rules:
        _same(rule, lq, lk, dev, heads, (bs, bs))
    _same(local_global, lq, lk, dev, 1, (bs, bs), index_dtype=torch.int64)
    _same(local_global, lq, lk, dev, 1, (bs, bs), per_sequence=False, max_seqlen_q=300, max_seqlen_kv=250)
    _same(local_global, [0, 0], [0, 5], dev)


def test_trace_cache_and_kernel_reuse(dev) -> None:
    """A mask_mod object is traced once; closures of one function that differ in an int (a
    window) share the compiled kernel (the int is an argument, not a constant); a rebound
    closure cell (another table) is a new trace that reads the new tensor."""

    def band(width):
        return lambda b, h, q, k: (q - k).abs() <= width

    a, b = band(10), band(90)
    _same(a, [200, 70], [150, 300], dev)
    kernels = len(mk._KERNELS)
    _same(b, [200, 70], [150, 300], dev)
    assert len(mk._KERNELS) == kernels
    assert len(mk._TRACES[a]) == 1
    _same(a, [5, 400], [64, 64], dev)
    assert len(mk._TRACES[a]) == 1

    table = torch.zeros(8, dtype=torch.bool, device=dev)

    def rule(b, h, q, k):
        return table[(q // 64) % 8]

    m = _same(rule, [512], [64], dev)
    assert int(m.kv_counts.sum()) == 0
    table = torch.ones(8, dtype=torch.bool, device=dev)  # read by rule through its cell
    m = _same(rule, [512], [64], dev)
    assert int(m.kv_counts.sum()) == 8
    assert len(mk._TRACES[rule]) == 2
    _same(functools.partial(lambda b, h, q, k, w: k <= q + w, w=30), [100], [300], dev)


def test_refusals_list_their_reasons(dev) -> None:
    """evaluator='kernel' refuses what it cannot evaluate, with the reason; the default path
    (on the CPU: eager) still evaluates it."""

    def control_flow(b, h, q, k):
        return k <= q if int(q.max()) > 5 else k > q

    def divide(b, h, q, k):
        return q / 3 > k

    table = torch.zeros(10, dtype=torch.bool, device=dev)

    def computed_index(b, h, q, k):
        return (table | (b > 0))[q % 10]

    def by_tensor(b, h, q, k):
        return q // (k + 1) > 2

    qo = _offsets([100], dev)
    for rule, want in ((control_flow, "torch.fx cannot trace"), (divide, "truediv"), (computed_index, "whole tensor"), (by_tensor, "only a positive int")):
        with pytest.raises(UnsupportedProblem) as e:
            BlockMask.from_mask_mod(rule, qo, qo, 1, (64, 64), evaluator="kernel")
        assert want in str(e.value), str(e.value)
        assert "evaluator='kernel'" in str(e.value)
    if dev.type == "cuda":  # the default falls back, saying why, once per mask_mod function
        with pytest.warns(UserWarning, match="cannot evaluate this mask_mod"):
            got = BlockMask.from_mask_mod(divide, qo, qo, 1, (64, 64))
        assert torch.equal(got.kv_counts, BlockMask.from_mask_mod(divide, qo, qo, 1, (64, 64), evaluator="eager").kv_counts)
    big = _offsets([128], dev)  # one sequence, a grid of 2**31 q-blocks: refused before anything is allocated
    with pytest.raises(UnsupportedProblem, match="more than one launch's"):
        BlockMask.from_mask_mod(lambda b, h, q, k: k <= q, big, big, 1, (128, 128), max_seqlen_q=2**38, max_seqlen_kv=128, evaluator="kernel")


_SM90 = r'''
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from jagflash.core import mask_mod_kernel as mk

TYPES = {torch.bool: "i1", torch.int8: "i8", torch.int32: "i32", torch.int64: "i64", torch.float64: "fp64"}


def build(fn, values, constexprs):
    sig = {n: ("*" + TYPES[v.dtype]) if isinstance(v, torch.Tensor) else "i32" for n, v in zip(fn.arg_names, values)}
    sig.update(dict.fromkeys(constexprs, "constexpr"))
    triton.compile(ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32))


i32 = torch.zeros(1, dtype=torch.int32)
grid = torch.zeros(3, 4, 5, dtype=torch.bool)
doc, start, scores = torch.zeros(400, dtype=torch.int64), torch.zeros(4, dtype=torch.int64), torch.zeros(8, dtype=torch.float64)
rules = [
    lambda b, h, q, k: (((k // 128) <= (q // 128)) & ((k // 128) >= (q // 128) - 3)) | (k < 128),
    lambda b, h, q, k: grid[b, (q // 128).clamp(0, 3), (k // 128).clamp(0, 4)],
    lambda b, h, q, k: (doc[(start[b] + q).clamp(max=399)] == doc[(start[b] + k).clamp(max=399)]) & (k <= q),
    lambda b, h, q, k: torch.where(h == 0, (q - k).abs() < 40, scores[(q // 37) % 8] > 0.5),
    lambda b, h, q, k: True,
]
for rule in rules:
    kernel, g, _ = mk.traced(rule, 2, torch.int32)
    build(kernel, [i32, i32, i32, i32, i32, i32, 5, 5, torch.zeros(1, dtype=torch.int64), *g.values, 7],
          {"HEADS": 2, "BM": 128, "BN": 128, "B_ZERO": False, "NW": 32})
print("compiled", len(rules))
'''


def test_kernels_compile_for_sm90() -> None:
    """The generated kernels of the bench's and users' forms compile for
    sm_90 (in a process without the interpreter: the GPU compiler's type rules are stricter
    than the interpreter's, e.g. a name bound to a scalar in one branch and a block in the other)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _SM90], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "compiled 5" in run.stdout


def test_a_kernel_the_compiler_refuses_is_refused_with_its_reason(dev, monkeypatch) -> None:
    """A generated source the GPU compiler rejects (jagflash's bug) is an ``Untraceable``: the
    reason named, the source not launched again."""
    from triton.compiler.errors import CompilationError

    def rule(b, h, q, k):
        return k * 3 <= q + 11

    _, _, text = mk.traced(rule, 1, torch.int32)
    launches = []

    class Refused:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(grid)
                raise CompilationError(None, None, "a type the compiler refuses")

            return launch

    monkeypatch.setitem(mk._KERNELS, text, Refused())
    qo = _offsets([100], dev)
    for _ in range(2):
        with pytest.raises(UnsupportedProblem, match="did not compile"):
            BlockMask.from_mask_mod(rule, qo, qo, 1, (64, 64), evaluator="kernel")
    assert len(launches) == 1


def _lists(m: BlockMask) -> tuple[torch.Tensor, ...]:
    return m.kv_counts, m.kv_indices, m.q_counts, m.q_indices


@pytest.mark.gpu
def test_gpu_one_launch_builds_in_graphs_and_on_two_streams() -> None:
    """The build's one launch (after the first call, Triton's compiled kernel launched directly):
    replayed in a CUDA graph after the offsets changed in place, and issued on two streams at
    once, many times over, it lists what the eager path lists (no state kept between launches)."""
    gen = torch.Generator().manual_seed(3)
    lengths = [(torch.randint(1, 3000, (40,), generator=gen)).tolist() for _ in range(3)]
    rule = lambda b, h, q, k: ((q // 128 - k // 128).abs() <= 2) | (k < 64) | (((q + 3 * k) // 97) % 5 == b % 5)
    qo = _offsets(lengths[0], "cuda")
    kw = dict(max_seqlen_q=3000, max_seqlen_kv=3000)
    BlockMask.from_mask_mod(rule, qo, qo, 1, (64, 64), evaluator="kernel", **kw)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = BlockMask.from_mask_mod(rule, qo, qo, 1, (64, 64), evaluator="kernel", **kw)
    for lens in lengths:
        qo.copy_(_offsets(lens, "cuda"))
        for _ in range(3):
            graph.replay()
            want = BlockMask.from_mask_mod(rule, qo, qo, 1, (64, 64), evaluator="eager", **kw)
            for x, y in zip(_lists(captured), _lists(want)):
                assert torch.equal(x, y)
    assert any(key[0] == mk.traced(rule, 1, torch.int32)[2] for key in mk._BOUND)  # the warm calls launched directly
    offsets = [_offsets(lens, "cuda") for lens in lengths[1:]]
    wants = [_lists(BlockMask.from_mask_mod(rule, o, o, 1, (64, 64), evaluator="eager", **kw)) for o in offsets]
    streams = [torch.cuda.Stream() for _ in offsets]
    torch.cuda.synchronize()
    got: list = [[], []]
    for _ in range(20):
        for i, (s, o) in enumerate(zip(streams, offsets)):
            with torch.cuda.stream(s):
                got[i].append(_lists(BlockMask.from_mask_mod(rule, o, o, 1, (64, 64), evaluator="kernel", **kw)))
    torch.cuda.synchronize()
    for i, want in enumerate(wants):
        for lists in got[i]:
            for x, y in zip(lists, want):
                assert torch.equal(x, y)
