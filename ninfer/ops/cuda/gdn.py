"""Gated delta rule over a slot-indexed fp32 state pool: chunked prefill (fla-core's stages), an
in-place Triton decode step, and short rows token by token (`gdn_rows`, speculative verify).

Prefill (any batch with a row of more than one token, or a row starting a sequence): the rows'
states are gathered from the pool (zeros for fresh rows, one launch), fla's varlen chunked
stages run over all rows at once (cu_seqlens), and the final states are scattered back; no host
sync, capturable in a CUDA graph. Decode (every row one token after a cached context): one
Triton launch reads each row's state from the pool by slot, through the pool's strides, and
writes it back in place: no per-step gather or scatter copies, no host sync, capturable.
Knows nothing about the model or the pool's other layers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.ops.cuda.passmeta import CHUNK, PassMeta

L2_EPS = 1e-6


@triton.jit
def _gates(a, b, a_log, dt_bias, h, beta):
    """The gates of value head h from its raw a and b projections, as `gdn_gates_ref`: g =
    -exp(A_log) softplus(a + dt_bias) in fp32, beta = sigmoid(b) rounded to `beta`'s dtype."""
    x = a.to(tl.float32) + tl.load(dt_bias + h).to(tl.float32)
    soft = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    g = -tl.exp(tl.load(a_log + h).to(tl.float32)) * soft
    return g, tl.sigmoid(b.to(tl.float32)).to(beta.dtype.element_ty)


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
        gv, bb = _gates(gv, bb, a_log, dt_bias, h, beta)
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


@triton.jit
def _gdn_rows_kernel(
    q, k, v, g, beta, o, state, slots, has_state, cu, tap_tok, scale, a_log, dt_bias,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_gt, s_bt, s_ot, s_oh,
    s_slot, s_h, s_dk, s_dv,
    GROUP: tl.constexpr, DK: tl.constexpr, BV: tl.constexpr, GATES: tl.constexpr,
):  # fmt: skip
    """One program: row r, value head h, value columns [vb * BV, (vb + 1) * BV): the row's
    tokens [cu[r], cu[r+1]) one at a time from the state at its slot (zeros for a fresh row),
    as `_gdn_decode_kernel` steps one; q, k L2-normalised, g the log decay, beta the gate.
    After token t the state goes to slot tap_tok[t] too when that is >= 0 (a state tap); after
    the row's last token, back to the row's slot. GATES: g and beta hold the raw a and b
    projections, turned into gates here (`_gates`)."""
    r, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    hk = h // GROUP
    offs_k = tl.arange(0, DK)
    offs_v = vb * BV + tl.arange(0, BV)
    bos = tl.load(cu + r).to(tl.int64)
    eos = tl.load(cu + r + 1).to(tl.int64)
    slot = tl.load(slots + r).to(tl.int64)
    cell = h * s_h + offs_k[:, None] * s_dk + offs_v[None, :] * s_dv
    s = tl.load(state + slot * s_slot + cell)
    s = tl.where(tl.load(has_state + r) != 0, s, 0.0)  # a fresh slot's content never leaks in
    for t in range(bos, eos):
        bq = tl.load(q + t * s_qt + hk * s_qh + offs_k).to(tl.float32) * scale
        bk = tl.load(k + t * s_kt + hk * s_kh + offs_k).to(tl.float32)
        bv = tl.load(v + t * s_vt + h * s_vh + offs_v).to(tl.float32)
        gv = tl.load(g + t * s_gt + h).to(tl.float32)
        bb = tl.load(beta + t * s_bt + h)
        if GATES:
            gv, bb = _gates(gv, bb, a_log, dt_bias, h, beta)
        decay = tl.exp(gv)
        bb = bb.to(tl.float32)
        s = s * decay
        d = bb * (bv - tl.sum(s * bk[:, None], axis=0))
        s = s + bk[:, None] * d[None, :]
        out = tl.sum(s * bq[:, None], axis=0)
        tl.store(o + t * s_ot + h * s_oh + offs_v, out.to(o.dtype.element_ty))
        tap = tl.load(tap_tok + t)
        if tap >= 0:
            tl.store(state + tap * s_slot + cell, s)
    tl.store(state + slot * s_slot + cell, s)


