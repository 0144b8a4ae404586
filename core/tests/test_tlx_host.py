"""The TLX kernels' host side that needs no GPU: refusals (they come before any launch),
and the policy that picks the one-pass backward."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton.language.extra.tlx", reason="needs triton-utlx")

from jagflash.core import tuning
from jagflash.core.seqlen import plan_row
from jagflash.core.tlx import bwd_preprocess, bwd_sm90, fwd_sm90

CELL = bwd_preprocess.CELL_INTS.value  # (the ints a dQ cell count takes)


def test_one_pass_backward_refuses_a_head_dim_without_dq_tiles() -> None:
    """A head dim the kernel has no dQ tiles for (D 32): refused before any launch, naming the
    head dims it takes."""
    q = torch.zeros(4, 1, 32, dtype=torch.float16)
    offs = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"head dims \(64, 128\)") as err:
        bwd_sm90.backward(q, q, q, q, q, torch.zeros(1, 4), offs, offs, left=-1, right=-1, scale=0.125)
    assert "got 32" in str(err.value)


def test_dq_tiles_are_half_the_head_dim_or_whole_rows_at_d64() -> None:
    """D 128: each consumer warpgroup computes 64 of the columns every step; D 64: whole rows
    (64 columns) every other step, never a 32-column slice of K."""
    assert tuning.dq_cols(128) == 64
    assert tuning.dq_cols(64) == 64


def test_one_pass_only_where_it_measured_faster() -> None:
    """D 64 and 128, causal or not, with a window too (a bounded left side changes which
    q-steps run, not what a step adds to dQ), never for a deterministic call."""
    assert tuning.use_one_pass(False, -1, -1, 128)
    assert tuning.use_one_pass(False, -1, 0, 128)  # causal
    assert not tuning.use_one_pass(True, -1, -1, 128)
    assert not tuning.use_one_pass(True, -1, 0, 128)
    assert tuning.use_one_pass(False, 64, -1, 128)  # window
    assert tuning.use_one_pass(False, 64, 0, 64)  # causal window
    assert not tuning.use_one_pass(True, 64, 0, 128)
    assert tuning.use_one_pass(False, -1, 0, 64)
    assert not tuning.use_one_pass(True, -1, 0, 64)


def test_tile_ring_only_where_k_v_sequences_average_one_tile() -> None:
    """The forward hands the consumers decoded tiles (``RING_TILES``) exactly where the
    batch's K/V sequences average at most one K/V tile (BLOCK_N keys): the tiny batch it was
    measured faster on (2,048 sequences of 1-63 tokens), not the long batches it cost up to
    1.5 % on; an empty batch (no sequence) takes the ring."""
    n = tuning.tlx_sm90_blocks(128)["fwd"][1]
    assert tuning.default_ring_tiles(2048 * 32, 2048, n)
    assert tuning.default_ring_tiles(4 * n, 4, n)
    assert not tuning.default_ring_tiles(4 * n + 1, 4, n)
    assert not tuning.default_ring_tiles(4 * 4096, 4, n)
    assert tuning.default_ring_tiles(0, 0, n)


def test_backward_tile_ring_where_the_forward_takes_it_and_with_a_block_mask() -> None:
    """The dK/dV kernel hands kv-tiles through the tile ring on the forward's rule (short K/V
    sequences) and on every block-sparse call, in the one pass and the two passes alike."""
    n = tuning.tlx_sm90_blocks(128)["dkdv"][1]
    call = {"head_dim": 128, "group": 1, "left": -1, "right": -1, "q_shared": False, "dynamic": True, "zigzag": False}
    for fused in (True, False):
        assert tuning.bwd_config(**call, fused_dq=fused, total_kv=2048 * 32, batch=2048).RING_TILES
        assert not tuning.bwd_config(**call, fused_dq=fused, total_kv=4 * 4096, batch=4).RING_TILES
        assert tuning.bwd_config(**call, fused_dq=fused, total_kv=4 * 4096, batch=4, sparse=True).RING_TILES
        assert tuning.bwd_config(**call, fused_dq=fused, total_kv=4 * n + 1, batch=4).RING_TILES is False


def test_dkdv_tiles_follow_head_dim() -> None:
    """64-query dK/dV steps at D 64 and 128 (the one pass needs them; causal too); what plans
    are laid out with for the TLX backend (plan_blocks) agrees."""
    from jagflash.core.tuning import plan_blocks, tlx_sm90_blocks

    assert tlx_sm90_blocks(128)["dkdv"] == (64, 128)
    assert tlx_sm90_blocks(64)["dkdv"] == (64, 128)
    for dim in (64, 128):
        assert plan_blocks("tlx-sm90", dim)["dkdv"] == tlx_sm90_blocks(dim)["dkdv"]


def test_one_pass_backward_refuses_a_plan_laid_out_for_32_query_steps() -> None:
    """A plan laid out for 32-query dK/dV tiles (the portable kernels' steps) handed to the one pass: refused
    naming both tile shapes."""
    from jagflash.core.plan.build import make_plan

    q = torch.zeros(8, 1, 128, dtype=torch.float16)
    offs = torch.tensor([0, 8], dtype=torch.int32)
    plan = make_plan(
        offs, offs, total_q=8, total_kv=8, heads_q=1, heads_kv=1, window=(-1, 0), block_m=128,
        block_n=128, dkdv_blocks=(32, 128), backward=True,
    )
    with pytest.raises(ValueError, match=r"the plan's tiles are 32x128, the config's 64x128"):
        bwd_sm90.backward(q, q, q, q, q, torch.zeros(1, 8), offs, offs, left=-1, right=0, scale=0.125, plan=plan)


@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("given_delta", [False, True])
def test_backward_vectors_pack_each_sequence_at_a_multiple_of_the_pad(given_delta, offsets_dtype) -> None:
    """The dK/dV kernel's packed vectors (a plain Triton kernel: runs under the interpreter):
    sequence b's rows start at row vec_tile[b] * VEC_PAD, hold log2 LSE (+inf where LSE is
    -inf) and delta = rowsum(dO * O) (or the given delta); padding rows hold +inf and 0.
    Zero-length sequences (first, inside, last), a sequence of exactly VEC_PAD rows, one row."""
    pad = tuning.VEC_PAD
    gen = torch.Generator().manual_seed(7)
    lens = [0, 3, pad, 0, pad + 5, 1, 0]
    offs = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=offsets_dtype)
    tq, hq, dim = int(offs[-1]), 3, 16
    out = torch.randn(tq, hq, dim, generator=gen)
    dout = torch.randn(tq, hq, dim, generator=gen)
    lse = torch.randn(hq, tq, generator=gen)
    lse[1, 4] = float("-inf")  # a row that saw no key
    delta = (out * dout).sum(-1).T.contiguous()
    if given_delta:
        got = bwd_preprocess.backward_vectors(lse, offs, delta=delta)
    else:
        got = bwd_preprocess.backward_vectors(lse, offs, out=out, dout=dout)
    lse2, packed_delta, vec_tile = got
    tiles = [0]
    for n in lens:
        tiles.append(tiles[-1] + -(-n // pad))
    assert vec_tile.tolist() == tiles
    assert lse2.shape[1] % 16 == 0
    assert lse2.shape[1] >= tiles[-1] * pad
    want_lse2 = torch.full_like(lse2, float("inf"))
    want_delta = torch.zeros_like(packed_delta)
    log2e = 1.4426950408889634
    for b, n in enumerate(lens):
        src = slice(int(offs[b]), int(offs[b]) + n)
        dst = slice(tiles[b] * pad, tiles[b] * pad + n)
        want_lse2[:, dst] = torch.where(lse[:, src] == float("-inf"), float("inf"), lse[:, src] * log2e)
        want_delta[:, dst] = delta[:, src]
    torch.testing.assert_close(lse2, want_lse2, rtol=1e-6, atol=0)
    torch.testing.assert_close(packed_delta, want_delta, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shared", [False, True], ids=["jagged", "broadcast_q"])
def test_backward_vectors_zero_the_dq_accumulator_on_every_row(shared) -> None:
    """With ``dq_acc`` the preprocess zeroes the one-pass backward's fp32 dQ accumulator (a
    NaN-poisoned one here) on every query row, each head's columns, while it reads O and dO, and
    packs the same vectors as without it; broadcast-Q's accumulator is the shared block (zeroed
    through the first sequence's rows). No rows to read: zeroed all the same. A given delta
    (nothing read) is refused."""
    gen = torch.Generator().manual_seed(9)
    hq, dim = 3, 16
    lens = [70, 70, 70] if shared else [0, 5, tuning.VEC_PAD + 3, 0, 1]
    offs = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    tq = int(offs[-1])
    out = torch.randn(tq, hq, dim, generator=gen)
    dout = torch.randn(tq, hq, dim, generator=gen)
    lse = torch.randn(hq, tq, generator=gen)
    acc = torch.full((lens[0] if shared else tq, hq * dim), float("nan"))
    got = bwd_preprocess.backward_vectors(lse, offs, out=out, dout=dout, dq_acc=acc, acc_shared=shared)
    want = bwd_preprocess.backward_vectors(lse, offs, out=out, dout=dout)
    assert torch.equal(acc, torch.zeros_like(acc))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    empty = torch.full((4, hq * dim), float("nan"))
    none = torch.zeros(1, dtype=torch.int32)
    bwd_preprocess.backward_vectors(torch.empty(hq, 0), none, out=out[:0], dout=dout[:0], dq_acc=empty)
    assert torch.equal(empty, torch.zeros_like(empty))
    with pytest.raises(ValueError, match="dq_acc"):
        bwd_preprocess.backward_vectors(lse, offs, delta=lse, dq_acc=acc)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("n", [0, 1, 4095, 4096 * 2 + 17])
def test_scaled_cast_writes_every_element_scaled_in_the_output_dtype(dtype, n) -> None:
    """The one-pass backward's dQ from its accumulator (a plain Triton kernel: runs under the
    interpreter; fp16, as bf16 is not exact there): every element of a NaN-poisoned output is
    ``scale * src`` rounded once to its dtype, the partial last block too. A non-contiguous,
    non-fp32 or differently sized pair is refused with every reason."""
    gen = torch.Generator().manual_seed(n)
    src = torch.randn(n, generator=gen) * 100
    out = torch.full((n,), float("nan"), dtype=dtype)
    got = bwd_preprocess.scaled_cast(src, 0.088, out)
    assert got is out
    assert torch.equal(out, (src * 0.088).to(dtype))


def test_the_one_pass_owns_short_sequences_where_it_can() -> None:
    """Where the kernel may own sequences (``tuning.own_span``): the one pass on a dynamic-grouped
    table at D 128, the sequences of up to OWN_KV_TILES kv-tiles; not at D 64, not for
    broadcast-Q, not on other tables, not in the two passes. The policy owns there, with the tile
    ring, once ``OWN_BY_DEFAULT`` is on. A config that owns where the kernel cannot is refused
    with every reason."""
    import dataclasses

    call = {"group": 1, "left": -1, "right": -1, "dynamic": True, "zigzag": False, "total_kv": 1 << 20, "batch": 2}
    spans = {
        (dim, q_shared, fused, grouped): tuning.own_span(dim, 128, fused_dq=fused, q_shared=q_shared, grouped=grouped)
        for dim in (64, 128) for q_shared in (False, True) for fused in (False, True) for grouped in (False, True)
    }
    assert spans.pop((128, False, True, True)) == tuning.OWN_KV_TILES * 128
    assert not any(spans.values())
    own = tuning.bwd_config(head_dim=128, q_shared=False, fused_dq=True, grouped=True, **call)
    assert (tuning.OWN_KV_TILES * own.BLOCK_N if tuning.OWN_BY_DEFAULT else 0) == own.OWN_SPAN
    assert own.RING_TILES == tuning.OWN_BY_DEFAULT
    want = tuning.bwd_config(head_dim=64, q_shared=False, fused_dq=True, grouped=True, **call)
    assert not want.OWN_SPAN
    bad = dataclasses.replace(want, OWN_SPAN=100, RING_TILES=False)
    reasons = " ".join(tuning.config_reasons(bad, want, (want.BLOCK_M, want.BLOCK_N)))
    for why in ("tile ring", "column-half dQ", "multiple of BLOCK_N"):
        assert why in reasons
    two_pass = dataclasses.replace(bad, FUSED_DQ=False)
    assert "needs the one pass" in " ".join(tuning.config_reasons(two_pass, two_pass, (want.BLOCK_M, want.BLOCK_N)))
    assert not tuning.config_reasons(own, own, (own.BLOCK_M, own.BLOCK_N))


def test_owned_rows_are_left_to_the_kernel_by_the_preprocess_and_the_cast() -> None:
    """With ``owned`` (the sequences of 1 to ``own_span`` keys, whose dQ rows the dK/dV kernel
    zeroes, sums and writes itself: ``tuning.own_span``) the preprocess zeroes every other row of
    a NaN-poisoned accumulator and leaves the owned rows' NaN, with the same vectors, and the
    cast writes every other row of a NaN-poisoned dQ and leaves the owned rows' NaN: lengths at,
    under and over the span, a sequence with queries but no key (not owned: its rows are zeroed
    and cast), one with keys but no query, rows of any width (many heads: several column
    blocks). Broadcast-Q's shared rows have no owner: refused."""
    gen = torch.Generator().manual_seed(5)
    span = 256
    q_lens = [5, 300, 0, 64, 257, 9, 40]
    k_lens = [256, 300, 7, 0, 10, 257, 1]
    for hq, dim in ((3, 16), (5, 256)):
        qo = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        ko = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32)
        tq = int(qo[-1])
        out = torch.randn(tq, hq, dim, generator=gen)
        dout = torch.randn(tq, hq, dim, generator=gen)
        lse = torch.randn(hq, tq, generator=gen)
        acc = torch.full((tq, hq * dim), float("nan"))
        got = bwd_preprocess.backward_vectors(lse, qo, out=out, dout=dout, dq_acc=acc, owned=(ko, span))
        want = bwd_preprocess.backward_vectors(lse, qo, out=out, dout=dout)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
        mine = torch.cat([torch.full((lq,), 0 < lk <= span) for lq, lk in zip(q_lens, k_lens)])
        assert mine.any()
        assert not mine.all()
        assert torch.isnan(acc[mine]).all()
        assert torch.equal(acc[~mine], torch.zeros_like(acc[~mine]))
        src = torch.randn(tq, hq * dim, generator=gen)
        dq = torch.full((tq, hq, dim), float("nan"), dtype=torch.float16)
        assert bwd_preprocess.scaled_cast(src, 0.5, dq, (qo, ko, span)) is dq
        assert torch.isnan(dq[mine]).all()
        assert torch.equal(dq[~mine], (src[~mine] * 0.5).to(torch.float16).view(-1, hq, dim))
    with pytest.raises(ValueError, match="broadcast-Q"):
        bwd_preprocess.backward_vectors(lse, qo, out=out, dout=dout, dq_acc=acc, acc_shared=True, owned=(ko, span))


