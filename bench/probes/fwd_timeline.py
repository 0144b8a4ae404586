"""Probe (H200; issue 22): where a TLX forward tile's time goes, from per-tile clock stamps.

Needs the timeline build of the forward: ``git apply bench/probes/fwd_timeline.patch`` on the
device copy (the patch adds ``forward(timeline=...)`` and a clock stamp at each phase of every
role; it is never applied to the library; it was written against 54b8e46's forward and no longer
applies to later trees, whose forward moved on (session 38 split it into fwd_sm90 / fwd_tiles /
fwd_mainloop): rebase it there first, or apply it to a ``git archive 54b8e46`` copy). Then

    python bench/probes/fwd_timeline.py --workloads bs-lognormal-d25,bs-dense8k-d25

For each workload (its batch and block mask as the bench builds them, the policy's plan and
config): the forward's median with and without the stamps (what they cost), then one stamped
run. Each program's producer and consumer warpgroups write ``%clock64`` (the SM's cycle
counter, so stamps of one program compare) at the events below, per tile (record) ``j``:

- consumer: 0 top of the round, 1 record taken, 2 Q landed, 3 first K landed, 4 first QK^T
  done, 5 last P V done (``attend`` returned), 6 O and LSE stored; 7 the tile's block count;
- producer: 0 top of the round, 1 Q issued (after its slot freed), 2 the first K/V issued,
  3 next tile claimed, 4 next tile decoded and published, 5 the tile's other blocks issued;
  7 the block count.

Printed: per block count (of the tile), the tiles and the mean microseconds of each consumer
phase and of the producer's, the lead of each load (issued to landed), and over the whole
run the share of consumer warpgroup 0's time in each phase. Cycles become microseconds at the
clock the stamps imply (the longest program's span over the kernel's time).
"""

from __future__ import annotations

import argparse
import functools

import torch

C_NAMES = ("record", "Q wait", "K wait", "1st QK", "rest", "epilogue", "next")
P_NAMES = ("Q slot", "K/V slot", "claim", "publish", "rest")
MAXT = 512
#: The batches stamped by default: short sparse tiles, long sparse tiles, short dense K/V.
DEFAULT_WORKLOADS = ("bs-lognormal-d25", "bs-dense8k-d25", "jagged-tiny-d128")


def _bucket(n: int) -> str:
    if n <= 0:
        return "0"
    if n <= 3:
        return str(n)
    if n <= 7:
        return "4-7"
    return "8+"


