"""tools/versions.py on a scratch copy of the repository's pyproject.toml files."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
_spec = importlib.util.spec_from_file_location("jagflash_tools_versions", REPO / "tools" / "versions.py")
versions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(versions)


def _scratch(tmp_path: Path) -> Path:
    for path in REPO.glob("**/pyproject.toml"):
        rel = path.relative_to(REPO)
        if ".nox" in rel.parts:
            continue
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, tmp_path / rel)
    return tmp_path


def test_repository_agrees() -> None:
    assert versions.check(REPO) == []


def test_a_new_version_is_flagged_then_written_everywhere(tmp_path: Path) -> None:
    root = _scratch(tmp_path)
    top = root / "pyproject.toml"
    top.write_text(top.read_text().replace('version = "0.1.0"', 'version = "0.3.1"', 1))
    problems = versions.check(root)
    assert any(p.startswith("variants/jagged/pyproject.toml: 'version") for p in problems), problems
    assert versions.main(["--root", str(root), "--write"]) == 0
    jagged = (root / "variants/jagged/pyproject.toml").read_text()
    assert 'version = "0.3.1"' in jagged
    assert '"jagflash-core>=0.3,<0.4"' in jagged
    assert '"jagflash-jagged==0.3.1"' in top.read_text()


def test_a_new_variant_gets_an_extra(tmp_path: Path) -> None:
    root = _scratch(tmp_path)
    toy = root / "variants/toy"
    toy.mkdir()
    (toy / "pyproject.toml").write_text('[project]\nname = "jagflash-toy"\nversion = "0.1.0"\n')
    assert any("extras" in p or "toy" in p for p in versions.check(root))
    assert versions.main(["--root", str(root), "--write"]) == 0
    assert 'toy = ["jagflash-toy==0.1.0"]' in (root / "pyproject.toml").read_text()