def test_scaled_cast_refuses_what_its_flat_copy_cannot_take() -> None:
    """Every reason at once: the source's dtype, the element counts, each side's layout."""
    src = torch.zeros(8, 4)
    with pytest.raises(ValueError, match=r"^scaled_cast: ") as err:
        bwd_preprocess.scaled_cast(src.t().half(), 1.0, torch.zeros(8, 8, dtype=torch.float16).t())
    for reason in ("torch.float16, not fp32", "32 elements, the output 64", "source is not contiguous", "output is not contiguous"):
        assert reason in str(err.value)
    bwd_preprocess.scaled_cast(src, 1.0, torch.zeros(32, dtype=torch.float16))  # the same numbers, flat: taken


@pytest.mark.parametrize("given_delta", [False, True])
def test_backward_vectors_read_a_per_sequence_lse_in_place(given_delta) -> None:
    """LSE (and a given delta) ``[B, Hq, L]``, as the dense and broadcast-Q forwards store it
    (``lse_per_sequence``), packs exactly as its ``[Hq, B*L]`` copy does: each value is read
    where it lies, no transposed copy is made."""
    from jagflash.core.jagged import lse_by_head

    gen = torch.Generator().manual_seed(3)
    n_seqs, hq, length, dim = 3, 2, 70, 16
    offs = torch.arange(n_seqs + 1, dtype=torch.int32) * length
    out = torch.randn(n_seqs * length, hq, dim, generator=gen)
    dout = torch.randn(n_seqs * length, hq, dim, generator=gen)
    lse = torch.randn(n_seqs, hq, length, generator=gen)
    delta = torch.randn(n_seqs, hq, length, generator=gen)
    if given_delta:
        got = bwd_preprocess.backward_vectors(lse, offs, delta=delta)
        want = bwd_preprocess.backward_vectors(lse_by_head(lse), offs, delta=lse_by_head(delta))
    else:
        got = bwd_preprocess.backward_vectors(lse, offs, out=out, dout=dout)
        want = bwd_preprocess.backward_vectors(lse_by_head(lse), offs, out=out, dout=dout)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    # the sequences' first packed tiles depend on (B, L) alone: kept, not made again
    assert bwd_preprocess.backward_vectors(lse, offs, delta=delta)[2] is got[2]


