"""The tolerance rule: relative to PyTorch's own error in the input dtype.

A kernel output passes when ``max|out - ref| <= 2 * max|ref_lowp - ref| + atol``, where ``ref`` is
the reference in fp64 and ``ref_lowp`` the same reference computed in the input dtype. NaN never
passes (outputs are NaN-poisoned, so an unwritten element shows up as NaN), and -inf entries
(LSE of rows that see no key) must sit exactly where the reference has them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _fail(name: str, msg: str) -> None:
    raise AssertionError(f"{name}: {msg}")


def assert_close(
    name: str,
    out: torch.Tensor,
    ref: torch.Tensor,
    ref_lowp: torch.Tensor,
    atol: float,
) -> None:
    if out.shape != ref.shape:
        _fail(name, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    out64, ref64, low64 = (t.detach().to(torch.float64).cpu() for t in (out, ref, ref_lowp))
    nans = torch.isnan(out64)
    if nans.any():
        idx = nans.nonzero()[0].tolist()
        _fail(name, f"{int(nans.sum())} NaN elements (unwritten or NaN-producing), first at {idx}")
    inf_out, inf_ref = torch.isinf(out64), torch.isinf(ref64)
    if not torch.equal(inf_out, inf_ref) or not torch.equal(out64[inf_out], ref64[inf_ref]):
        _fail(name, f"infinities differ: {int(inf_out.sum())} in output, {int(inf_ref.sum())} in reference")
    finite = ~inf_ref
    if not finite.any():
        return
    err = (out64 - ref64)[finite].abs().max().item()
    base = (low64 - ref64)[finite & torch.isfinite(low64)].abs().max().item() if finite.any() else 0.0
    bound = 2 * base + atol
    if not err <= bound:
        where = ((out64 - ref64).abs() * finite).flatten().argmax().item()
        _fail(
            name,
            f"max error {err:.3e} > 2 * {base:.3e} (PyTorch in the input dtype) + {atol:.1e}; "
            f"worst at flat index {where}",
        )


def assert_close_all(
    names: Sequence[str],
    outs: Sequence[torch.Tensor],
    refs: Sequence[torch.Tensor],
    refs_lowp: Sequence[torch.Tensor],
    atol: float,
) -> None:
    """:func:`assert_close` over several tensors; every failure is reported, not just the first."""
    failures = []
    for n, o, r, lp in zip(names, outs, refs, refs_lowp):
        try:
            assert_close(n, o, r, lp, atol)
        except AssertionError as e:
            failures.append(str(e))
    if failures:
        raise AssertionError("\n".join(failures))
