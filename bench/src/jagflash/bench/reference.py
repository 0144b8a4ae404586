"""The answer every provider is checked against before it is timed.

``jagflash.core.reference.attention_reference`` in float32 on the inputs upcast, with autograd for
dQ/dK/dV. Two things keep it affordable on the largest workloads:

* sequences go through in chunks whose score matrices stay under ``max_elems`` elements, each
  chunk's backward run before the next starts (memory stays bounded, O(B) launches in all);
* past ``flop_budget`` forward FLOPs only the first few KV-head groups are checked (heads are
  independent, so a subset of heads is a complete check of those heads). The row says so.

A block-sparse batch's ``block_mask`` is applied (cut to each chunk's sequences and heads); the
FLOP budget then counts the band's pairs, an upper bound of the visible ones.

A provider passes when ``||x - ref|| / ||ref|| <= tol`` on the output and, for the backward, on
each of dQ, dK and dV; NaN or Inf never passes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from jagflash.bench.data import Batch
from jagflash.bench.flops import visible_pairs
from jagflash.core.reference import attention_reference

__all__ = ["Ref", "check_heads", "compute_reference", "rel_err", "tolerance"]

#: Forward FLOPs of the reference per workload on a GPU before it checks a subset of heads.
GPU_FLOP_BUDGET = 1.5e12
#: Score-matrix elements per reference chunk (1 GiB of float32).
MAX_CHUNK_ELEMS = 1 << 28


def tolerance(dtype: torch.dtype) -> float:
    """Relative-error bound: 2e-2 for 16-bit inputs; 5e-3 for float32 (tf32 dots stay under)."""
    return 5e-3 if dtype == torch.float32 else 2e-2


#: The smallest root-mean-square a reference is measured at. The bench's inputs are unit-variance,
#: so only gradients that vanish get below it (dQ and dK of a sequence with one key: the softmax
#: of one score is 1 whatever the score); their kernels' rounding is then judged against it.
RMS_FLOOR = 1e-3


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``||x - ref|| / max(||ref||, RMS_FLOOR * sqrt(numel))`` in float32 (inf when x has
    NaN/Inf or the shapes differ)."""
    if tuple(x.shape) != tuple(ref.shape):
        return math.inf
    x = x.detach().to(torch.float32)
    num = torch.linalg.vector_norm(x - ref).item()
    den = max(torch.linalg.vector_norm(ref).item(), RMS_FLOOR * math.sqrt(ref.numel()))
    if not math.isfinite(num):
        return math.inf
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


@dataclass
class Ref:
    """Reference output and gradients (float32, canonical layouts) on the first heads."""

    out: torch.Tensor
    dq: torch.Tensor | None
    dk: torch.Tensor | None
    dv: torch.Tensor | None
    heads_q: int  # the first heads_q query heads (heads_q / group KV heads) are checked
    heads_kv: int
    source: str

    def note(self, total_heads: int) -> str:
        if self.heads_q == total_heads:
            return ""
        return f"checked on query heads 0-{self.heads_q - 1} of {total_heads}"

    def slice_q(self, t: torch.Tensor) -> torch.Tensor:
        """The checked query heads of an output / dQ / dOut tensor (head dim is -2)."""
        return t[..., : self.heads_q, :]

    def slice_kv(self, t: torch.Tensor) -> torch.Tensor:
        return t[..., : self.heads_kv, :]