def test_forward_refuses_lse_per_sequence_of_unequal_lengths() -> None:
    """``lse_per_sequence`` stores LSE ``[B, Hq, L]``: 300 query rows in 7 sequences cannot be
    that, refused before any launch."""
    q = torch.zeros(300, 1, 128, dtype=torch.float16)
    offs = torch.tensor([0, 1, 2, 3, 4, 5, 6, 300], dtype=torch.int32)
    with pytest.raises(ValueError, match="lse_per_sequence needs sequences of one length: 300 query rows in 7"):
        fwd_sm90.forward(q, q, q, offs, offs, 294, left=-1, right=-1, scale=0.1, lse_per_sequence=True)


def test_forward_stores_a_per_sequence_lse_with_two_strides(monkeypatch) -> None:
    """``lse_per_sequence``: LSE ``[B, Hq, L]``, the kernel given (L, Hq) as its head and
    sequence-start strides (q_start = b L, so b Hq L + h L + row); otherwise ``[Hq, Tq]`` with
    (Tq, 1)."""
    fwd = _Launches(fwd_sm90._fwd_kernel)
    monkeypatch.setattr(fwd_sm90, "_fwd_kernel", fwd)
    monkeypatch.setattr(fwd_sm90, "num_workers", lambda device: 3)
    offs = torch.tensor([0, 50, 100, 150], dtype=torch.int32)
    q = torch.randn(150, 4, 64).to(torch.float16)
    kw = {"left": -1, "right": -1, "scale": 0.125}
    _, lse = fwd_sm90.forward(q, q, q, offs, offs, 50, lse_per_sequence=True, **kw)
    assert lse.shape == (3, 4, 50)
    _, lse_by_head = fwd_sm90.forward(q, q, q, offs, offs, 50, **kw)
    assert lse_by_head.shape == (4, 150)
    assert [(a["stride_lh"], a["stride_ls"]) for _, a in fwd.calls] == [(50, 4), (150, 1)]


def test_forward_refuses_a_config_that_does_not_fit_the_call() -> None:
    """A forced config whose fixed fields disagree with the call (head dim, mask) is refused
    before any launch, with every reason; the free fields (walk, tile hand-off) may differ."""
    import dataclasses

    q = torch.zeros(4, 1, 128, dtype=torch.float16)
    offs = torch.tensor([0, 4], dtype=torch.int32)
    want = tuning.fwd_config(head_dim=128, group=1, left=-1, right=-1, q_shared=False, scale=0.125, dynamic=True, zigzag=False, total_kv=4, batch=1)
    # (the ring turned off with the record it would hold: HOLD_RECORD alone needs the ring)
    bad = dataclasses.replace(want, HEAD_DIM=64, BOUNDED_RIGHT=True, RING_TILES=not want.RING_TILES, HOLD_RECORD=False)
    with pytest.raises(ValueError, match="HEAD_DIM=64, the call needs 128") as err:
        fwd_sm90.forward(q, q, q, offs, offs, 4, left=-1, right=-1, scale=0.125, config=bad)
    assert "BOUNDED_RIGHT=True, the call needs False" in str(err.value)
    assert "RING_TILES" not in str(err.value)


