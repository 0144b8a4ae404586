"""jagflash.testing.distributed.run_ranks: results come back per rank, a failing rank fails the
call with its error while the others wait in a collective, and a hang ends in TimeoutError."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from jagflash.testing.distributed import RankFailed, run_ranks


def sum_worker(rank: int, world: int, base: float) -> torch.Tensor:
    t = torch.tensor([base + rank])
    dist.all_reduce(t)
    return t


def fail_worker(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 gives up")
    dist.barrier()  # rank 0 waits here for a rank that never comes


def hang_worker(rank: int, world: int) -> None:
    time.sleep(600)


def test_run_ranks_returns_every_rank_and_reports_a_failing_one() -> None:
    assert [t.item() for t in run_ranks(sum_worker, 2, 10.0, timeout=60)] == [21.0, 21.0]
    with pytest.raises(RankFailed) as err:
        run_ranks(fail_worker, 2, timeout=60)
    first = str(err.value).split("--- ")[1]
    assert first.startswith("rank1 (+0.0 s)")
    assert "ValueError: rank 1 gives up" in first


def test_run_ranks_kills_a_hang() -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="hang_worker on 1 ranks did not finish in 12 s"):
        run_ranks(hang_worker, 1, timeout=12)
    assert time.monotonic() - start < 40
