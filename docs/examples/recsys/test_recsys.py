"""The recommender example on the CPU: a tiny one trains a few steps and its loss falls; the
padded-SDPA model computes what the jagged one does; the history generator is heavy tailed."""

from __future__ import annotations

import pytest
import torch
from recsys import Recommender, make_histories

pytestmark = pytest.mark.interpret

TINY = {"dim": 32, "heads": 2, "layers": 1, "max_len": 16}


def test_histories_are_heavy_tailed() -> None:
    h = make_histories(2000, 1000, median_len=16, max_len=4096, seed=1)
    lens = h.lengths.double()
    assert int(h.offsets[-1]) == h.items.numel()
    assert h.items.min() >= 1
    assert h.items.max() <= 1000
    assert lens.max() > 10 * lens.median()  # a long tail far beyond the typical history
    assert lens.mean() > lens.median()


def test_tiny_model_learns(device: str) -> None:
    torch.manual_seed(0)
    data = make_histories(6, 64, median_len=10, max_len=TINY["max_len"], clusters=4, follow=0.8, seed=0).to(device)
    model = Recommender(64, attention="jagflash", **TINY).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator(device=device).manual_seed(0)
    losses = []
    for _ in range(6):
        loss = model.loss(data, negatives=32, gen=gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-2:]) / 2 < 0.8 * sum(losses[:2]) / 2, losses


def test_padded_sdpa_model_equals_jagged(device: str) -> None:
    torch.manual_seed(0)
    data = make_histories(5, 50, median_len=8, max_len=TINY["max_len"], seed=3).to(device)
    jag = Recommender(50, attention="jagflash", **TINY).to(device)
    padded = Recommender(50, attention="sdpa", **TINY).to(device)
    padded.load_state_dict(jag.state_dict())
    with torch.no_grad():
        a, b = jag.hidden(data), padded.hidden(data)
    assert a.shape == (data.items.numel(), TINY["dim"])
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_train_gpu_script_smoke(tmp_path) -> None:
    """train_gpu.py end to end on the CPU at a toy size: CSV, summary table and PNG."""
    import train_gpu

    rc = train_gpu.main([
        "--device", "cpu", "--attention", "jagflash", "sdpa", "--users", "8", "--items", "40",
        "--median-len", "6", "--max-len", "12", "--batch", "3", "--steps", "2", "--warmup", "1",
        "--dim", "32", "--heads", "2", "--layers", "1", "--negatives", "8", "--out", str(tmp_path),
    ])
    assert rc == 0
    rows = (tmp_path / "recsys.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2
    summary = (tmp_path / "summary.md").read_text()
    assert "| jagflash |" in summary
    assert "| sdpa |" in summary
    assert (tmp_path / "curves.png").stat().st_size > 1000
