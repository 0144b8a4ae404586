"""Scaffold a new variant: ``python tools/new_variant.py NAME [--root DIR]``.

Creates variants/NAME/ with everything tools/check_layout.py asks for: pyproject.toml (dist
``jagflash-NAME``, the ``jagflash.variants`` entry point, a dependency on jagflash-core), a
README with a capability table to fill in, the package modules, and a test file. The modules
raise NotImplementedError saying what to write, and the test fails until real tests replace it,
so an unfinished variant turns CI red instead of passing silently. Walk-through:
docs/adding-a-variant.md. Refuses to touch an existing directory.
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from pathlib import Path

GUIDE = "docs/adding-a-variant.md"

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "jagflash-{name}"
version = "0.1.0"
description = "jagflash {name} attention variant (TODO: one line on what it computes)"
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["jagflash-core>=0.1,<0.2"]

[project.entry-points."jagflash.variants"]
{name} = "jagflash.variants.{name}:VARIANT"

[tool.hatch.build.targets.wheel]
packages = ["src/jagflash"]
"""

README = """\
# jagflash-{name}

TODO: what this variant computes, in a paragraph, and how it differs from the `jagged` variant.
Semantics shared by every variant (offsets, causal alignment, LSE, scale) are in
docs/semantics.md; say here only what this variant adds or refuses.

```python
from jagflash.variants.{name} import {name}_attention
```

## Capabilities

Keep this table equal to `SPEC` in `spec.py`: the spec is what dispatch reads, this is what
people read.

| | portable (Triton, interpreter) | tlx-sm90 |
|---|---|---|
| devices | TODO | TODO |
| dtypes | TODO | TODO |
| head dims | TODO | TODO |
| causal | TODO | TODO |
| sliding window | TODO | TODO |
| GQA / MQA | TODO | TODO |
| backward | TODO | TODO |
| LSE output | TODO | TODO |
"""

INIT = '''\
"""jagflash {name} variant. TODO: one line on what it computes.

Scaffolded by tools/new_variant.py; the steps are in {guide}.
"""

from jagflash.variants.{name}.op import {name}_attention

__all__ = ["{name}_attention"]


def __getattr__(attr: str):
    if attr in ("SPEC", "VARIANT"):
        raise NotImplementedError(
            "jagflash-{name} is a scaffold: define SPEC in spec.py (a VariantSpec from "
            "jagflash.core.capability) and VARIANT here (the object the `jagflash.variants` entry "
            "point names, which the core registry loads); see {guide}"
        )
    raise AttributeError(f"module {{__name__!r}} has no attribute {{attr!r}}")
'''

SPEC = '''\
"""Capabilities of the {name} variant: devices, archs, dtypes, head dims, forward and backward
features, and the per-dtype tolerances its tests use. Dispatch reads SPEC to pick or refuse
this variant, so every refusal explains itself (STYLE.md 1).
"""


def __getattr__(attr: str):
    if attr == "SPEC":
        raise NotImplementedError(
            "jagflash-{name}: write spec.py: SPEC = VariantSpec(...) from "
            "jagflash.core.capability, one per backend if they differ; see {guide}"
        )
    raise AttributeError(f"module {{__name__!r}} has no attribute {{attr!r}}")
'''

OP = '''\
"""The public function and its torch.library custom op for the {name} variant."""


def {name}_attention(*args, **kwargs):
    """TODO: document every argument with its shape ([T, H, D] values, [B+1] offsets), the
    mask alignment with an ASCII picture where it differs from docs/semantics.md, and what
    happens at zero length."""
    raise NotImplementedError(
        "jagflash-{name}: write op.py: the public function, a torch.library custom op with a fake "
        "(meta) implementation and autograd, checking the problem against SPEC and raising "
        "UnsupportedProblem with its reasons; see {guide}"
    )
'''

KERNELS = '''\
"""Stock-Triton kernels of the {name} variant: they run on any CUDA GPU and, with
TRITON_INTERPRET=1, on the CPU. Softmax, masks and scaling come from jagflash.core.math and the
tile order from the jagflash.core.schedule Plan; this module only moves data.
"""


def {name}_forward(*args, **kwargs):
    raise NotImplementedError(
        "jagflash-{name}: write kernels_portable.py: @triton.jit forward (and backward) kernels "
        "built from jagflash.core.math and driven by a jagflash.core.schedule Plan; see {guide}"
    )
'''

TEST = """\
import pytest


def test_{name}_has_tests():
    pytest.fail(
        "jagflash-{name} is a scaffold: replace this file with real tests (against the "
        "jagflash.testing references, hypothesis properties, refusals); see {guide}"
    )
"""


def files(name: str) -> dict[str, str]:
    """Relative path -> contents of every file a new variant starts with."""
    pkg = f"src/jagflash/variants/{name}"
    templates = {
        "pyproject.toml": PYPROJECT,
        "README.md": README,
        f"{pkg}/__init__.py": INIT,
        f"{pkg}/spec.py": SPEC,
        f"{pkg}/op.py": OP,
        f"{pkg}/kernels_portable.py": KERNELS,
        f"tests/test_{name}.py": TEST,
    }
    return {path: text.format(name=name, guide=GUIDE) for path, text in templates.items()}


def validate(name: str) -> str | None:
    """Why ``name`` cannot be a variant name, or None."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        return (
            f"{name!r} must be lower-case letters, digits and underscores, starting with a letter"
        )
    if keyword.iskeyword(name):
        return f"{name!r} is a Python keyword"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="variant name, a Python identifier, e.g. sliding_window")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="repository root (default: the one holding this script)",
    )
    args = parser.parse_args(argv)
    reason = validate(args.name)
    if reason:
        print(f"new_variant: {reason}", file=sys.stderr)
        return 2
    target = args.root.resolve() / "variants" / args.name
    if target.exists():
        print(f"new_variant: {target} already exists; not overwriting it", file=sys.stderr)
        return 1
    for rel, text in files(args.name).items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    print(f"created {target} (jagflash-{args.name}); next steps: {GUIDE}")
    print(f"  nox -s tests-{args.name}   fails until the scaffold's test is replaced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
