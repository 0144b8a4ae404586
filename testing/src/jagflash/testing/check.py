"""One call that checks a kernel against its reference, forward and backward."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from jagflash.testing.tolerance import assert_close_all


def _run_reference(
    reference: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    tensors: Mapping[str, torch.Tensor],
    grad_names: list[str],
    dout: torch.Tensor | None,
    dtype: torch.dtype,
) -> list[torch.Tensor]:
    args = {
        n: (t.detach().to(dtype).requires_grad_(n in grad_names) if t.is_floating_point() else t)
        for n, t in tensors.items()
    }
    out, lse = reference(**args, dtype=dtype)
    results = [out.detach(), lse.detach()]
    if dout is not None:
        grads = torch.autograd.grad(out, [args[n] for n in grad_names], dout.to(dtype))
        results += [g.detach() for g in grads]
    return results


def check_against_reference(
    kernel: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    reference: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    tensors: Mapping[str, torch.Tensor],
    *,
    atol: float,
    dout: torch.Tensor | None = None,
) -> None:
    """Run ``kernel(**tensors) -> (out, lse)`` and, with ``dout``, its backward; compare out,
    LSE and the gradients of every floating tensor that requires grad with ``reference(**tensors,
    dtype=...)`` in fp64 and in the input dtype, by the tolerance rule. Fresh outputs are
    NaN-poisoned by the pytest plugin, so unwritten elements fail."""
    grad_names = [n for n, t in tensors.items() if t.is_floating_point() and t.requires_grad]
    out, lse = kernel(**tensors)
    got = [out, lse]
    if dout is not None:
        got += list(torch.autograd.grad(out, [tensors[n] for n in grad_names], dout))
    dtype = next(t.dtype for t in tensors.values() if t.is_floating_point())
    ref = _run_reference(reference, tensors, grad_names, dout, torch.float64)
    low = _run_reference(reference, tensors, grad_names, dout, dtype)
    names = ["out", "lse", *[f"d{n}" for n in grad_names][:len(got) - 2]]
    assert_close_all(names, got, ref, low, atol)
