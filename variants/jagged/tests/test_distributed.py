"""Data parallel training of a jagged block: DDP and FSDP2 (``fully_shard``) on 2 and 4 gloo
ranks, eager and under ``torch.compile``, give after a few SGD steps the parameters of one
process trained on the concatenated batch (the fp64 reference, by the tolerance rule)."""

from __future__ import annotations

import itertools

import pytest
import torch

from jagflash.core.reference import attention_reference
from jagflash.testing import assert_close_all
from jagflash.testing.distributed import run_ranks
from jagflash.variants.jagged import SPEC
from jagflash.variants.jagged.block import JaggedBlock

DIM, HEADS, KV_HEADS = 32, 2, 1
LR = 0.5
# Per step, the global batch's sequence lengths (zero-length and one-token ones among them);
# rank r of W takes the r-th of W equal runs of sequences, so the ranks' batches concatenated
# in rank order are the global batch. Each rank's row count is the same at every step, so a
# compiled block is not compiled again for new shapes.
STEPS = ((6, 0, 9, 1, 4, 7, 2, 5), (0, 6, 1, 9, 7, 4, 5, 2))
# (wrapper, torch.compile) per world size: compiled on 2 ranks only (compiling on 4 processes
# over CI's 2 cores costs more than the rest of the test).
MODES = {2: [("ddp", False), ("fsdp2", False), ("ddp", True), ("fsdp2", True)], 4: [("ddp", False), ("fsdp2", False)]}


def _offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def _batch(step: int, lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step: inputs and the target the loss pairs them with."""
    gen = torch.Generator().manual_seed(100 + step)
    t = sum(lengths)
    return torch.randn(t, DIM, generator=gen), torch.randn(t, DIM, generator=gen)


def _block(**kw) -> JaggedBlock:
    torch.manual_seed(0)
    return JaggedBlock(DIM, HEADS, KV_HEADS, mlp_ratio=2, **kw)


def _loss(block, x, target, offsets, scale: float) -> torch.Tensor:
    return (block(x, offsets) * target).sum() * scale


def train_worker(rank: int, world: int, modes) -> dict | None:
    """Each mode: a fresh block wrapped in DDP or FSDP2 (every Linear and the block sharded),
    maybe compiled, trained for len(STEPS) SGD steps on this rank's share of each
    batch; rank 0 returns the full parameters per mode."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    results = {}
    for wrapper, compiled in modes:
        block = _block()
        if wrapper == "ddp":
            model = DistributedDataParallel(block)
        else:
            mesh = init_device_mesh("cpu", (world,))
            for m in block.modules():
                if isinstance(m, torch.nn.Linear):
                    fully_shard(m, mesh=mesh)
            model = fully_shard(block, mesh=mesh)
        if compiled:  # inductor (C++ on the CPU) under DDP; aot_eager under FSDP2 (cheaper)
            model = torch.compile(model, backend="inductor" if wrapper == "ddp" else "aot_eager")
        opt = torch.optim.SGD(block.parameters(), lr=LR)
        for step, lengths in enumerate(STEPS):
            x, target = _batch(step, lengths)
            per = len(lengths) // world
            offs = _offsets(lengths).tolist()
            lo, hi = offs[rank * per], offs[(rank + 1) * per]
            local = _offsets(lengths[rank * per : (rank + 1) * per])
            # DDP and FSDP2 average the ranks' gradients: scale by world / T for the global mean
            loss = _loss(model, x[lo:hi], target[lo:hi], local, world / offs[-1])
            opt.zero_grad()
            loss.backward()
            opt.step()
        params = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in block.named_parameters()}
        results[f"{wrapper}{'+compile' if compiled else ''}"] = params
    return results if rank == 0 else None


def _reference_training(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One process, the concatenated batches, the reference attention computed in ``dtype``."""
    block = _block(
        attention=lambda q, k, v, qo, ko, *, causal, **_: attention_reference(q, k, v, qo, ko, causal=causal, compute_dtype=dtype)[0]
    ).to(dtype)
    opt = torch.optim.SGD(block.parameters(), lr=LR)
    for step, lengths in enumerate(STEPS):
        x, target = _batch(step, lengths)
        loss = _loss(block, x.to(dtype), target.to(dtype), _offsets(lengths), 1 / sum(lengths))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {n: p.detach() for n, p in block.named_parameters()}


@pytest.mark.interpret
@pytest.mark.parametrize("world", sorted(MODES))
def test_data_parallel_training_equals_one_process(world: int) -> None:
    """Parameters after the steps on ``world`` ranks (the jagged kernels under the
    interpreter) against one process's in fp64, within 2x fp32's own error + atol; and the
    steps moved every parameter by far more than that bound (the comparison can fail)."""
    got = run_ranks(train_worker, world, MODES[world], timeout=300)[0]
    ref, low = _reference_training(torch.float64), _reference_training(torch.float32)
    init = dict(_block().named_parameters())
    names = sorted(ref)
    for n in names:
        moved = (ref[n] - init[n].double()).abs().max().item()
        assert moved > 1e-3, f"{n} moved only {moved:.1e}: the test would not see a wrong gradient"
    for mode, params in got.items():
        assert_close_all(
            [f"{mode} {n}" for n in names], [params[n] for n in names], [ref[n] for n in names],
            [low[n] for n in names], SPEC.atol[torch.float32],
        )
