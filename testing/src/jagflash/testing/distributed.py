"""Run a function on several ranks of a fresh ``torch.distributed`` process group, from a test.

:func:`run_ranks` spawns ``world`` processes (``torch.multiprocessing``, start method
``spawn``), each of which joins a gloo group on a free local port, calls the worker with its
rank and returns what it returned. A rank that raises fails the call with
:class:`RankFailed`, which holds every failing rank's traceback, the first to fail first; ranks
that have not finished after ``timeout`` seconds are killed and the call raises
:class:`TimeoutError`, so a hang fails a test instead of blocking CI. The environment
(``TRITON_INTERPRET`` among it) is inherited by the children, and their kernel outputs are
NaN-poisoned (``jagflash.core.ops.poison_outputs``) as in the test's process.

The worker is found again in the child by its file and name: a module-level function of a
test file (pytest's ``--import-mode=importlib`` leaves test modules unimportable by name).
"""

from __future__ import annotations

import datetime
import importlib.util
import inspect
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["RankFailed", "free_port", "run_ranks"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load(path: str, name: str) -> Callable[..., Any]:
    module = sys.modules.get(f"_jagflash_rank_{Path(path).stem}")
    if module is None:
        spec = importlib.util.spec_from_file_location(f"_jagflash_rank_{Path(path).stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return getattr(module, name)


def _child(rank: int, world: int, port: int, path: str, name: str, args: tuple, out_dir: str, timeout: float) -> None:
    from jagflash.core.ops import poison_outputs

    torch.set_num_threads(1)  # ranks share the machine's cores
    poison_outputs(True)  # as the pytest plugin does in the test's own process
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=timeout),
    )
    try:
        result = _load(path, name)(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as fh:
            fh.write(f"{time.time()}\n{traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()


class RankFailed(RuntimeError):
    """Ranks of :func:`run_ranks` raised: every rank's traceback, the first to fail first (the
    others mostly fail because it left their collectives)."""


def _failures(out_dir: str) -> str:
    found = []
    for f in Path(out_dir).glob("rank*.err"):
        stamp, _, tb = f.read_text().partition("\n")
        found.append((float(stamp), f.stem, tb))
    found.sort()
    return "\n".join(f"--- {who} (+{t - found[0][0]:.1f} s):\n{tb}" for t, who, tb in found)


def run_ranks(worker: Callable[..., Any], world: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    """``[worker(rank, world, *args) for rank in range(world)]``, each rank in its own process
    of one gloo process group (CPU tensors; results travel by ``torch.save``).

    ``worker`` must be a module-level function of an importable file; ``args`` must pickle.
    Raises :class:`RankFailed` with every failing rank's traceback, the first to fail first, or
    :class:`TimeoutError` after ``timeout`` seconds, with every child killed either way."""
    path, name = inspect.getfile(worker), worker.__name__
    with tempfile.TemporaryDirectory(prefix="jagflash-ranks-") as out_dir:
        ctx = mp.start_processes(
            _child, args=(world, free_port(), path, name, args, out_dir, timeout), nprocs=world,
            join=False, start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} on {world} ranks did not finish in {timeout:.0f} s")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            # the rank join saw wrote its file before it exited; ranks killed since wrote none
            raise RankFailed(f"{name} on {world} ranks failed:\n{_failures(out_dir) or e}") from e
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join()
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]
