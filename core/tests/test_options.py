"""The shared keywords (``jagflash.core.options``): defaults, unknown keywords, and the explicit
signatures and docs every variant's public functions show."""

from __future__ import annotations

import inspect
import re

import pytest

from jagflash.core.options import DEFAULTS, JaggedOptions, MaskedPlanOptions, Unpack, resolve, takes

#: The signatures the public functions had when they spelt every keyword out (parameter names,
#: kinds, defaults, order), before the shared ones moved to ``jagflash.core.options``.
OLD_SIGNATURES = {
    "jagged.jagged_attention": "(q, k, v, q_offsets=None, kv_offsets=None, *, causal=False, scale=None, "
    "max_seqlen_q=None, max_seqlen_kv=None, return_lse=False, deterministic=False, backend=None, plan=None, "
    "decode=None)",
    "jagged.make_plan": "(q, k, q_offsets, kv_offsets, *, causal=False, schedule='default', "
    "backward_schedule='default', workers=None, max_seqlen_q=None, max_seqlen_kv=None, backward=True, "
    "backend=None)",
    "dense.dense_attention": "(q, k, v, *, causal=False, scale=None, return_lse=False, deterministic=False, "
    "backend=None, plan=None)",
    "dense.make_plan": "(q, k, *, causal=False, schedule='default', backward_schedule='default', workers=None, "
    "backward=True, backend=None)",
    "broadcast_q.broadcast_q_attention": "(q, k, v, kv_offsets, *, scale=None, max_seqlen_kv=None, "
    "return_lse=False, deterministic=False, plan=None, backend=None)",
    "broadcast_q.make_plan": "(q, k, kv_offsets, *, schedule='default', backward_schedule='default', "
    "workers=None, max_seqlen_kv=None, backward=True, backend=None)",
    "sliding_window.sliding_window_attention": "(q, k, v, q_offsets=None, kv_offsets=None, *, window=(-1, -1), "
    "causal=False, scale=None, max_seqlen_q=None, max_seqlen_kv=None, return_lse=False, deterministic=False, "
    "plan=None, backend=None)",
    "sliding_window.make_plan": "(q, k, q_offsets=None, kv_offsets=None, *, window=(-1, -1), causal=False, "
    "schedule='default', backward_schedule='default', workers=None, max_seqlen_q=None, max_seqlen_kv=None, "
    "backward=True, backend=None)",
    "block_sparse.block_sparse_attention": "(q, k, v, q_offsets, kv_offsets, block_mask, *, causal=False, "
    "window=None, scale=None, return_lse=False, deterministic=False, plan=None, backend=None)",
    "block_sparse.make_plan": "(q, k, q_offsets, kv_offsets, block_mask, *, causal=False, window=None, "
    "schedule='default', backward_schedule='default', workers=None, backward=True, backend=None)",
}


def _plain(sig: inspect.Signature) -> str:
    """The signature without annotations: names, kinds (``*`` before the keyword-only ones),
    defaults, in order."""
    return str(sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                           return_annotation=inspect.Signature.empty))


@pytest.mark.parametrize("where", sorted(OLD_SIGNATURES))
def test_public_signatures_are_the_explicit_ones(where: str) -> None:
    variant, name = where.split(".")
    fn = getattr(pytest.importorskip(f"jagflash.variants.{variant}"), name)
    assert _plain(inspect.signature(fn)) == OLD_SIGNATURES[where]
    params = inspect.signature(fn).parameters.values()
    assert not any(p.kind is p.VAR_KEYWORD for p in params)  # the front door reads this signature
    doc = fn.__doc__ or ""
    for p in params:  # every shared keyword is documented, once
        if p.name in DEFAULTS:
            assert len(re.findall(rf"^ *(?:\w+, )*{p.name}(?:, \w+)*:", doc, re.MULTILINE)) == 1, p.name
    assert doc.count("Keyword Args:") <= 1


def _f(*, causal=False):
    return causal


def test_resolve_applies_defaults_and_refuses_unknown_keywords_as_python_does() -> None:
    o = resolve("f", JaggedOptions, {"causal": True})
    assert o == {
        "scale": None, "return_lse": False, "deterministic": False, "plan": None, "backend": None, "causal": True,
        "max_seqlen_q": None, "max_seqlen_kv": None,
    }
    assert set(resolve("f", MaskedPlanOptions, {})) == {
        "schedule", "backward_schedule", "workers", "backward", "backend", "causal"
    }
    with pytest.raises(TypeError) as python:
        _f(window=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError) as ours:
        resolve("_f", JaggedOptions, {"window": 1})
    assert str(ours.value) == str(python.value)
    with pytest.raises(TypeError, match=r"f\(\) got unexpected keyword arguments 'window', 'block_mask'"):
        resolve("f", JaggedOptions, {"causal": True, "window": 1, "block_mask": None})


def test_takes_builds_the_signature_and_appends_only_undocumented_keywords() -> None:
    @takes(MaskedPlanOptions, order="window causal schedule backward_schedule workers backward backend")
    def make(q, *, window=(-1, -1), **options: Unpack[MaskedPlanOptions]):
        """Doc.

        Args:
            causal: my own causal.
        """
        return resolve("make", MaskedPlanOptions, options)

    assert _plain(inspect.signature(make)) == (
        "(q, *, window=(-1, -1), causal=False, schedule='default', backward_schedule='default', workers=None, "
        "backward=True, backend=None)"
    )
    doc = make.__doc__
    assert "my own causal" in doc
    assert doc.count("causal:") == 1
    assert doc.index("Keyword Args:") < doc.index("    schedule:") < doc.index("    backend:")
    assert make(1, workers=3)["workers"] == 3
    with pytest.raises(TypeError, match="order"):
        takes(MaskedPlanOptions, order="causal")(lambda q, **options: None)
