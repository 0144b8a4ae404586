"""Probe (one GPU; issue 22): what allocating a BlockMask's four lists costs the host, the
question behind ``jagflash.core.mask_mod_kernel._lists`` (session 23, call 2: four
``torch.empty`` 18.8-19.7 us, one and four ``as_strided`` views 15.8-17.6 us on the H200's host).

    python bench/probes/alloc_lists.py                  # B 64, one head, 16 x 16 blocks
    python bench/probes/alloc_lists.py --batch 128 --blocks 32

For each way of making the lists (kv counts ``[B, H, nq]``, kv indices ``[B, H, nq, nk]``, q
counts ``[B, H, nk]``, q indices ``[B, H, nk, nq]``, int32) it prints the least, over 10 rounds,
of the mean host time of 2,000 calls issued without a sync: four ``torch.empty``; the builder's
own ``_lists`` (one ``torch.empty`` and four ``as_strided`` views; call 2 timed the same views
without the 128-byte rounding of their starts); one and ``split_with_sizes`` + four ``view``;
one ``torch.empty`` alone; and Triton's current device and stream lookups (a direct launch's).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=16, help="nq = nk")
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("alloc_lists: needs a CUDA device", file=sys.stderr)
        return 2
    from triton.runtime import driver

    from jagflash.core.mask_mod_kernel import _lists

    dev = torch.device("cuda")
    b, h, nq, nk = a.batch, a.heads, a.blocks, a.blocks
    n1, n2, n3, n4 = b * h * nq, b * h * nq * nk, b * h * nk, b * h * nk * nq

    def four_empties():
        return (torch.empty(b, h, nq, dtype=torch.int32, device=dev), torch.empty(b, h, nq, nk, dtype=torch.int32, device=dev),
                torch.empty(b, h, nk, dtype=torch.int32, device=dev), torch.empty(b, h, nk, nq, dtype=torch.int32, device=dev))

    def one_and_views():  # what the builder does
        return _lists(b, h, nq, nk, dev)

    def one_and_split():
        x1, x2, x3, x4 = torch.empty(n1 + n2 + n3 + n4, dtype=torch.int32, device=dev).split_with_sizes([n1, n2, n3, n4])
        return x1.view(b, h, nq), x2.view(b, h, nq, nk), x3.view(b, h, nk), x4.view(b, h, nk, nq)

    def one_empty():
        return torch.empty(n1 + n2 + n3 + n4, dtype=torch.int32, device=dev)

    def stream_lookup():
        return driver.active.get_current_stream(driver.active.get_current_device())

    for fn in (four_empties, one_and_views, one_and_split, one_empty, stream_lookup):
        best = float("inf")
        for _ in range(10):
            t0 = time.perf_counter()
            for _ in range(a.calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / a.calls * 1e6)
        torch.cuda.synchronize()
        print(f"alloc_lists {fn.__name__}: {best:.2f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
