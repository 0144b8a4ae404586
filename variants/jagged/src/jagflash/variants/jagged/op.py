"""The jagged attention ``torch.library`` ops: ``jagflash::jagged_fwd`` / ``jagged_bwd``
(``jagflash.core.jagged_call.jagged_ops``: the jagged layout's op plumbing, shared with the
other variants on it; here only which variant they are).

The ops are opaque to ``torch.compile``: backend selection and the checks that read offsets'
values happen inside them, at run time, so a compiled graph has no break and no host sync of
its own. ``max_seqlen_* = -1`` means "not given": the op reads it from the offsets (one host
synchronisation on a GPU, which also validates the offsets' values).

The Plan (``jagflash.core.plan``) crosses the ops as ``plan_tiles``, ``plan_meta`` and
``plan_info``; the forward's autograd context saves them, so the backward runs on the plan the
forward ran on. Called without a plan (only code that calls an op directly does), an op builds
one for the passes it runs. ``deterministic`` is saved the same way and matters to the backward
alone: the TLX backward takes it (ordered two passes instead of dQ reduce-adds); the portable
and reference backwards are always deterministic and do not need it.
"""

from __future__ import annotations

from jagflash.core.jagged_call import jagged_ops
from jagflash.variants.jagged.spec import SPEC

jagged_fwd, jagged_bwd, call_fwd = jagged_ops("jagged", SPEC, __package__, "jagged_attention")
