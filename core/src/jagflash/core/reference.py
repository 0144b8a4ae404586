"""The naive attention every kernel is checked against, and the ``reference`` backend.

Plain PyTorch, one sequence at a time, a materialised mask: obviously right, slow. Autograd
flows through it, so the same function gives reference gradients. ``jagflash.testing`` runs it
in float64 as the oracle; the ``reference`` backend runs it in float32 and casts back.
"""

from __future__ import annotations

import math

import torch

from jagflash.core.mask import mask_bounds

__all__ = ["attention_reference", "reference_backward", "reference_forward", "visibility_mask"]


def visibility_mask(
    lq: int, lk: int, left: int, right: int, device: torch.device | None = None
) -> torch.Tensor:
    """``[lq, lk]`` bool: query ``i`` sees key ``j`` iff ``i+d-left <= j <= i+d+right``, d = lk-lq.

    Bottom-right alignment: with ``right = 0`` (causal) the last query sees every key.
    """
    i = torch.arange(lq, device=device)[:, None]
    j = torch.arange(lk, device=device)[None, :]
    d = lk - lq
    mask = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if right >= 0:
        mask &= j <= i + d + right
    if left >= 0:
        mask &= j >= i + d - left
    return mask


def _mask(b: int, lq: int, lk: int, left: int, right: int, device, block_mask) -> torch.Tensor:
    """Sequence ``b``'s mask: ``[lq, lk]``, or ``[Hm, lq, lk]`` under a block mask."""
    mask = visibility_mask(lq, lk, left, right, device)
    if block_mask is not None:
        mask = mask & block_mask.element_mask(b, lq, lk).to(device)
    return mask


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    scale: float | None = None,
    compute_dtype: torch.dtype = torch.float32,
    block_mask=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Jagged attention, one sequence at a time.

    A ``block_mask`` (``jagflash.core.block_mask.BlockMask``) is materialised per sequence into
    its element mask (``element_mask``), AND-ed with causal/window's.

    q ``[Tq, Hq, D]``, k/v ``[Tk, Hkv, D]``, offsets ``[B+1]``. Returns ``out [Tq, Hq, D]`` and
    ``lse [Hq, Tq]`` (natural log), both in ``compute_dtype``. A row that sees no key gets output 0
    and LSE -inf, and contributes no gradient.
    """
    _, hq, dim = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    left, right = mask_bounds(causal, window)
    qo = q_offsets.tolist()
    ko = kv_offsets.tolist()
    outs, lses = [], []
    for b in range(len(qo) - 1):
        qs = q[qo[b] : qo[b + 1]].to(compute_dtype).transpose(0, 1)  # [Hq, Lq, D]
        ks = k[ko[b] : ko[b + 1]].to(compute_dtype).transpose(0, 1)  # [Hkv, Lk, D]
        vs = v[ko[b] : ko[b + 1]].to(compute_dtype).transpose(0, 1)
        ks = ks.repeat_interleave(group, dim=0)
        vs = vs.repeat_interleave(group, dim=0)
        lq, lk = qs.shape[1], ks.shape[1]
        s = torch.matmul(qs, ks.transpose(1, 2)) * scale
        mask = _mask(b, lq, lk, left, right, q.device, block_mask)
        # A row that sees no key would give exp(-inf - -inf) = NaN, in the forward and in the
        # gradient of logsumexp; compute it on zeros instead, then drop it.
        seen = mask.any(-1)
        s = torch.where(seen[..., None], s.masked_fill(~mask, float("-inf")), 0.0)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse[..., None]).masked_fill(~mask, 0.0)
        lse = lse.masked_fill(~seen, float("-inf"))
        outs.append(torch.matmul(p, vs).transpose(0, 1))
        lses.append(lse)
    if not outs:
        return q.new_zeros(q.shape, dtype=compute_dtype), q.new_zeros((hq, 0), dtype=compute_dtype)
    return torch.cat(outs, 0), torch.cat(lses, 1)


def reference_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    causal: bool,
    window: tuple[int, int],
    scale: float,
    block_mask=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``reference`` backend's forward: fp32 math, output in q's dtype, LSE fp32."""
    out, lse = attention_reference(
        q, k, v, q_offsets, kv_offsets, causal=causal, window=window, scale=scale, block_mask=block_mask
    )
    return out.to(q.dtype), lse.float()


def reference_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    causal: bool,
    window: tuple[int, int],
    scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    block_mask=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``reference`` backend's backward, written out (autograd does not run inside a custom
    op's implementation): per sequence, in fp32,
    ``dV = P^T dO``, ``dS = P * (dO V^T - rowsum(dO * O))``, ``dQ = dS K s``, ``dK = dS^T Q s``,
    with dK and dV summed over each GQA group.

    Given ``out [Tq, Hq, D]`` and ``lse [Hq, Tq]``, as the kernels are, ``P = exp(S - lse)``
    and ``O = out``: the gradients at that forward, which may be a larger attention's that this
    call is a part of (partials merged by LSE); without them P and O are recomputed here."""
    hq, hkv = q.shape[1], k.shape[1]
    group = hq // hkv
    left, right = mask_bounds(causal, window)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    qo, ko = q_offsets.tolist(), kv_offsets.tolist()
    for b in range(len(qo) - 1):
        rq, rk = slice(qo[b], qo[b + 1]), slice(ko[b], ko[b + 1])
        qs = q[rq].float().transpose(0, 1)  # [Hq, Lq, D]
        ks = k[rk].float().transpose(0, 1).repeat_interleave(group, dim=0)
        vs = v[rk].float().transpose(0, 1).repeat_interleave(group, dim=0)
        dos = dout[rq].float().transpose(0, 1)
        mask = _mask(b, qs.shape[1], ks.shape[1], left, right, q.device, block_mask)
        s = (qs @ ks.transpose(1, 2) * scale).masked_fill(~mask, float("-inf"))
        seen = mask.any(-1)
        if lse is None:
            p = torch.softmax(torch.where(seen[..., None], s, 0.0), dim=-1).masked_fill(~mask, 0.0)
        else:  # a row with LSE -inf sees no key anywhere: P = 0 there, not exp(-inf + inf)
            rows = lse[:, rq].float()
            p = torch.exp(s - torch.where(rows == float("-inf"), float("inf"), rows)[..., None])
        o = p @ vs if out is None else out[rq].float().transpose(0, 1)
        ds = p * (dos @ vs.transpose(1, 2) - (dos * o).sum(-1, keepdim=True))
        dq[rq] = (ds @ ks * scale).transpose(0, 1)
        dks = (ds.transpose(1, 2) @ qs * scale).unflatten(0, (hkv, group)).sum(1)
        dvs = (p.transpose(1, 2) @ dos).unflatten(0, (hkv, group)).sum(1)
        dk[rk] = dks.transpose(0, 1)
        dv[rk] = dvs.transpose(0, 1)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