def check_heads(batch: Batch, flop_budget: float | None) -> int:
    """How many KV heads the reference covers under ``flop_budget`` forward FLOPs (None: all)."""
    w = batch.workload
    if flop_budget is None:
        return w.hkv
    pairs = visible_pairs(batch.q_lens, batch.kv_lens, w.causal, w.window)
    per_kv_head = 4 * w.head_dim * w.group * max(pairs, 1)
    return max(1, min(w.hkv, int(flop_budget // per_kv_head)))


def _chunks(batch: Batch, heads: int, max_elems: int) -> list[tuple[int, int]]:
    """Consecutive sequence ranges whose score matrices hold at most ``max_elems`` elements (a
    single sequence larger than that is a chunk of its own)."""
    out, start, acc = [], 0, 0
    for b, (lq, lk) in enumerate(zip(batch.q_lens, batch.kv_lens)):
        cost = lq * lk * heads
        if b > start and acc + cost > max_elems:
            out.append((start, b))
            start, acc = b, 0
        acc += cost
    if start < batch.num_seqs or not out:
        out.append((start, batch.num_seqs))
    return out


def _chunk_mask(block_mask, b0: int, b1: int, q_off: torch.Tensor, k_off: torch.Tensor, heads: int):
    """Sequences ``b0:b1`` (and the first ``heads`` mask heads) of ``block_mask``, on the chunk's
    offsets; None stays None."""
    if block_mask is None:
        return None
    h = slice(None) if block_mask.heads == 1 else slice(0, heads)
    cut = {f: getattr(block_mask, f)[b0:b1, h] for f in ("kv_counts", "kv_indices", "q_counts", "q_indices")}
    return dataclasses.replace(block_mask, **cut, q_offsets=q_off, kv_offsets=k_off)


def compute_reference(
    batch: Batch,
    *,
    grads: bool,
    flop_budget: float | None = None,
    max_elems: int = MAX_CHUNK_ELEMS,
) -> Ref:
    """Float32 reference output (and dQ, dK, dV for ``grads``) of ``batch``."""
    fn = attention_reference
    w = batch.workload
    hkv = check_heads(batch, flop_budget)
    hq = hkv * w.group
    f32 = torch.float32
    q_all = batch.q[:, :hq].detach().to(f32)
    k_all = batch.k[:, :hkv].detach().to(f32)
    v_all = batch.v[:, :hkv].detach().to(f32)
    dout_all = batch.dout[..., :hq, :].to(f32)
    qo, ko = batch.q_offsets.tolist(), batch.kv_offsets.tolist()
    bq = w.kind == "broadcast_q"
    q_leaf = q_all.clone().requires_grad_(grads) if bq else None
    outs, dqs, dks, dvs = [], [], [], []
    dq_sum = torch.zeros_like(q_all) if bq else None
    for b0, b1 in _chunks(batch, hq, max_elems):
        n = b1 - b0
        with torch.enable_grad():
            if bq:
                qc = q_leaf.unsqueeze(0).expand(n, *q_leaf.shape).reshape(-1, hq, w.head_dim)
            else:
                qc = q_all[qo[b0] : qo[b1]].clone().requires_grad_(grads)
            kc = k_all[ko[b0] : ko[b1]].clone().requires_grad_(grads)
            vc = v_all[ko[b0] : ko[b1]].clone().requires_grad_(grads)
            q_off = batch.q_offsets[b0 : b1 + 1] - qo[b0]
            k_off = batch.kv_offsets[b0 : b1 + 1] - ko[b0]
            mask = _chunk_mask(batch.block_mask, b0, b1, q_off, k_off, hq)
            out, _ = fn(
                qc, kc, vc, q_off, k_off, causal=w.causal, window=tuple(w.window), compute_dtype=f32,
                block_mask=mask,
            )
            if bq:
                out = out.reshape(n, w.q_len, hq, w.head_dim)
                dout = dout_all[b0:b1]
            else:
                dout = dout_all[qo[b0] : qo[b1]]
            if grads and out.numel() > 0:
                leaves = (q_leaf if bq else qc, kc, vc)
                gq, gk, gv = torch.autograd.grad(out, leaves, dout, allow_unused=True)
                gq = torch.zeros_like(leaves[0]) if gq is None else gq
                gk = torch.zeros_like(kc) if gk is None else gk
                gv = torch.zeros_like(vc) if gv is None else gv
                if bq:
                    dq_sum += gq
                else:
                    dqs.append(gq)
                dks.append(gk)
                dvs.append(gv)
            elif grads:
                if not bq:
                    dqs.append(torch.zeros_like(qc))
                dks.append(torch.zeros_like(kc))
                dvs.append(torch.zeros_like(vc))
        outs.append(out.detach())
    out = torch.cat(outs, 0)
    dq = dk = dv = None
    if grads:
        dq = dq_sum if bq else torch.cat(dqs, 0)
        dk, dv = torch.cat(dks, 0), torch.cat(dvs, 0)
    return Ref(out, dq, dk, dv, hq, hkv, "jagflash.core.reference.attention_reference")
