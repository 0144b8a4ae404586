"""The decode kernel (``jagflash.core.portable.decode``) against the fp64 reference by the
tolerance rule, called directly (windows included: the jagged variant has none), its LSE merge
twin against ``softmax.merge_partials``, and the policy of ``tuning.use_decode`` /
``tuning.decode_config``. Outputs are NaN-poisoned by the testing plugin, so a row no program
writes fails. On a GPU the same cases run on the portable build (fp16/bf16); bigger shapes:
variants/jagged/tests/test_decode.py."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from jagflash.core.capability import DEFAULT_ATOL, UnsupportedProblem
from jagflash.core.mask import mask_bounds
from jagflash.core.portable import decode
from jagflash.core.softmax import merge_partial_rows, merge_partials
from jagflash.core.tuning import (
    DECODE_MAX_Q,
    DECODE_MAX_ROWS,
    decode_config,
    decode_reasons,
    use_decode,
)
from jagflash.testing import check_against_reference, jagged_reference, make_jagged

ON_GPU = torch.cuda.is_available()
pytestmark = pytest.mark.gpu if ON_GPU else pytest.mark.interpret
DEVICE = "cuda" if ON_GPU else "cpu"
BACKEND = "portable" if ON_GPU else "interpreter"
FLOAT = torch.bfloat16 if ON_GPU else torch.float32

#: (q_lens, k_lens, hq, hkv, head_dim, causal, window, dtype): every case small, each a feature.
CASES = {
    # one token a sequence, packed several to a program; zero-length K/V and Q sequences
    "tokens_packed_gqa": ((1, 1, 0, 1, 1, 1, 0, 1, 1), (0, 1, 5, 40, 3, 0, 7, 2, 9), 4, 2, 32, False, (-1, -1), FLOAT),
    # few queries, keys long enough to split (the partials merged by LSE), causal
    "split_keys_causal": ((3, 16, 1), (70, 20, 300), 2, 1, 64, True, (-1, -1), FLOAT),
    "window_both_sides": ((3, 5, 1, 0), (70, 20, 3, 9), 2, 2, 32, False, (4, 1), FLOAT),
    "window_left_causal": ((4, 2, 7), (150, 1, 7), 2, 2, 32, True, (8, -1), FLOAT),
    # Lq > Lk: the first rows see no key (output 0, LSE -inf)
    "lq_gt_lk_causal": ((5, 9), (3, 0), 2, 1, 32, True, (-1, -1), FLOAT),
    "mqa_fp16_d128": ((2, 1), (100, 33), 8, 1, 128, True, (-1, -1), torch.float16),
    "head_dim_96": ((2, 3), (40, 5), 2, 2, 96, False, (-1, -1), FLOAT),
    "bf16": ((1, 2), (45, 60), 2, 2, 32, True, (-1, -1), torch.bfloat16),
    "no_queries": ((0, 0), (3, 4), 2, 2, 32, False, (-1, -1), FLOAT),
}


def _kernel(causal: bool, window: tuple[int, int], max_q: int, max_k: int):
    left, right = mask_bounds(causal, window)

    def run(q, k, v, q_offsets, kv_offsets):
        return decode.forward(
            q, k, v, q_offsets, kv_offsets, max_seqlen_q=max_q, max_seqlen_kv=max_k, left=left, right=right,
            scale=q.shape[-1] ** -0.5, backend=BACKEND,
        )

    return run


@pytest.mark.parametrize("name", CASES)
def test_decode_matches_reference(name: str) -> None:
    q_lens, k_lens, hq, hkv, dim, causal, window, dtype = CASES[name]
    t = make_jagged(q_lens, k_lens, hq, hkv, dim, dtype, DEVICE, requires_grad=False)
    t.pop("dout")

    def reference(q, k, v, q_offsets, kv_offsets, dtype):
        return jagged_reference(q, k, v, q_offsets, kv_offsets, causal=causal, window=window, dtype=dtype)

    check_against_reference(
        _kernel(causal, window, max(q_lens), max(k_lens)), reference, t, atol=DEFAULT_ATOL[dtype]
    )


def test_split_and_packing_are_exercised() -> None:
    """The cases above reach both launches' shapes: a packed program and a key split."""
    cfg = lambda q, k, hq, hkv, d: decode_config(
        BACKEND, batch=len(q), max_seqlen_q=max(q), max_seqlen_kv=max(k), total_kv=sum(k), heads_kv=hkv,
        group=hq // hkv, head_dim=d, sms=4,
    )
    assert cfg(*CASES["tokens_packed_gqa"][:5]).SEQS > 1
    assert cfg(*CASES["split_keys_causal"][:5]).SPLITS > 1