def test_forward_refuses_tma_o_without_stage_o() -> None:
    """``TMA_O`` stores O from the Q slot, which only ``STAGE_O`` writes O into: refused without
    it, accepted with it."""
    import dataclasses

    want = tuning.fwd_config(head_dim=128, group=1, left=-1, right=0, q_shared=False, scale=0.125, dynamic=True, zigzag=False, total_kv=1, batch=1, sparse=True)
    assert "needs STAGE_O" in " ".join(tuning.config_reasons(dataclasses.replace(want, STAGE_O=False, TMA_O=True), want, (128, 128)))
    assert not tuning.config_reasons(dataclasses.replace(want, STAGE_O=True, TMA_O=True), want, (128, 128))


def test_forward_refuses_ring_fields_without_the_ring() -> None:
    """``ZERO_EMPTY`` (the tile ring's producer skipping tiles) and ``HOLD_RECORD`` (its
    consumers keeping a record) are refused without the ring, every reason listed together with
    another field's."""
    import dataclasses

    want = tuning.fwd_config(head_dim=128, group=1, left=-1, right=0, q_shared=False, scale=0.125, dynamic=True, zigzag=False, total_kv=1, batch=1, sparse=True)
    bad = dataclasses.replace(want, RING_TILES=False, ZERO_EMPTY=True, HOLD_RECORD=True, STAGE_O=False, TMA_O=True)
    reasons = tuning.config_reasons(bad, want, (128, 128))
    assert any("ZERO_EMPTY" in r and "needs RING_TILES" in r for r in reasons)
    assert any("HOLD_RECORD" in r and "needs RING_TILES" in r for r in reasons)
    assert any("needs STAGE_O" in r for r in reasons)
    assert not tuning.config_reasons(dataclasses.replace(want, RING_TILES=True, ZERO_EMPTY=True, HOLD_RECORD=True), want, (128, 128))


def test_forward_solo_needs_the_held_record_and_no_zero_empty() -> None:
    """``SOLO``'s consumer re-reads each tile's record per half (``HOLD_RECORD``), and its
    producer has no ``ZERO_EMPTY`` path: refused without the one or with the other, accepted
    with the held record (the policy's with a block mask) and one Q tile."""
    import dataclasses

    want = tuning.fwd_config(head_dim=128, group=1, left=-1, right=0, q_shared=False, scale=0.125, dynamic=True, zigzag=False, total_kv=1, batch=1, sparse=True)
    assert want.HOLD_RECORD
    assert not want.SOLO
    for bad in (dataclasses.replace(want, SOLO=True, HOLD_RECORD=False), dataclasses.replace(want, SOLO=True, ZERO_EMPTY=True)):
        assert any(r.startswith("SOLO") for r in tuning.config_reasons(bad, want, (128, 128)))
    assert not tuning.config_reasons(dataclasses.replace(want, SOLO=True, Q_BUFS=1), want, (128, 128))


def test_forward_runs_solo_on_crowded_batches_of_short_kv(monkeypatch) -> None:
    """The policy's ``SOLO`` (``tuning.default_solo``): a batch of short K/V sequences (the tile
    ring) at D 128 whose plan holds a tile for each of two programs an SM runs one consumer
    warpgroup a program, one Q tile, twice the programs at 128 registers a thread; one sequence
    (too few tiles), D 64, long K/V, broadcast-Q and a block mask do not."""
    fwd = _Launches(fwd_sm90._fwd_kernel)
    monkeypatch.setattr(fwd_sm90, "_fwd_kernel", fwd)
    monkeypatch.setattr(fwd_sm90, "num_workers", lambda device: 3)
    kw = {"left": -1, "right": -1, "scale": 0.125}
    for lens, dim, solo in (((10,) * 8, 128, True), ((10,), 128, False), ((10,) * 8, 64, False), ((400,) * 8, 128, False)):
        offs = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        q = torch.randn(int(offs[-1]), 1, dim).to(torch.float16)
        plan, want = fwd_sm90.plan_and_config(q, q, offs, offs, max(lens), **kw)
        assert (want.SOLO, want.Q_BUFS == 1) == (solo, solo), (lens, dim)
        assert (plan.info.layout("fwd").rows >= 6) == (solo or dim == 64 or lens[0] == 400)
        fwd.calls.clear()
        fwd_sm90.forward(q, q, q, offs, offs, max(lens), **kw)
        (grid, args), = fwd.calls
        assert (args["SOLO"], args["maxnreg"]) == (solo, 128 if solo else None)
        assert grid == (min(6 if solo else 3, plan.info.layout("fwd").rows),)
    for extra in ({"q_shared": True}, {"sparse": True}):
        call = {"head_dim": 128, "group": 1, "left": -1, "right": -1, "q_shared": False, "scale": 0.1, "dynamic": True,
                "zigzag": False, "total_kv": 8, "batch": 8, "crowded": True}
        assert tuning.fwd_config(**call).SOLO
        assert not tuning.fwd_config(**{**call, **extra}).SOLO


def test_default_walk_is_the_slot_walk_only_on_a_static_plan_with_a_mask() -> None:
    """Measured (bench/NOTES.md, sessions 6 and 7): the head walk wins unmasked and on a dynamic
    plan; with a mask a static plan's zigzag deal needs the slot walk's cost order."""
    assert tuning.default_head_major(-1, -1, False)
    assert not tuning.default_head_major(-1, 0, False)
    assert not tuning.default_head_major(128, -1, False)
    assert not tuning.default_head_major(128, 0, False)
    for window in ((-1, -1), (-1, 0), (128, -1), (128, 0)):
        assert tuning.default_head_major(*window, True)


def test_default_schedules_are_dynamic_for_tlx_where_tile_costs_differ() -> None:
    """The TLX kernels get the atomic tile counter wherever tiles differ in cost, for the
    forward and for the one-pass backward (D 64 and 128, any mask); dense unmasked batches (equal
    costs) and the portable kernels keep the static defaults; explicit choices stand."""
    from jagflash.core.tuning import (
        DEFAULT_BACKWARD_SCHEDULE,
        DEFAULT_SCHEDULE,
        default_schedules,
        resolve_schedules,
    )

    static = (DEFAULT_SCHEDULE, DEFAULT_BACKWARD_SCHEDULE)
    assert default_schedules("tlx-sm90", 128) == ("dynamic", "dynamic")
    assert default_schedules("tlx-sm90", 128, window=(-1, 0)) == ("dynamic", "dynamic")
    assert default_schedules("tlx-sm90", 128, window=(-1, 0), equal_costs=True) == static
    assert default_schedules("tlx-sm90", 64) == ("dynamic", "dynamic")
    assert default_schedules("tlx-sm90", 64, window=(64, 0)) == ("dynamic", "dynamic")
    assert default_schedules("tlx-sm90", 128, window=(64, 0)) == ("dynamic", "dynamic")
    assert default_schedules("tlx-sm90", 128, window=(64, 0), deterministic=True) == ("dynamic", DEFAULT_BACKWARD_SCHEDULE)
    # a deterministic backward runs the two passes: its plan's backward passes keep batch order
    assert default_schedules("tlx-sm90", 128, deterministic=True) == ("dynamic", DEFAULT_BACKWARD_SCHEDULE)
    for backend in ("portable", "interpreter"):
        assert default_schedules(backend, 128) == static
    assert resolve_schedules("default", "default", "tlx-sm90", 128) == ("dynamic", "dynamic")
    assert resolve_schedules("static", None, "tlx-sm90", 128) == ("static", None)
    assert resolve_schedules("default", "none", "portable", 64) == static