def analyse(name: str, tl: torch.Tensor, kernel_ms: float) -> None:
    """Print the tables of one stamped run (``tl`` ``[programs, 3, MAXT, 8]`` int64, -1 unset)."""
    t = tl.cpu().to(torch.int64)
    programs = t.shape[0]
    spans = []
    for p in range(programs):
        ev = t[p, 1:3, :, :7]
        ok = ev[ev >= 0]
        if ok.numel():
            spans.append(int(ok.max() - ok.min()))
    ghz = max(spans) / (kernel_ms * 1e6) if spans else 1.0
    us = 1.0 / (ghz * 1e3)
    print(f"# {name}: {programs} programs, clock {ghz:.2f} GHz (longest span {max(spans) * us:.1f} us, kernel {kernel_ms * 1e3:.1f} us)")
    rows: dict[str, list[list[float]]] = {}
    share = [0.0] * len(C_NAMES)
    for p in range(programs):
        c = t[p, 1]
        pr = t[p, 0]
        n_rec = int((c[:, 0] >= 0).sum())
        for j in range(n_rec):
            e = c[j]
            nb = int(e[7])
            if e[1] < 0:
                continue
            nxt = int(c[j + 1, 0]) if j + 1 < MAXT and c[j + 1, 0] >= 0 else -1
            if e[2] < 0:  # not live (a table row with no tile, or the walk's end)
                continue
            phases = [
                e[1] - e[0], e[2] - e[1],
                (e[3] - e[2]) if e[3] >= 0 else 0,
                (e[4] - e[3]) if e[4] >= 0 else 0,
                (e[5] - (e[4] if e[4] >= 0 else e[2])) if e[5] >= 0 else 0,
                (e[6] - (e[5] if e[5] >= 0 else e[2])) if e[6] >= 0 else 0,
                (nxt - e[6]) if (nxt >= 0 and e[6] >= 0) else 0,
            ]
            for k_, v_ in enumerate(phases):
                share[k_] += float(v_)
            lead_q = lead_k = float("nan")
            pe = pr[j] if j < MAXT else None
            if pe is not None and pe[1] >= 0 and e[2] >= 0:
                lead_q = float(e[2] - pe[1])
            if pe is not None and pe[2] >= 0 and e[3] >= 0:
                lead_k = float(e[3] - pe[2])
            prod = [float("nan")] * len(P_NAMES)
            if pe is not None and pe[0] >= 0:
                marks = [int(x) for x in pe[:6]]
                last = marks[0]
                for k_ in range(1, 6):
                    if marks[k_] >= 0:
                        prod[k_ - 1] = float(marks[k_] - last)
                        last = marks[k_]
            rows.setdefault(_bucket(nb), []).append([*map(float, phases), lead_q, lead_k, *prod])
    cols = [*C_NAMES, "Q lead", "K lead", *("p:" + x for x in P_NAMES)]
    print(f"# {name}: consumer warpgroup 0, mean us a tile by block count (leads: issued -> landed)")
    print("blocks,tiles," + ",".join(cols))
    for key in ("0", "1", "2", "3", "4-7", "8+"):
        if key not in rows:
            continue
        data = torch.tensor(rows[key], dtype=torch.float64)
        means = [torch.nanmean(data[:, i]).item() * us for i in range(data.shape[1])]
        print(f"{key},{data.shape[0]}," + ",".join(f"{m:.2f}" for m in means))
    total = sum(share)
    print(f"# {name}: share of consumer warpgroup 0's stamped time: "
          + ", ".join(f"{n} {100 * s / total:.1f}%" for n, s in zip(C_NAMES, share)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    a = ap.parse_args()

    from jagflash.bench.data import make_batch
    from jagflash.bench.sparsity import make_block_mask
    from jagflash.bench.timing import measure
    from jagflash.bench.workloads import get
    from jagflash.core.tlx import fwd_sm90
    from jagflash.core.tlx.descriptors import num_workers

    dev = torch.device("cuda")
    for name in a.workloads.split(","):
        w = get(name)
        b = make_batch(w, dev)
        q, k, v, qo, ko = b.q, b.k, b.v, b.q_offsets, b.kv_offsets
        m = None if w.blocks is None else make_block_mask(w.blocks, b.q_lens, b.kv_lens, w.causal, qo, ko)
        dim = q.shape[2]
        left, right = (-1, 0) if w.causal else (-1, -1)
        plan, want = fwd_sm90.plan_and_config(q, k, qo, ko, b.max_q, left=left, right=right, scale=dim**-0.5, blocks=m)
        tl = torch.full((num_workers(dev), 3, MAXT, 8), -1, dtype=torch.int64, device=dev)
        fwd = functools.partial(
            fwd_sm90.forward, q, k, v, qo, ko, b.max_q, left=left, right=right, scale=dim**-0.5, plan=plan,
            config=want, blocks=m,
        )
        ref = fwd()
        plain = measure(fwd, dev).p50
        stamped_fn = functools.partial(fwd, timeline=tl)
        got = stamped_fn()
        same = all(torch.equal(x, y) for x, y in zip(got, ref))
        stamped = measure(stamped_fn, dev).p50
        print(f"# {name}: config {want}; forward {plain:.4f} ms, stamped {stamped:.4f} ms; outputs equal: {same}")
        tl.fill_(-1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        stamped_fn()
        end.record()
        torch.cuda.synchronize()
        analyse(name, tl, start.elapsed_time(end))


if __name__ == "__main__":
    main()