@triton.jit
def _merge_kernel(O1, L1, O2, L2, O, L, M: tl.constexpr, D: tl.constexpr):  # noqa: E741
    r = tl.arange(0, M)
    d = tl.arange(0, D)
    at = r[:, None] * D + d[None, :]
    out, lse = merge_partial_rows(tl.load(O1 + at), tl.load(L1 + r), tl.load(O2 + at), tl.load(L2 + r))
    tl.store(O + at, out)
    tl.store(L + r, lse)


def test_merge_partial_rows_is_merge_partials() -> None:
    """The Triton twin against the torch one, -inf on either side and on both."""
    gen = torch.Generator().manual_seed(0)
    o1, o2 = (torch.randn(16, 1, 16, generator=gen) for _ in range(2))
    l1, l2 = (torch.randn(1, 16, generator=gen) * 3 for _ in range(2))
    inf = float("-inf")
    l1[0, 0], l2[0, 1], l1[0, 2], l2[0, 2] = inf, inf, inf, inf
    o1[0], o2[1], o1[2], o2[2] = 0.0, 0.0, 0.0, 0.0
    want_o, want_l = merge_partials(o1, l1, o2, l2)
    dev = [t.contiguous().to(DEVICE) for t in (o1, l1, o2, l2)]
    out, lse = torch.empty_like(dev[0]), torch.empty_like(dev[1])
    _merge_kernel[(1,)](*dev, out, lse, M=16, D=16)
    torch.testing.assert_close(out.cpu(), want_o, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse.cpu(), want_l, rtol=1e-5, atol=1e-6)
    assert lse[0, 2].item() == inf
    assert out[2].abs().max().item() == 0.0


# --- policy (no kernel) ----------------------------------------------------------------------


@pytest.mark.parametrize("backend", sorted(DECODE_MAX_Q))
def test_use_decode_rule(backend: str) -> None:
    bound = DECODE_MAX_Q[backend]
    take, why = use_decode(backend, max_seqlen_q=bound, group=1, head_dim=128)
    assert take
    assert f"<= {bound}" in why
    take, why = use_decode(backend, max_seqlen_q=bound + 1, group=1, head_dim=128)
    assert not take
    assert f"> {bound}" in why
    assert use_decode(backend, max_seqlen_q=0, group=4, head_dim=64)[0]  # every sequence empty
    assert use_decode(backend, max_seqlen_q=bound + 1, group=1, head_dim=128, requested=True) == (True, "decode=True")
    assert use_decode(backend, max_seqlen_q=1, group=1, head_dim=128, requested=False) == (False, "decode=False")


def test_decode_refusals_list_every_reason() -> None:
    rows = DECODE_MAX_ROWS // 4 + 1
    assert not use_decode("portable", max_seqlen_q=rows, group=4, head_dim=48)[0]
    with pytest.raises(UnsupportedProblem) as e:
        use_decode("portable", max_seqlen_q=rows, group=4, head_dim=48, sparse=True, requested=True)
    assert len(e.value.reasons) == 3
    text = str(e.value)
    assert f"{rows * 4} query rows" in text
    assert "head_dim 48" in text
    assert "block mask" in text
    assert decode_reasons(max_seqlen_q=DECODE_MAX_ROWS, group=1, head_dim=64) == []


def test_decode_config_shapes() -> None:
    """4,096 one-token sequences pack 64 to a program without a split; 512 short-query
    sequences against ~1,024 keys on 132 SMs split their keys; rows never exceed 128."""
    tokens = decode_config("portable", batch=4096, max_seqlen_q=1, max_seqlen_kv=1, total_kv=4096, heads_kv=16, group=1, head_dim=128, sms=132)
    assert (tokens.SEQS, tokens.BLOCK_M, tokens.SPLITS) == (64, 64, 1)
    few = decode_config("portable", batch=64, max_seqlen_q=4, max_seqlen_kv=1100, total_kv=64 * 1024, heads_kv=2, group=4, head_dim=128, sms=132)
    assert few.SEQS == 1
    assert few.BLOCK_M == 16
    assert few.SPLITS > 1
    wide = decode_config("portable", batch=8, max_seqlen_q=16, max_seqlen_kv=64, total_kv=512, heads_kv=1, group=8, head_dim=256, sms=132)
    assert wide.BLOCK_M == DECODE_MAX_ROWS
    assert wide.SEQS == 1
    assert wide.BLOCK_N == 32


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_packed_sequences_keep_their_nan_and_inf() -> None:
    """A NaN or inf in one packed sequence's V reaches that sequence's rows as in the plain
    ``p @ v`` and no other row of the program (the shared dot would spread it through 0 * inf)."""
    q_lens, k_lens = (1, 2, 1, 1, 2), (3, 2, 4, 1, 3)
    t = make_jagged(q_lens, k_lens, 2, 1, 32, FLOAT, DEVICE, requires_grad=False)
    v = t["v"].clone()
    v[3, 0, 4] = float("nan")  # sequence 1
    v[6, 0, 9] = float("inf")  # sequence 2, both signs in column 11
    v[7, 0, 11], v[8, 0, 11] = float("inf"), float("-inf")
    v[9, 0, 2] = float("-inf")  # sequence 3
    cfg = decode_config(BACKEND, batch=5, max_seqlen_q=2, max_seqlen_kv=4, total_kv=13, heads_kv=1, group=2, head_dim=32, sms=4)
    assert cfg.SEQS == 5  # one program
    out, _ = _kernel(False, (-1, -1), 2, 4)(t["q"], t["k"], v, t["q_offsets"], t["kv_offsets"])
    want, _ = jagged_reference(t["q"], t["k"], v, t["q_offsets"], t["kv_offsets"], dtype=torch.float32)
    assert want.isnan().any()
    assert want.isinf().any()
    torch.testing.assert_close(out.float(), want.float(), equal_nan=True, atol=2e-2 if ON_GPU else 1e-5, rtol=2e-2 if ON_GPU else 1e-5)


