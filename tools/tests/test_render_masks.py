"""docs/render_masks.py renders every picture docs/semantics.md shows, from the reference's mask."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def test_renders_every_picture_the_docs_show(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("jagflash_docs_render_masks", REPO / "docs" / "render_masks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--out", str(tmp_path)]) == 0
    shown = set(re.findall(r"\(img/(mask_\w+\.png)\)", (REPO / "docs" / "semantics.md").read_text()))
    rendered = {p.name for p in tmp_path.glob("*.png")}
    assert shown
    assert shown <= rendered
    assert rendered <= {p.name for p in (REPO / "docs" / "img").glob("*.png")}  # committed
