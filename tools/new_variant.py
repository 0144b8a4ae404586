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
from jagflash.variants.{name} import (
    {name}_attention,
)
```

## Capabilities

Keep this table equal to `SPEC` in `spec.py`: the spec is what dispatch reads, this is what
people read. One row per backend, fastest first.

| backend | devices | dtypes | head dims fwd | head dims bwd | features | notes |
|---|---|---|---|---|---|---|
| `portable` | TODO | TODO | TODO | TODO | TODO | TODO |
| `interpreter` | TODO | TODO | TODO | TODO | TODO | TODO |
| `reference` | TODO | TODO | TODO | TODO | TODO | TODO |
"""

INIT = '''\
"""jagflash {name} variant. TODO: one line on what it computes.

Scaffolded by tools/new_variant.py; the steps are in {guide}. Written, this module exports the
public function, SPEC and VARIANT, as variants/jagged does::

    from jagflash.core.registry import Variant
    from jagflash.variants.{name}.spec import SPEC

    VARIANT = Variant(spec=SPEC, problem=_problem, run={name}_attention)
"""

from jagflash.variants.{name}.op import (
    {name}_attention,
)

__all__ = ["{name}_attention"]


def __getattr__(attr: str):
    if attr in ("SPEC", "VARIANT"):
        raise NotImplementedError(
            "jagflash-{name} is a scaffold: define SPEC in spec.py and VARIANT here (a "
            "jagflash.core.registry.Variant, the object the `jagflash.variants` entry point "
            "names); see {guide}"
        )
    raise AttributeError(f"module {{__name__!r}} has no attribute {{attr!r}}")
'''

SPEC = '''\
"""What the {name} variant runs, per backend: devices, dtypes, head dims, features forward and
backward, and the absolute tolerance per dtype its tests use. Dispatch reads SPEC to choose or
refuse this variant, so every refusal explains itself. A variant on the shared portable kernels
reads like variants/jagged/spec.py::

    from jagflash.core.backend import portable_family
    from jagflash.core.capability import DEFAULT_ATOL, VariantSpec

    SPEC = VariantSpec(
        name="{name}",
        layouts=frozenset({{"jagged"}}),
        backends=portable_family(frozenset({{"causal", "gqa", "lse"}})),
        atol=DEFAULT_ATOL,
    )
"""


def __getattr__(attr: str):
    if attr == "SPEC":
        raise NotImplementedError(
            "jagflash-{name}: write spec.py: SPEC = VariantSpec(...) from "
            "jagflash.core.capability, listing what each backend takes; see {guide}"
        )
    raise AttributeError(f"module {{__name__!r}} has no attribute {{attr!r}}")
'''

OP = '''\
"""The public function and the torch.library custom ops of the {name} variant."""


def {name}_attention(*args, **kwargs):
    """TODO: document every argument with its shape ([T, H, D] values, [B+1] offsets), the
    mask alignment with an ASCII picture where it differs from docs/semantics.md, and what
    happens at zero length."""
    raise NotImplementedError(
        "jagflash-{name}: write op.py: the public function checking its inputs "
        "(jagflash.core.checks: check_qkv, check_offsets) and calling "
        "torch.library custom ops fwd/bwd with fake implementations, wired by "
        "jagflash.core.ops.register_autograd, the backend chosen by jagflash.core.backend.select; "
        "see {guide}"
    )
'''

KERNELS = '''\
"""Stock-Triton kernels of the {name} variant: they run on any CUDA GPU and, with
TRITON_INTERPRET=1, on the CPU. The softmax, masks and main loops come from jagflash.core
(math, portable); this module only adds what is particular to {name}.
"""


def {name}_forward(*args, **kwargs):
    raise NotImplementedError(
        "jagflash-{name}: write kernels_portable.py: the @triton.jit forward and backward "
        "kernels, built from jagflash.core.mask, jagflash.core.softmax and jagflash.core.portable; see {guide}"
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