def test_one_pass_takes_grouped_order_where_sequences_hold_few_kv_tiles() -> None:
    """``grouped=True`` (``tuning.grouped_backward``) gives the one-pass backward grouped's
    order from the atomic counter, and nothing else: not the forward, the two passes, equal
    costs or the portable kernels. The rule, on the batches it was measured on (132 SMs, 128-key
    kv-tiles, 16 K/V heads): the block-sparse lognormal batch (128 sequences, 106,387 keys)
    takes it, 4 sequences of 8,192 keys (1,024 kv-tiles each) do not; an empty batch does."""
    from jagflash.core.tuning import (
        DEFAULT_BACKWARD_SCHEDULE,
        DEFAULT_SCHEDULE,
        default_schedules,
        grouped_backward,
    )

    assert default_schedules("tlx-sm90", 128, window=(-1, 0), grouped=True) == ("dynamic", "dynamic-grouped")
    assert default_schedules("tlx-sm90", 64, grouped=True) == ("dynamic", "dynamic-grouped")
    assert default_schedules("tlx-sm90", 128, deterministic=True, grouped=True) == ("dynamic", DEFAULT_BACKWARD_SCHEDULE)
    assert default_schedules("tlx-sm90", 128, equal_costs=True, grouped=True) == (DEFAULT_SCHEDULE, DEFAULT_BACKWARD_SCHEDULE)
    assert default_schedules("portable", 128, grouped=True) == (DEFAULT_SCHEDULE, DEFAULT_BACKWARD_SCHEDULE)
    assert grouped_backward(106387, 128, 16, 128, 132)
    assert not grouped_backward(4 * 8192, 4, 16, 128, 132)
    assert grouped_backward(132 * 128, 1, 1, 128, 132)
    assert not grouped_backward(132 * 128 + 1, 1, 1, 128, 132)
    assert grouped_backward(0, 0, 16, 128, 132)


def _config_of(args: dict) -> tuning.FwdConfig:
    """The FwdConfig a recorded forward launch was given (its constexprs)."""
    return tuning.FwdConfig(**{name: args[name] for name in tuning.FwdConfig.__dataclass_fields__})


class _Launches:
    """Stands in for a TLX kernel: records each launch's arguments, bound to the kernel's own
    signature (a launch that passes an argument twice, or misses one, fails here, on the CPU,
    as it would in Triton's binder on the GPU)."""

    def __init__(self, kernel):
        import inspect

        self.signature = inspect.signature(kernel.fn)
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, num_warps, num_stages, maxnreg=None, **kwargs):
            bound = self.signature.bind(*args, **kwargs)
            self.calls.append((grid, {**bound.arguments, "maxnreg": maxnreg}))

        return launch


@pytest.mark.parametrize("schedule", ["grouped", "dynamic"])
def test_launches_bind_to_the_kernels_signatures(monkeypatch, schedule) -> None:
    """forward, backward (one pass) and backward_dkdv launch their kernels with every argument
    bound once; a dynamic plan hands each launch a zeroed int32 tile counter of its own, the others
    pass an unused tensor and DYNAMIC off; a forced config reaches the kernel as its constexprs
    (by default: the tile ring, as these K/V sequences average 100 keys, under one K/V tile, and
    ``SOLO`` with one Q tile on twice the programs, as the plan holds a tile for each; forced
    off, the ring takes ``SOLO`` with it)."""

    from jagflash.core.plan.build import make_plan

    fwd, dkdv = _Launches(fwd_sm90._fwd_kernel), _Launches(bwd_sm90._dkdv_kernel)
    monkeypatch.setattr(fwd_sm90, "_fwd_kernel", fwd)
    monkeypatch.setattr(bwd_sm90, "_dkdv_kernel", dkdv)
    monkeypatch.setattr(fwd_sm90, "num_workers", lambda device: 3)
    monkeypatch.setattr(bwd_sm90, "num_workers", lambda device: 3)
    offs = torch.tensor([0, 100, 100, 300], dtype=torch.int32)
    q = torch.randn(300, 2, 128).to(torch.float16)
    plan = make_plan(
        offs, offs, total_q=300, total_kv=300, heads_q=2, heads_kv=2, window=(-1, 0),
        block_m=128, block_n=128, dkdv_blocks=tuning.tlx_sm90_blocks(128)["dkdv"], backward=True,
        schedule=schedule,
    )
    kw = {"left": -1, "right": 0, "scale": 0.125, "plan": plan}
    _, lse = fwd_sm90.forward(q, q, q, offs, offs, 200, **kw)
    forced = tuning.forced_ring(_config_of(fwd.calls[0][1]), False)
    fwd_sm90.forward(q, q, q, offs, offs, 200, config=forced, **kw)
    assert [(a["Q_BUFS"], a["RING_TILES"], a["SOLO"]) for _, a in fwd.calls] == [(1, True, True), (1, False, False)]
    lse.zero_()
    bwd_sm90.backward(q, q, q, q, q, lse, offs, offs, **kw)
    bwd_sm90.backward_dkdv(q, q, q, q, lse, lse, offs, offs, **kw)
    calls = fwd.calls + dkdv.calls
    assert len(calls) == 4
    for grid, args in calls:
        assert grid == (6 if args.get("SOLO") else 3,)
        assert args["DYNAMIC"] is (schedule == "dynamic")
        if schedule == "dynamic":
            assert args["COUNTER"].dtype == torch.int32
            assert args["COUNTER"].tolist() == [0]
    if schedule == "dynamic":
        assert len({args["COUNTER"].data_ptr() for _, args in calls}) == 4