class _Decode(torch.autograd.Function):
    """The decode forward and backward as one differentiable call (the op wiring is the jagged
    variant's; here the kernels alone)."""

    @staticmethod
    def forward(ctx, q, k, v, q_offsets, kv_offsets, kw):
        out, lse = decode.forward(q, k, v, q_offsets, kv_offsets, **kw)
        ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets)
        ctx.kw = kw
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, q_offsets, kv_offsets = ctx.saved_tensors
        grads = decode.backward(dout.contiguous(), q, k, v, out, lse, q_offsets, kv_offsets, **ctx.kw)
        return (*grads, None, None, None)


def _differentiable(causal: bool, window: tuple[int, int], max_q: int, max_k: int):
    left, right = mask_bounds(causal, window)
    kw = dict(max_seqlen_q=max_q, max_seqlen_kv=max_k, left=left, right=right, backend=BACKEND)
    return lambda q, k, v, q_offsets, kv_offsets: _Decode.apply(
        q, k, v, q_offsets, kv_offsets, {**kw, "scale": q.shape[-1] ** -0.5}
    )


@pytest.mark.parametrize("name", [n for n in CASES if n != "no_queries"] + ["no_queries"])
def test_decode_backward_matches_reference(name: str) -> None:
    """dQ, dK, dV of every case (packed, split, windows, keys no row sees, Lq > Lk, no
    queries at all: every key's gradient zero) against the fp64 reference."""
    q_lens, k_lens, hq, hkv, dim, causal, window, dtype = CASES[name]
    t = make_jagged(q_lens, k_lens, hq, hkv, dim, dtype, DEVICE)
    dout = t.pop("dout")

    def reference(q, k, v, q_offsets, kv_offsets, dtype):
        return jagged_reference(q, k, v, q_offsets, kv_offsets, causal=causal, window=window, dtype=dtype)

    check_against_reference(
        _differentiable(causal, window, max(q_lens), max(k_lens)), reference, t, atol=DEFAULT_ATOL[dtype], dout=dout
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("where", ["q", "dout", "k"])
def test_packed_backward_keeps_nan_in_its_sequence(where: str) -> None:
    """A NaN in one packed sequence's q, dO or K (the three that the shared dots would spread
    through ``0 * NaN``) leaves every other sequence's dQ, dK and dV as the reference's."""
    q_lens, k_lens = (1, 2, 1, 1, 2), (3, 2, 4, 1, 3)
    t = make_jagged(q_lens, k_lens, 2, 1, 32, FLOAT, DEVICE)
    cfg = decode_config(BACKEND, batch=5, max_seqlen_q=2, max_seqlen_kv=4, total_kv=13, heads_kv=1, group=2, head_dim=32, sms=4)
    assert cfg.SEQS == 5  # one program
    dout = t.pop("dout").clone()
    with torch.no_grad():
        {"q": t["q"], "dout": dout, "k": t["k"]}[where][3 if where != "k" else 5, 0, 4] = float("nan")  # sequence 2
    got = torch.autograd.grad(_differentiable(False, (-1, -1), 2, 4)(**t)[0], [t["q"], t["k"], t["v"]], dout)
    out, _ = jagged_reference(**t, dtype=torch.float64)
    want = torch.autograd.grad(out, [t["q"], t["k"], t["v"]], dout.double())
    q_seq = torch.repeat_interleave(torch.arange(5), torch.tensor(q_lens))
    k_seq = torch.repeat_interleave(torch.arange(5), torch.tensor(k_lens))
    bad = 2
    for name, g, w, seq in zip(("dq", "dk", "dv"), got, want, (q_seq, k_seq, k_seq)):
        rows = seq != bad
        assert not w[rows].isnan().any()
        tol = 2e-2 if ON_GPU else 1e-4  # bf16 on a GPU
        torch.testing.assert_close(g[rows].double(), w[rows].double(), atol=tol, rtol=tol, msg=name)
        assert g[~rows].isnan().any() or not w[~rows].isnan().any(), name
