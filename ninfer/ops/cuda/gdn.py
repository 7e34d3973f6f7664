"""Gated delta rule over a slot-indexed fp32 state pool: fla-core chunked prefill and an
in-place Triton decode step.

Prefill (any batch with a row of more than one token, or a row starting a sequence): the rows'
states are gathered from the pool (zeros for fresh rows), fla's varlen
`chunk_gated_delta_rule` runs over all rows at once (cu_seqlens), and the final states are
scattered back. Decode (every row one token after a cached context): one Triton launch reads
each row's state from the pool by slot, through the pool's strides, and writes it back in place:
no per-step gather or scatter copies, no host sync, safe to capture in a CUDA graph.
Knows nothing about the model or the pool's other layers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer.models.batch import ForwardBatch
from ninfer.ops.cuda.host import to_device

L2_EPS = 1e-6
CHUNK = 64  # fla's chunk size for the gated delta rule


def chunk_indices(q_lens: list[int], device: torch.device) -> torch.Tensor:
    """fla's varlen chunk table [chunks, 2] = (row, chunk within the row), built on the host and
    sent without blocking. Left to fla, it is built on the host from cu_seqlens_cpu and copied
    from pageable memory: a stream synchronisation in every GDN layer of every prefill pass."""
    rows = [v for i, n in enumerate(q_lens) for j in range(-(-n // CHUNK)) for v in (i, j)]
    return to_device(rows, device).view(-1, 2)


@triton.jit
def _gdn_decode_kernel(
    q, k, v, g, beta, o, state, slots, scale, a_log, dt_bias,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_gt, s_bt, s_ot, s_oh,
    s_slot, s_h, s_dk, s_dv,
    GROUP: tl.constexpr, DK: tl.constexpr, BV: tl.constexpr, EPS: tl.constexpr,
    GATES: tl.constexpr,
):  # fmt: skip
    """One program: row r, value head h, value columns [vb * BV, (vb + 1) * BV). GATES: `g`
    and `beta` hold the raw a and b projections, and the gates are computed here as
    `gdn_gates_ref` does (g = -exp(A_log) softplus(a + dt_bias) in fp32, beta = sigmoid(b)
    rounded to b's dtype)."""
    r, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    hk = h // GROUP
    offs_k = tl.arange(0, DK)
    offs_v = vb * BV + tl.arange(0, BV)
    bq = tl.load(q + r * s_qt + hk * s_qh + offs_k).to(tl.float32)
    bk = tl.load(k + r * s_kt + hk * s_kh + offs_k).to(tl.float32)
    bq = bq * (1.0 / tl.sqrt(tl.sum(bq * bq) + EPS)) * scale
    bk = bk * (1.0 / tl.sqrt(tl.sum(bk * bk) + EPS))
    bv = tl.load(v + r * s_vt + h * s_vh + offs_v).to(tl.float32)
    gv = tl.load(g + r * s_gt + h).to(tl.float32)
    bb = tl.load(beta + r * s_bt + h)
    if GATES:
        x = gv + tl.load(dt_bias + h).to(tl.float32)
        soft = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
        gv = -tl.exp(tl.load(a_log + h).to(tl.float32)) * soft
        bb = tl.sigmoid(bb.to(tl.float32)).to(beta.dtype.element_ty)
    decay = tl.exp(gv)
    bb = bb.to(tl.float32)
    slot = tl.load(slots + r).to(tl.int64)
    ptrs = state + slot * s_slot + h * s_h + offs_k[:, None] * s_dk + offs_v[None, :] * s_dv
    s = tl.load(ptrs) * decay  # [DK, BV]
    d = bb * (bv - tl.sum(s * bk[:, None], axis=0))
    s = s + bk[:, None] * d[None, :]
    tl.store(ptrs, s)
    out = tl.sum(s * bq[:, None], axis=0)
    tl.store(o + r * s_ot + h * s_oh + offs_v, out.to(o.dtype.element_ty))


def gdn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    scale: float,
    gates: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """One recurrent step per row, state updated in place at its slot.

    q, k [R, Hk, dk] (not normalised), v [R, Hv, dv], g, beta [R, Hv], state [slots, Hv, dk, dv]
    fp32 (any strides, e.g. a layer view of the slot-major pool), slots [R] int. The last dim of
    q, k, v and the head dim of g, beta must have stride 1. `gates` = (A_log, dt_bias) [Hv]:
    g and beta are the raw a and b projections, turned into gates in the kernel (one launch
    less per layer and step). Returns o [R, Hv, dv] in v.dtype.
    """
    rows, hv, dv = v.shape
    dk = k.shape[-1]
    if min(q.stride(-1), k.stride(-1), v.stride(-1), g.stride(-1), beta.stride(-1)) != 1:
        raise ValueError("gdn_decode needs unit stride along the head dims")
    o = torch.empty_like(v)
    bv = min(32, dv)
    a_log, dt_bias = gates if gates is not None else (g, g)  # unused without GATES
    _gdn_decode_kernel[(rows, hv, dv // bv)](
        q, k, v, g, beta, o, state, slots, scale, a_log, dt_bias,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), beta.stride(0), o.stride(0), o.stride(1), *state.stride(),
        GROUP=hv // k.shape[1], DK=dk, BV=bv, EPS=L2_EPS, GATES=gates is not None,
        num_warps=4,
    )  # fmt: skip
    return o


@dataclass(frozen=True, slots=True)
class PrefillMeta:
    """What fla's varlen kernel needs about a batch, built once per pass (not per GDN layer):
    cu_seqlens on the device (int64) and on the host, the chunk table, and the mask of rows
    that start from a zero state (None when there are none)."""

    cu_seqlens: torch.Tensor
    cu_seqlens_cpu: torch.Tensor
    chunk_indices: torch.Tensor
    fresh: torch.Tensor | None

    @classmethod
    def of(cls, batch: ForwardBatch) -> PrefillMeta:
        dev = batch.cu_q.device
        fresh = [c == 0 for c in batch.ctx_lens]
        return cls(
            cu_seqlens=batch.cu_q.long(),
            cu_seqlens_cpu=torch.tensor([0, *itertools.accumulate(batch.q_lens)]),
            chunk_indices=chunk_indices(batch.q_lens, dev),
            fresh=to_device(fresh, dev, torch.bool) if any(fresh) else None,
        )


def gdn_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
    meta: PrefillMeta | None = None,
) -> torch.Tensor:
    """All rows of a ragged batch through fla's varlen chunked kernel (chunk 64).

    Shapes as `ninfer.ops.base.Ops.gdn`. Reads and writes state[batch.state_slots]; rows with
    ctx_lens == 0 start from zeros. `meta`: `PrefillMeta.of(batch)`, shared by the pass's GDN
    layers (built here when None). Returns o [T, Hv, dv] in v.dtype.
    """
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    meta = meta or PrefillMeta.of(batch)
    slots = batch.state_slots
    h0 = state[slots]
    if meta.fresh is not None:
        h0.masked_fill_(meta.fresh[:, None, None, None], 0.0)
    q, k, v, g, beta = (x.contiguous()[None] for x in (q, k, v, g.float(), beta))
    o, final = chunk_gated_delta_rule(
        q, k, v, g, beta, scale=scale,
        initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
        cu_seqlens=meta.cu_seqlens, cu_seqlens_cpu=meta.cu_seqlens_cpu,
        chunk_indices=meta.chunk_indices,
    )  # fmt: skip
    state[slots] = final.to(state.dtype)
    return o[0].to(v.dtype)