def test_tlx_plans_and_configs_take_64_masks_as_tiles(monkeypatch) -> None:
    """With a 64 x 64 mask the TLX plan tiles the forward by 128 x 128 (the dK/dV pass by its
    64-query steps, the portable dQ pass by the mask's blocks), costs the tiles by the tiled
    grid, and the launches get ``FINE`` with the tiled lists (their bits last); a 128 x 128 mask's
    do not."""
    from jagflash.core.block_mask import BlockMask
    from jagflash.core.block_tiles import tiled
    from jagflash.core.plan.build import make_plan
    from jagflash.core.tlx import bwd_sm90, fwd_sm90

    assert tuning.plan_blocks("tlx-sm90", 128, (64, 64)) == {"fwd": (128, 128), "dq": (64, 64), "dkdv": (64, 128)}
    assert tuning.plan_blocks("portable", 128, (64, 64)) == dict.fromkeys(("fwd", "dq", "dkdv"), (64, 64))
    fwd, dkdv = _Launches(fwd_sm90._fwd_kernel), _Launches(bwd_sm90._dkdv_kernel)
    monkeypatch.setattr(fwd_sm90, "_fwd_kernel", fwd)
    monkeypatch.setattr(bwd_sm90, "_dkdv_kernel", dkdv)
    monkeypatch.setattr(fwd_sm90, "num_workers", lambda device: 3)
    monkeypatch.setattr(bwd_sm90, "num_workers", lambda device: 3)
    lq, lk = (300, 90, 200), (260, 70, 500)
    offs_q, offs_k = (torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32) for x in (lq, lk))
    m = BlockMask.from_dense(torch.rand(3, 2, 5, 8, generator=torch.Generator().manual_seed(7)) < 0.4, offs_q, offs_k, (64, 64))
    q = torch.randn(sum(lq), 2, 128).to(torch.float16)
    k = torch.randn(sum(lk), 2, 128).to(torch.float16)
    kw = {"left": -1, "right": 0, "scale": 0.125}
    plan = make_plan(offs_q, offs_k, total_q=sum(lq), total_kv=sum(lk), heads_q=2, heads_kv=2, window=(-1, 0),
                     block_m=128, block_n=128, dq_blocks=(64, 64), dkdv_blocks=(64, 128),
                     schedule="dynamic", block_mask=m)
    coarse = make_plan(offs_q, offs_k, total_q=sum(lq), total_kv=sum(lk), heads_q=2, heads_kv=2, window=(-1, 0),
                       block_m=128, block_n=128, dq_blocks=(64, 64), dkdv_blocks=(64, 128), schedule="dynamic",
                       block_mask=tiled(m))
    assert torch.equal(plan.tiles, coarse.tiles)
    for given in (None, plan):
        fwd_sm90.forward(q, k, k, offs_q, offs_k, max(lq), blocks=m, plan=given, **kw)
        bwd_sm90.backward(q, q, k, k, q, torch.zeros(2, sum(lq)), offs_q, offs_k, blocks=m, plan=given, **kw)
    want = tiled(m).kernel_lists()
    for (_, args), lists in [(c, want[0]) for c in fwd.calls] + [(c, want[1]) for c in dkdv.calls]:
        assert args["SPARSE"]
        assert args["FINE"]
        assert len(args["lists"]) == 6
        for got, exp in zip(args["lists"], lists):
            assert torch.equal(got, exp) if isinstance(exp, torch.Tensor) else got == exp
    fwd.calls.clear()
    fwd_sm90.forward(q, k, k, offs_q, offs_k, max(lq), blocks=tiled(m), **kw)
    assert fwd.calls[0][1]["FINE"]
    plain = BlockMask.from_dense(torch.ones(3, 1, 3, 4, dtype=torch.bool), offs_q, offs_k, (128, 128))
    fwd.calls.clear()
    fwd_sm90.forward(q, k, k, offs_q, offs_k, max(lq), blocks=plain, **kw)
    assert not fwd.calls[0][1]["FINE"]
    assert len(fwd.calls[0][1]["lists"]) == 5
    good = tuning.fwd_config(head_dim=128, group=1, left=-1, right=0, q_shared=False, scale=0.1, dynamic=True,
                             zigzag=False, total_kv=1, batch=1, sparse=True, fine=True)
    assert good.FINE
    assert not tuning.config_reasons(good, good, (128, 128))
    bad = tuning.fwd_config(head_dim=128, group=1, left=-1, right=0, q_shared=False, scale=0.1, dynamic=True,
                            zigzag=False, total_kv=1, batch=1, sparse=False, fine=True)
    assert "FINE masks the steps of a block mask's tiles: it needs SPARSE" in tuning.config_reasons(bad, bad, (128, 128))


