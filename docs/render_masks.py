"""Render the mask semantics of docs/semantics.md as PNGs, from the reference's own mask.

    python docs/render_masks.py [--out docs/img]

Every picture is drawn from ``jagflash.core.reference.visibility_mask`` (with
``jagflash.core.mask.mask_bounds`` for causal + window), the mask the fp64 oracle of every test
uses, so a picture cannot drift from what the kernels are checked against. Writes:

  mask_causal.png      bottom-right causal: Lq == Lk, Lq < Lk, Lq > Lk (rows that see no key)
  mask_window.png      sliding windows (left, right) on the same diagonal
  mask_jagged.png      a jagged batch's Tq x Tk score matrix: one causal block per sequence
  mask_broadcast_q.png broadcast-Q: one dense q against every K/V sequence
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from jagflash.core.mask import mask_bounds
from jagflash.core.reference import visibility_mask

# hidden, visible, a row that sees no key
CMAP = ListedColormap(["#eeeeee", "#2b6cb0", "#f6c6c6"])


def _grid(mask: np.ndarray) -> np.ndarray:
    out = mask.astype(float)
    out[~mask.any(1)] = 2.0
    return out


def _panel(ax, mask: np.ndarray, title: str, q_label: str = "q", k_label: str = "k") -> None:
    lq, lk = mask.shape
    ax.imshow(_grid(mask), cmap=CMAP, vmin=0, vmax=2, interpolation="nearest")
    ax.set_xticks(range(lk), [f"{k_label}{j}" for j in range(lk)], fontsize=7)
    ax.set_yticks(range(lq), [f"{q_label}{i}" for i in range(lq)], fontsize=7)
    ax.set_xticks(np.arange(-0.5, lk), minor=True)
    ax.set_yticks(np.arange(-0.5, lq), minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.tick_params(which="minor", length=0)
    ax.xaxis.tick_top()
    ax.set_title(title, fontsize=9, pad=18)


def _mask(lq: int, lk: int, causal: bool = False, window: tuple[int, int] = (-1, -1)) -> np.ndarray:
    left, right = mask_bounds(causal, window)
    return visibility_mask(lq, lk, left, right).numpy()


def _save(fig, path: Path, note: str) -> None:
    fig.text(0.5, 0.01, note, ha="center", fontsize=8, color="#444444")
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    print(f"wrote {path}")


def causal(out: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
    for ax, (lq, lk) in zip(axes, [(6, 6), (3, 6), (6, 3)]):
        _panel(ax, _mask(lq, lk, causal=True), f"causal, Lq={lq}, Lk={lk}")
    _save(fig, out / "mask_causal.png",
          "bottom-right aligned: query i sees key j iff j <= i + Lk - Lq (the last query sees every key); "
          "red rows see no key: output 0, LSE -inf, zero gradients")


def window(out: Path) -> None:
    cases = [((8, 8), (2, 0), "window (2, 0): causal, 2 back"), ((8, 8), (2, 1), "window (2, 1)"),
             ((4, 8), (2, 0), "window (2, 0), Lq=4, Lk=8")]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
    for ax, ((lq, lk), w, title) in zip(axes, cases):
        _panel(ax, _mask(lq, lk, window=w), title)
    _save(fig, out / "mask_window.png",
          "window (left, right): query i sees keys i + Lk - Lq - left ... i + Lk - Lq + right; -1 is unbounded "
          "((-1, 0) is causal)")


def jagged(out: Path) -> None:
    q_lens, k_lens = [3, 0, 5, 2], [3, 2, 5, 4]
    tq, tk = sum(q_lens), sum(k_lens)
    full = np.zeros((tq, tk), dtype=bool)
    qo, ko = np.cumsum([0, *q_lens]), np.cumsum([0, *k_lens])
    for b in range(len(q_lens)):
        full[qo[b]:qo[b + 1], ko[b]:ko[b + 1]] = _mask(q_lens[b], k_lens[b], causal=True)
    fig, ax = plt.subplots(figsize=(5.5, 4.6))
    _panel(ax, full, f"a jagged batch, causal: q lengths {q_lens}, kv lengths {k_lens}")
    for edge in ko[1:-1]:
        ax.axvline(edge - 0.5, color="#333333", lw=1.2)
    for edge in qo[1:-1]:
        ax.axhline(edge - 0.5, color="#333333", lw=1.2)
    _save(fig, out / "mask_jagged.png",
          "rows: every query token back to back (q_offsets); columns: every key token (kv_offsets); "
          "a sequence attends only within its own block (sequence 1 has no query)")


def broadcast_q(out: Path) -> None:
    k_lens = [3, 6, 0]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2), gridspec_kw={"width_ratios": [max(k, 1) for k in k_lens]})
    for b, (ax, lk) in enumerate(zip(axes, k_lens)):
        if lk == 0:
            _panel(ax, np.zeros((4, 1), dtype=bool), f"out[{b}]: Lk=0", k_label="-")
            ax.set_xticks([])
        else:
            _panel(ax, _mask(4, lk), f"out[{b}]: the same q over K/V sequence {b} (Lk={lk})")
    _save(fig, out / "mask_broadcast_q.png",
          "broadcast-Q: one dense q [Lq, H, D] attends to every jagged K/V sequence -> out [B, Lq, H, D]; "
          "dq sums over the sequences; an empty sequence gives 0")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "img")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for render in (causal, window, jagged, broadcast_q):
        render(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
