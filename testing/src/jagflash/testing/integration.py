"""Checks every variant's tests share: its custom ops under ``torch.library.opcheck``, a
``torch.compile``'d step against eager, and the refusals of its public function."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from jagflash.core.backend import last_choice
from jagflash.core.capability import InvalidInput, UnsupportedProblem


def opcheck_ops(fwd, bwd, args: tuple, dout: torch.Tensor, deterministic: bool) -> None:
    """``torch.library.opcheck`` of a variant's forward op on ``args`` (the op's arguments,
    ending ``deterministic, backend``) with ``deterministic`` put in, and of its backward op on
    ``dout``, the forward's q, k, v, out and LSE and the rest of ``args`` (all detached)."""
    args = (*args[:-2], deterministic, "")
    torch.library.opcheck(fwd, args)
    out, lse = fwd(*args)
    bwd_args = (dout, *args[:3], out.detach(), lse, *args[3:])
    torch.library.opcheck(bwd, tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in bwd_args))


def assert_compiled_matches_eager(step: Callable[..., torch.Tensor], args: tuple, **tol) -> None:
    """``step(*args)`` (a scalar loss) under ``torch.compile(fullgraph=True, backend="aot_eager")``
    gives eager's loss and eager's gradients of ``args[:3]`` (q, k, v); ``tol``: for the
    gradients' ``torch.testing.assert_close``."""
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(*args)
    grads = torch.autograd.grad(loss, args[:3])
    loss_e = step(*args)
    grads_e = torch.autograd.grad(loss_e, args[:3])
    torch.testing.assert_close(loss, loss_e)
    for a, b in zip(grads, grads_e):
        torch.testing.assert_close(a, b, **tol)


def refused(run: Callable, args: list, exc: type[Exception] = InvalidInput, *, mutate=None, **kw) -> str:
    """The message of the ``exc`` that ``run(*args, **kw)`` must raise; ``mutate(args)`` first
    edits the argument list in place, where given."""
    if mutate is not None:
        mutate(args)
    with pytest.raises(exc) as info:
        run(*args, **kw)
    return str(info.value)


def check_backend_refusals(run: Callable, args: Sequence, variant: str, monkeypatch) -> None:
    """On a CPU, with valid fp32 ``args``, ``run`` (a variant's public function) refuses the
    portable backend (listing device and dtype) and an unknown backend; in float64, which no
    kernel backend takes, it is refused with every backend's reasons (no silent fallback) and
    runs on the reference only when asked for (``JAGFLASH_ALLOW_REFERENCE=1``)."""
    msg = refused(run, list(args), UnsupportedProblem, backend="portable")
    assert "device cpu not in {cuda}" in msg
    assert "dtype float32 not in {bfloat16, float16}" in msg
    assert "no backend 'tlx'" in refused(run, list(args), UnsupportedProblem, backend="tlx")
    wide = [a.double() if a.is_floating_point() else a for a in args]
    monkeypatch.delenv("JAGFLASH_ALLOW_REFERENCE", raising=False)
    with pytest.raises(UnsupportedProblem, match="dtype float64 not in") as err:
        run(*wide)
    assert "JAGFLASH_ALLOW_REFERENCE=1" in str(err.value)
    monkeypatch.setenv("JAGFLASH_ALLOW_REFERENCE", "1")
    run(*wide)
    assert last_choice(variant).name == "reference"
    assert "JAGFLASH_ALLOW_REFERENCE=1" in last_choice(variant).why


class AttentionBlock(torch.nn.Module):
    """The attention half of a transformer layer around one variant's call, for compile tests:
    ``x [..., dim]`` -> q, k, v projections (``[..., heads, head_dim]``; k and v from ``x_kv``
    when given) -> ``attend(q, k, v, *extra)`` -> output projection back to ``dim``."""

    def __init__(self, attend: Callable[..., torch.Tensor], dim: int, heads: int, head_dim: int, **factory):
        super().__init__()
        self.attend, self.heads, self.head_dim = attend, heads, head_dim
        self.q = torch.nn.Linear(dim, heads * head_dim, bias=False, **factory)
        self.kv = torch.nn.Linear(dim, 2 * heads * head_dim, bias=False, **factory)
        self.o = torch.nn.Linear(heads * head_dim, dim, bias=False, **factory)

    def forward(self, x: torch.Tensor, x_kv: torch.Tensor | None, *extra) -> torch.Tensor:
        x_kv = x if x_kv is None else x_kv
        q = self.q(x).unflatten(-1, (self.heads, self.head_dim))
        k, v = self.kv(x_kv).unflatten(-1, (2, self.heads, self.head_dim)).unbind(-3)
        return self.o(self.attend(q, k, v, *extra).flatten(-2))


def assert_jagged_block_compiles_once(
    attend: Callable[..., torch.Tensor],
    batches: Sequence[tuple[Sequence[int], Sequence[int]]],
    extra: Callable[[Sequence[int], Sequence[int], dict], tuple] = lambda q_lens, k_lens, t: (),
    *,
    device: str,
    dtype: torch.dtype,
    head_dim: int,
    backend: str,
    **tol,
) -> None:
    """:func:`assert_compiles_once` of an :class:`AttentionBlock` (2 heads of ``head_dim``) over
    jagged batches of ``(q_lens, k_lens)``: ``attend(q, k, v, q_offsets, kv_offsets, *extra(t))``,
    with ``t`` the batch's ``jagflash.testing.make_jagged`` tensors (``extra(q_lens, k_lens, t)``
    adds the call's other arguments: ``max_seqlen_*`` ints, a block mask)."""
    from jagflash.testing.inputs import make_jagged

    torch.manual_seed(0)
    dim = 2 * head_dim
    block = AttentionBlock(attend, dim, 2, head_dim, device=device, dtype=dtype)
    args = []
    for q_lens, k_lens in batches:
        t = make_jagged(q_lens, k_lens, 1, 1, dim, dtype, device)  # q, k: the block's inputs [T, 1, dim]
        x, x_kv = t["q"][:, 0].detach().requires_grad_(), t["k"][:, 0].detach().requires_grad_()
        args.append((x, x_kv, t["q_offsets"], t["kv_offsets"], *extra(q_lens, k_lens, t)))

    def step(x, x_kv, *rest):
        return block(x, x_kv, *rest).float().square().mean()

    assert_compiles_once(step, args, list(block.parameters()), backend=backend, **tol)


def assert_compiles_once(
    step: Callable[..., torch.Tensor],
    batches: Sequence[tuple],
    params: Sequence[torch.Tensor] = (),
    *,
    backend: str = "inductor",
    **tol,
) -> None:
    """``step(*args)`` (a scalar loss) compiled ONCE by ``torch.compile(fullgraph=True,
    dynamic=True, backend=backend)`` runs every batch of ``batches`` (new lengths, new batch
    sizes, new ``max_seqlen_*`` ints), forward and backward, without a graph break (fullgraph)
    and without a recompile (``error_on_recompile`` after the first batch; one graph in all),
    and gives eager's loss and gradients (of ``args``' tensors that require grad, then of
    ``params``) within ``tol`` (``torch.testing.assert_close``)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend=backend)
    for i, args in enumerate(batches):
        leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad] + list(params)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            loss = compiled(*args)
            grads = torch.autograd.grad(loss, leaves)
        loss_e = step(*args)
        grads_e = torch.autograd.grad(loss_e, leaves)
        torch.testing.assert_close(loss, loss_e, **tol)
        for a, b in zip(grads, grads_e):
            torch.testing.assert_close(a, b, **tol)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