@pytest.mark.interpret
@pytest.mark.parametrize(("heads", "group", "slots"), [(8, 1, 5), (8, 4, 3), (16, 4, 1), (6, 2, 7)])
def test_head_walk_visits_every_table_row_once_kv_head_by_kv_head(heads, group, slots) -> None:
    """``seqlen.plan_row`` with ``HEAD_MAJOR``: the walk is a permutation of the table's rows (each slot
    holds its ``heads`` heads side by side), and runs one K/V head's GROUP query heads at a
    time, slot after slot (under the interpreter: it is plain Triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def walk(TILES, COUNT, OUT, heads, GROUP: tl.constexpr, N: tl.constexpr):
        count = tl.load(COUNT).to(tl.int32)
        for i in tl.static_range(N):
            _ok, b, h, _start = plan_row(i, TILES, count, heads, True, GROUP)
            tl.store(OUT + i * 2, b)
            tl.store(OUT + i * 2 + 1, h)

    count = slots * heads
    tiles = torch.tensor([[s, h, 0] for s in range(slots) for h in range(heads)], dtype=torch.int32)
    out = torch.full((count, 2), -1, dtype=torch.int32)
    walk[(1,)](tiles, torch.tensor([count], dtype=torch.int64), out, heads, GROUP=group, N=count)
    pairs = [tuple(p) for p in out.tolist()]
    assert sorted(pairs) == sorted((s, h) for s in range(slots) for h in range(heads))
    span = slots * group
    for n, (s, h) in enumerate(pairs):
        assert h // group == n // span  # one K/V head at a time
        assert s == (n % span) // group  # slot after slot, its GROUP query heads side by side



class _Passthrough(torch.overrides.TorchFunctionMode):
    """A torch function mode that changes nothing (as a tracer's or a mode's presence)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_packed_tiles_are_kept_per_offsets_and_follow_in_place_writes() -> None:
    """``vec_tile`` of jagged offsets (``bwd_preprocess.packed_tiles``) is made once per offsets
    tensor and version: equal to a fresh computation, the same tensor again for the same
    offsets, a fresh one for other offsets with other values, after an in-place write to the
    offsets, and for the same values in another tensor; none kept under a torch function mode."""
    pad = tuning.VEC_PAD
    bwd_preprocess.VEC_TILE_MEMO.clear()

    def want(offs):
        lens = (offs[1:] - offs[:-1]).tolist()
        return [0, *torch.tensor([-(-n // pad) for n in lens]).cumsum(0).tolist()]

    offs = torch.tensor([0, 3, 3 + pad, 3 + pad, 4 + 2 * pad], dtype=torch.int32)
    first = bwd_preprocess.packed_tiles(offs)
    assert first.dtype == torch.int32
    assert first.tolist() == want(offs)
    assert bwd_preprocess.packed_tiles(offs) is first
    other = torch.tensor([0, 1, 2 + pad], dtype=torch.int32)
    assert bwd_preprocess.packed_tiles(other).tolist() == want(other)
    offs[1:] += 1  # same storage, new version: a fresh vec_tile
    moved = bwd_preprocess.packed_tiles(offs)
    assert moved is not first
    assert moved.tolist() == want(offs)
    copy = offs.clone()
    assert bwd_preprocess.packed_tiles(copy) is not moved
    assert bwd_preprocess.packed_tiles(copy).tolist() == want(offs)
    with _Passthrough():
        assert bwd_preprocess.packed_tiles(offs) is not moved
    lse = torch.zeros(2, int(offs[-1]))
    assert bwd_preprocess.backward_vectors(lse, offs, delta=lse)[2] is moved


def test_three_kv_slots_only_on_causal_forwards_that_walk_without_the_ring() -> None:
    """``tuning.fwd_config``'s ring depths: three K/V slots and one Q tile on a causal band with
    no left bound, its tiles walked by each consumer (long K/V: no ring), O through the Q slot at
    D 128 only; two and two with the ring, a block mask, broadcast-Q, a window or no mask; a
    block mask on a causal band at D 128 stores O through the Q slot by TMA, its consumers
    holding their records, as every ring forward's do."""
    def depths(dim=128, left=-1, right=0, long_kv=True, **kw):
        cfg = tuning.fwd_config(
            head_dim=dim, group=1, left=left, right=right, q_shared=kw.get("q_shared", False), scale=1.0,
            dynamic=True, zigzag=False, total_kv=1 << 30 if long_kv else 1, batch=1, sparse=kw.get("sparse", False),
        )
        assert cfg.HOLD_RECORD == cfg.RING_TILES
        assert (cfg.STAGE_O and cfg.SPARSE) == cfg.TMA_O
        return cfg.NUM_KV, cfg.Q_BUFS, cfg.STAGE_O

    assert depths() == (3, 1, True)
    assert depths(dim=64) == (3, 1, False)
    assert depths(long_kv=False) == (2, 2, False)  # the tile ring
    assert depths(sparse=True) == (2, 2, True)
    assert depths(sparse=True, dim=64) == (2, 2, False)
    assert depths(sparse=True, right=-1) == (2, 2, False)  # (measured on causal masks only)
    assert depths(q_shared=True) == (2, 2, False)
    assert depths(left=256) == (2, 2, False)
    assert depths(right=-1) == (2, 2, False)



def test_forced_ring_turns_the_fields_that_ride_on_the_ring_with_it() -> None:
    """``tuning.forced_ring`` (tests and probes): off, the forward's ``HOLD_RECORD`` and
    ``ZERO_EMPTY`` and the backward's ``OWN_SPAN`` go with the ring, so the config is one the
    kernels accept; on, the forward holds its records as the policy does."""
    import dataclasses

    fwd = tuning.fwd_config(head_dim=128, group=1, left=-1, right=0, q_shared=False, scale=0.125, dynamic=True, zigzag=False, total_kv=1, batch=1, sparse=True)
    fwd = dataclasses.replace(fwd, ZERO_EMPTY=True)
    assert fwd.RING_TILES
    assert fwd.HOLD_RECORD
    off = tuning.forced_ring(fwd, False)
    assert (off.RING_TILES, off.HOLD_RECORD, off.ZERO_EMPTY) == (False, False, False)
    assert not tuning.config_reasons(off, fwd, (128, 128))
    on = tuning.forced_ring(off, True)
    assert (on.RING_TILES, on.HOLD_RECORD, on.ZERO_EMPTY) == (True, True, False)
    bwd = tuning.bwd_config(head_dim=128, group=1, left=-1, right=0, q_shared=False, fused_dq=True, dynamic=True, zigzag=False,
                            total_kv=1000, batch=8, sparse=True, grouped=True)
    assert bwd.RING_TILES
    assert bwd.OWN_SPAN > 0
    off = tuning.forced_ring(bwd, False)
    assert (off.RING_TILES, off.OWN_SPAN, off.ZERO_EMPTY) == (False, 0, False)
    assert not tuning.config_reasons(off, bwd, (bwd.BLOCK_M, bwd.BLOCK_N))
    assert tuning.forced_ring(bwd, True) == bwd


@pytest.mark.parametrize("bounds", [(-1, -1), (-1, 0), (100, 0)], ids=["none", "causal", "window"])
@pytest.mark.parametrize("schedule", ["dynamic", "dynamic-grouped"])
def test_dq_cell_counts_count_every_kv_tile_that_adds_into_a_cell(bounds, schedule) -> None:
    """``SOLE_DQ``'s counts (a plain Triton kernel: runs under the interpreter): a dQ cell (a
    64-query step of the packed vector rows, one query head) counts one add per kv-tile whose
    q-range (``mask.dkdv_q_ranges``, brute force per sequence here) holds the step (two a
    kv-tile in the sequences the policy owns on dynamic-grouped tables); GQA
    (two query heads a K/V head), queries without keys and keys without queries, lengths around
    the tiles. The preprocess then writes the dQ zeros of the cells no kv-tile visits and leaves
    the others (NaN-poisoned) to the kernel."""
    from jagflash.core.mask import dkdv_q_ranges

    left, right = bounds
    q_lens, k_lens, hq, qo, ko, plan, config = _cells_batch(bounds, schedule)
    tq, dim = int(qo[-1]), 128
    lse = torch.zeros(hq, tq)
    counts = bwd_preprocess.dq_cell_counts(plan, lse, qo, ko, heads_q=hq, left=left, right=right, config=config)
    vec_tile, _ = bwd_preprocess.vector_tiles(lse, qo)
    want = torch.zeros_like(counts)
    for b, (lq, lk) in enumerate(zip(q_lens, k_lens, strict=True)):
        for n0 in range(0, lk, 128):
            lo, _, _, hi = (int(x) for x in dkdv_q_ranges(n0, lq, lk, 64, 128, left, right))
            for m0 in range(lo, hi, 64):
                want[int(vec_tile[b]) + m0 // 64, 0:CELL * hq:CELL] += (2 if lk <= config.OWN_SPAN else 1) + (m0 + 64 > lq)  # (owned: 2 a kv-tile; a tail cell: 1 more)
    assert want.any()
    assert torch.equal(counts, want)
    acc = torch.zeros(tq, hq * dim)
    out, dout = torch.randn(tq, hq, dim), torch.randn(tq, hq, dim)
    dq = torch.full((tq, hq, dim), float("nan"))
    bwd_preprocess.backward_vectors(lse, qo, out=out, dout=dout, dq_acc=acc, cells=(counts, dq))
    adds = _cell_adds(counts, vec_tile, q_lens, qo, hq)
    visited = adds > 0
    assert visited.any()
    assert torch.isnan(dq[visited]).all()
    assert torch.equal(dq[~visited], torch.zeros_like(dq[~visited]))


def _cells_batch(bounds, schedule, hq=4, hkv=2):
    """The dQ cell tests' batch (GQA: 4 query heads, 2 K/V heads, D 128; queries without keys and
    keys without queries, lengths around the tiles) and its one-pass backward plan and policy
    config: ``(q_lens, k_lens, hq, q_offsets, kv_offsets, plan, config)``."""
    from jagflash.core.plan.build import make_plan

    q_lens = [5, 300, 0, 64, 257, 9, 40, 130]
    k_lens = [256, 300, 7, 0, 10, 257, 1, 129]
    dim = 128
    qo = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    ko = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32)
    tq, tk = int(qo[-1]), int(ko[-1])
    q, k = torch.zeros(tq, hq, dim, dtype=torch.float16), torch.zeros(tk, hkv, dim, dtype=torch.float16)
    plan = make_plan(
        qo, ko, total_q=tq, total_kv=tk, heads_q=hq, heads_kv=hkv, window=bounds, block_m=128, block_n=128,
        dkdv_blocks=(64, 128), backward=True, schedule="dynamic", backward_schedule=schedule,
    )
    config = bwd_sm90.dkdv_config(plan, q, k, left=bounds[0], right=bounds[1], q_shared=False, fused_dq=True)
    return q_lens, k_lens, hq, qo, ko, plan, config


def _cell_adds(counts, vec_tile, q_lens, qo, hq) -> torch.Tensor:
    """``[Tq, Hq]``: each query row's dQ cell count (``dq_cell_counts``')."""
    adds = torch.zeros(int(qo[-1]), hq, dtype=torch.int32)
    for b, lq in enumerate(q_lens):
        for m0 in range(0, lq, 64):
            adds[int(qo[b]) + m0:int(qo[b]) + min(m0 + 64, lq)] = counts[int(vec_tile[b]) + m0 // 64, 0:CELL * hq:CELL]
    return adds


@pytest.mark.parametrize("heads", [(4, 2), (3, 1)], ids=["gqa2", "odd_heads"])
@pytest.mark.parametrize("own", [False, True], ids=["unowned", "owned"])
def test_sole_dq_passes_leave_the_kernel_its_one_add_cells(own, heads) -> None:
    """``SOLE_DQ`` (the kernel writes the dQ of the cells one kv-tile adds into): the preprocess
    zeroes the accumulator of the cells of two adds or more only, writes the dQ zeros of those
    of none, and the cast writes dQ = scale x the accumulator in the cells of two adds or more
    only, but the sequences the kernel owns (their cells count two a kv-tile, so none is
    written by a step alone; the owner writes their rows). Everything else keeps its NaN poison.
    Delta is rowsum(dO O) where a step reads it, 0 in the cells of none. Causal, GQA, an odd head count, lengths around
    the tiles, queries without keys (plain Triton kernels: the
    interpreter)."""
    import dataclasses

    q_lens, k_lens, hq, qo, ko, plan, config = _cells_batch((-1, 0), "dynamic-grouped", *heads)
    tq, dim = int(qo[-1]), 128
    config = dataclasses.replace(config, SOLE_DQ=True, OWN_SPAN=256 if own else 0, RING_TILES=True)
    lse = torch.zeros(hq, tq)
    counts = bwd_preprocess.dq_cell_counts(plan, lse, qo, ko, heads_q=hq, left=-1, right=0, config=config)
    vec_tile, _ = bwd_preprocess.vector_tiles(lse, qo)
    adds = _cell_adds(counts, vec_tile, q_lens, qo, hq)
    owned = torch.repeat_interleave(torch.tensor([0 < n <= 256 and own for n in k_lens]), torch.tensor(q_lens))[:, None].expand(tq, hq)
    assert ((adds == 1) & ~owned).any()
    assert (adds > 1).any()
    assert (adds == 0).any()
    assert not ((adds == 1) & owned).any()
    if own:
        assert (owned & (adds > 1)).any()
    acc = torch.full((tq, hq * dim), float("nan"))
    out, dout = torch.randn(tq, hq, dim), torch.randn(tq, hq, dim)
    dq = torch.full((tq, hq, dim), float("nan"))
    span = (ko, config.OWN_SPAN) if own else None
    _, delta, _ = bwd_preprocess.backward_vectors(lse, qo, out=out, dout=dout, dq_acc=acc, owned=span, cells=(counts, dq))
    rows = torch.cat([int(vec_tile[b]) * tuning.VEC_PAD + torch.arange(lq) for b, lq in enumerate(q_lens)])
    want = torch.where(adds > 0, (out.double() * dout.double()).sum(-1), 0.0).T  # (a cell no step visits: delta 0, O and dO unread)
    torch.testing.assert_close(delta[:, rows].double(), want, rtol=1e-5, atol=1e-4)
    summed = (adds > 1) & ~owned
    acc3 = acc.view(tq, hq, dim)
    assert torch.equal(acc3[summed], torch.zeros_like(acc3[summed]))
    assert torch.isnan(acc3[~summed]).all()
    assert torch.equal(dq[adds == 0], torch.zeros_like(dq[adds == 0]))
    assert torch.isnan(dq[adds > 0]).all()
    acc.copy_(torch.randn(tq, hq * dim))
    bwd_preprocess.scaled_cast(acc, 0.5, dq, None if span is None else (qo, *span), (counts, vec_tile, qo))
    assert torch.equal(dq[summed], (acc3[summed] * 0.5).to(dq.dtype))
    assert torch.isnan(dq[(adds > 0) & ~summed]).all()


def test_sole_dq_is_refused_where_the_kernel_cannot_count_cells() -> None:
    """``SOLE_DQ`` needs the one pass, no broadcast-Q and 64-column dQ halves at D 128; a config
    that asks for it elsewhere is refused with every reason. The policy takes it with a block
    mask over short K/V sequences only (``tuning.SOLE_MEAN_KV``)."""
    import dataclasses

    call = {"group": 1, "left": -1, "right": 0, "dynamic": True, "zigzag": False, "total_kv": 1 << 20, "batch": 2}
    want = tuning.bwd_config(head_dim=64, q_shared=True, fused_dq=False, **call)
    reasons = " ".join(tuning.config_reasons(dataclasses.replace(want, SOLE_DQ=True), want, (want.BLOCK_M, want.BLOCK_N)))
    for why in ("needs the one pass", "is not for broadcast-Q", "needs 64-column dQ halves"):
        assert f"SOLE_DQ {why}" in reasons
    fit = tuning.bwd_config(head_dim=128, q_shared=False, fused_dq=True, **call)
    assert not fit.SOLE_DQ
    assert not tuning.config_reasons(dataclasses.replace(fit, SOLE_DQ=True), fit, (fit.BLOCK_M, fit.BLOCK_N))
    short = {**call, "total_kv": tuning.SOLE_MEAN_KV * 8, "batch": 8}
    assert tuning.bwd_config(head_dim=128, q_shared=False, fused_dq=True, sparse=True, **short).SOLE_DQ
    assert not tuning.bwd_config(head_dim=128, q_shared=False, fused_dq=True, sparse=False, **short).SOLE_DQ
    assert not tuning.bwd_config(head_dim=128, q_shared=False, fused_dq=True, sparse=True, **call).SOLE_DQ
