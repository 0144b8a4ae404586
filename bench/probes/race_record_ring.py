"""Minimal TLX kernels for compute-sanitizer's racecheck: is the record ring's hand-off
(``jagflash.core.tlx.pipeline.record_publish`` / ``record_take``) a race, and is the hazard it
reports at a kernel's first line Triton's warp-specialisation machinery?

Each kernel has the kernels' roles (a producer warpgroup, two consumer warpgroups,
``replicate=2``) and passes ROUNDS records of two int32 fields through a ring of two slots; the
consumers check every value (a wrong one is counted in ``BAD``):

- ``ring``: the ring as the kernels use it (every producer thread stores, the warpgroup syncs,
  one thread arrives; each consumer warpgroup loads, syncs and one thread arrives on the empty
  barrier);
- ``warp``: the same ring on warp barriers, where every thread arrives itself (its own accesses
  then release to the other side without a warpgroup sync in between);
- ``empty``: the three roles and nothing else (no shared memory of ours at all).

    python bench/probes/race_record_ring.py                       # run each once, check values
    compute-sanitizer --tool racecheck python bench/probes/race_record_ring.py --kernel ring
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

ROUNDS = 64


def _kernels():
    import triton.language.extra.tlx as tlx

    from jagflash.core.tlx.pipeline import record_publish, record_take, ring_slot

    @triton.jit
    def ring_kernel(BAD, ROUNDS: tl.constexpr):
        fields = tlx.local_alloc((1,), tl.int32, 2 * 2)
        fulls = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
        empties = tlx.alloc_barriers(num_barriers=2, arrive_count=2)
        with tlx.async_tasks():
            with tlx.async_task("default", registers=24):
                for r in range(ROUNDS):
                    record_publish(fields, fulls, empties, r, (r, 3 * r + 1), 2)
            with tlx.async_task(num_warps=4, registers=240, replicate=2):
                bad = 0
                for r in range(ROUNDS):
                    a, b = record_take(fields, fulls, empties, r, 2, 2)
                    bad += ((a != r) | (b != 3 * r + 1)).to(tl.int32)
                tl.atomic_add(BAD, bad)

    @triton.jit
    def warp_kernel(BAD, ROUNDS: tl.constexpr):
        fields = tlx.local_alloc((1,), tl.int32, 2 * 2)
        fulls = tlx.alloc_warp_barrier(num_barriers=2, num_warps=4)
        empties = tlx.alloc_warp_barrier(num_barriers=2, num_warps=8)
        with tlx.async_tasks():
            with tlx.async_task("default", registers=24):
                for r in range(ROUNDS):
                    slot, phase = ring_slot(r, 2)
                    tlx.barrier_wait(empties[slot], phase ^ 1)
                    tlx.local_store(fields[slot * 2], tl.full([1], r, tl.int32))
                    tlx.local_store(fields[slot * 2 + 1], tl.full([1], 3 * r + 1, tl.int32))
                    tlx.barrier_arrive(fulls[slot], 1)
            with tlx.async_task(num_warps=4, registers=240, replicate=2):
                bad = 0
                for r in range(ROUNDS):
                    slot, phase = ring_slot(r, 2)
                    tlx.barrier_wait(fulls[slot], phase)
                    a = tl.sum(tlx.local_load(fields[slot * 2]), 0)
                    b = tl.sum(tlx.local_load(fields[slot * 2 + 1]), 0)
                    tlx.barrier_arrive(empties[slot], 1)
                    bad += ((a != r) | (b != 3 * r + 1)).to(tl.int32)
                tl.atomic_add(BAD, bad)

    @triton.jit
    def empty_kernel(BAD, ROUNDS: tl.constexpr):
        with tlx.async_tasks():
            with tlx.async_task("default", registers=24):
                tl.atomic_add(BAD, 0)
            with tlx.async_task(num_warps=4, registers=240, replicate=2):
                tl.atomic_add(BAD, 0)

    return {"ring": ring_kernel, "warp": warp_kernel, "empty": empty_kernel}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", choices=("ring", "warp", "empty", "all"), default="all")
    args = parser.parse_args(argv)
    kernels = _kernels()
    names = list(kernels) if args.kernel == "all" else [args.kernel]
    failed = 0
    for name in names:
        bad = torch.zeros(1, dtype=torch.int32, device="cuda")
        kernels[name][(1,)](bad, ROUNDS=ROUNDS, num_warps=4)
        torch.cuda.synchronize()
        print(f"{name}: {int(bad)} wrong values of {2 * 128 * ROUNDS if name != 'empty' else 0}")
        failed += int(bad) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