def gdn_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    scale: float,
    meta: PassMeta,
    gates: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The rows of a pass of short rows (`meta.tap_tok` set: the speculative verify graphs'
    rows of K + 1 tokens) through the recurrence token by token, one launch: the state is
    read once and written once per row, plus once per tap, where the chunked path
    (`gdn_prefill`) gathers, scatters and advances its taps in a dozen launches per layer.
    q, k [T, Hk, dk] L2-normalised, v [T, Hv, dv], g [T, Hv] log decay, beta [T, Hv]; state
    [slots, Hv, dk, dv] fp32 (any strides); `meta.tap_tok` [T] int64: the slot that takes the
    state after each token, or -1. `gates` = (A_log, dt_bias) [Hv]: g and beta are the raw a
    and b projections, turned into gates in the kernel (as `gdn_decode`: two launches less per
    layer). Returns o [T, Hv, dv] in v.dtype."""
    n_tok, hv, dv = v.shape
    dk = k.shape[-1]
    if min(q.stride(-1), k.stride(-1), v.stride(-1), g.stride(-1), beta.stride(-1)) != 1:
        raise ValueError("gdn_rows needs unit stride along the head dims")
    o = torch.empty_like(v)
    bv = min(32, dv)
    rows = slots.shape[0]
    a_log, dt_bias = gates if gates is not None else (g, g)  # unused without GATES
    _gdn_rows_kernel[(rows, hv, dv // bv)](
        q, k, v, g, beta, o, state, slots, meta.has_state, meta.cu_seqlens, meta.tap_tok, scale,
        a_log, dt_bias,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), beta.stride(0), o.stride(0), o.stride(1), *state.stride(),
        GROUP=hv // k.shape[1], DK=dk, BV=bv, GATES=gates is not None, num_warps=4,
    )  # fmt: skip
    return o


@triton.jit
def _gather_states_kernel(
    state, slots, has_state, h0, s_slot, s_h, s_dk, s_dv,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """h0[r, h] = state[slots[r], h] for a row that continues a cached state, zeros for a fresh
    row (its slot is never read: whatever it holds, NaN included, cannot leak in)."""
    r, h, kb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    keep = tl.load(has_state + r) != 0
    slot = tl.load(slots + r).to(tl.int64)
    offs_k = kb * BK + tl.arange(0, BK)
    offs_v = tl.arange(0, DV)
    src = state + slot * s_slot + h * s_h + offs_k[:, None] * s_dk + offs_v[None, :] * s_dv
    x = tl.load(src, mask=keep & (offs_k[:, None] < DK), other=0.0)
    dst = h0 + ((r * tl.num_programs(1) + h) * DK + offs_k[:, None]) * DV + offs_v[None, :]
    tl.store(dst, x)


def gather_states(state: torch.Tensor, slots: torch.Tensor, has_state: torch.Tensor):
    """The rows' initial states [R, Hv, dk, dv] fp32 (contiguous) from the pool `state`
    [slots, Hv, dk, dv] (any strides): one launch."""
    _, hv, dk, dv = state.shape
    rows = slots.shape[0]
    h0 = torch.empty((rows, hv, dk, dv), dtype=torch.float32, device=state.device)
    bk = 16
    _gather_states_kernel[(rows, hv, dk // bk)](
        state, slots, has_state, h0, *state.stride(), DK=dk, DV=dv, BK=bk, num_warps=4
    )
    return h0


def gdn_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    scale: float,
    meta: PassMeta,
    normalized: bool = False,
) -> torch.Tensor:
    """All rows of a ragged batch through fla's varlen chunked stages (chunk 64).

    Shapes as `ninfer.ops.base.Ops.gdn`. Reads and writes state[slots]; rows with
    has_state == 0 start from zeros. `meta`: the pass's `PassMeta` (shared by its GDN layers).
    fla's stages are called directly, as its `chunk_gated_delta_rule` forward composes them
    (l2norm of q and k, chunk-local cumsum of g in log2 units, the fused intra-chunk solve, the
    inter-chunk state pass, the output), with every varlen table passed in: no autograd
    `Function`, no input guards, and nothing derived from `cu_seqlens` on the host or cached by
    tensor identity, so the same code runs inside a CUDA graph whose tables are refilled
    between replays. `normalized`: q and k are already L2-normalised and contiguous (as
    `conv.causal_conv_qkv` writes them), so the l2norm stage is skipped. The intra-chunk
    stage (w, u) is fla's kkt + triangular solve, stable when a chunk's keys are correlated (as
    repeated tokens make them; a product-of-matmuls inverse is not: `ninfer.bench.gdn_inverse`).
    State taps (`meta.taps`, eager passes): fla's inter-chunk stage keeps the state at the
    start of every chunk of every row (h, in k's dtype: bf16 for a bf16 model), so the state
    at a tap on a row's chunk grid is one gather from h into the tap's slot, rounded to k's
    dtype (within bf16 of the state a pass ending there leaves). A tap off the grid
    (`passmeta.TapRest`) starts from the state of the chunk it lies in (in the row's first
    chunk: the row's initial state, fp32) and runs the recurrence over the tokens of that chunk
    before it (fla's fused recurrent kernel, one launch for all such taps of the layer, fewer
    than CHUNK tokens each).
    A pass whose meta has `tap_tok` (the speculative verify graphs) runs `gdn_rows` instead.
    Returns o [T, Hv, dv] in v.dtype.
    """
    from fla.modules.l2norm import l2norm_fwd
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    if meta.tap_tok is not None:  # short rows: token by token (`gdn_rows`)
        if not normalized:
            q, k = (l2norm_fwd(x.contiguous(), eps=L2_EPS)[0] for x in (q, k))
        return gdn_rows(q, k, v, g, beta, state, slots, scale, meta)
    h0 = gather_states(state, slots, meta.has_state)
    gates = g  # natural-log gates, as the recurrent kernel reads them (off-grid taps)
    if not normalized:
        q, k = (l2norm_fwd(x.contiguous(), eps=L2_EPS)[0] for x in (q, k))
    q, k = q.contiguous()[None], k.contiguous()[None]
    v, beta = v.contiguous()[None], beta.contiguous()[None]
    tables = {"cu_seqlens": meta.cu_seqlens, "chunk_indices": meta.chunk_indices}
    g = chunk_local_cumsum(g.float().contiguous()[None], CHUNK, scale=RCP_LN2, **tables)
    w, u, _ = chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, chunk_size=CHUNK, **tables)
    h, v_new, final = chunk_gated_delta_rule_fwd_h(
        k=k, w=w, u=u, g=g, initial_state=h0, output_final_state=True, chunk_size=CHUNK,
        chunk_offsets=meta.chunk_offsets, **tables,
    )  # fmt: skip
    o = chunk_fwd_o(q=q, k=k, v=v_new, h=h, g=g, scale=scale, chunk_size=CHUNK, **tables)
    state[slots] = final.to(state.dtype)
    if meta.taps is not None:
        state[meta.taps.slot] = h[0, meta.taps.chunk].to(state.dtype)
        if meta.taps.rest is not None:
            _advance_taps(meta.taps.rest, h, h0, k, v, gates, beta, state)
    return o[0].to(v.dtype)


def _advance_taps(rest, h, h0, k, v, gates, beta, state) -> None:
    """Off-grid taps (`passmeta.TapRest`): each tap's chunk start state h[chunk] (in its row's
    first chunk: the row's initial state h0 [R, Hv, dk, dv], fp32) advanced over its tokens by
    fla's fused recurrent kernel (its output, with k standing in for q, unused), written to
    the tap's slot. k, v, beta [1, T, ...] as fla reads them; gates [T, Hv]."""
    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd

    idx = rest.tokens
    keys = k[0, idx][None]
    start = h[0, rest.chunk].float()
    if rest.opening is not None:
        start[rest.opening] = h0[rest.opening_row]
    _, final = fused_recurrent_gated_delta_rule_fwd(
        q=keys, k=keys, v=v[0, idx][None], g=gates[idx].float()[None], beta=beta[0, idx][None],
        scale=1.0, initial_state=start, output_final_state=True, cu_seqlens=rest.cu,
    )  # fmt: skip
    state[rest.slot] = final.to(state.dtype)
