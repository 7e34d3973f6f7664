"""Plain-PyTorch gated delta rule: the chunked (prefill) and recurrent (decode) forms.

Both compute, per batch entry and value head, with S in R^{dk x dv} (fp32):

    S_t = exp(g_t) S_{t-1};  d_t = beta_t (v_t - S_t^T k_t);  S_t += k_t d_t^T;  o_t = S_t^T q_t

after q and k are L2-normalised (eps 1e-6, fp32) and q is multiplied by `scale`. Layout follows
flash-linear-attention: q, k [B, T, Hk, dk], v [B, T, Hv, dv], g, beta [B, T, Hv]; value head j
uses key head j // (Hv // Hk). These functions know nothing about ragged batches or state pools.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(sum(x^2) + eps) over the last dim (the form fla and transformers use)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(q, k, v, g, beta, scale, use_qk_l2norm):
    """Repeats key heads, moves heads before time ([B, H, T, *]) and casts to fp32 (fp64 stays
    fp64, for tests)."""
    rep = v.shape[2] // k.shape[2]
    q, k = (x.repeat_interleave(rep, dim=2) for x in (q, k))
    dtype = torch.promote_types(v.dtype, torch.float32)
    q, k, v, g, beta = (x.transpose(1, 2).to(dtype) for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    return q * scale, k, v, g, beta


def _initial(initial_state, k, v) -> torch.Tensor:
    if initial_state is None:
        b, h, _, dk = k.shape
        return k.new_zeros(b, h, dk, v.shape[-1])
    return initial_state.to(v.dtype)


def recurrent_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule.

    q, k [B, T, Hk, dk]; v [B, T, Hv, dv]; g [B, T, Hv] log-decay (<= 0); beta [B, T, Hv];
    initial_state [B, Hv, dk, dv] or None (zeros). Returns o [B, T, Hv, dv] in v.dtype and the
    final state [B, Hv, dk, dv] fp32.
    """
    out_dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta, scale, use_qk_l2norm)
    s = _initial(initial_state, k, v)
    o = torch.empty_like(v)
    for t in range(v.shape[2]):
        s = s * g[:, :, t, None, None].exp()
        k_t = k[:, :, t]
        delta = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", s, k_t))
        s = s + k_t[..., :, None] * delta[..., None, :]
        o[:, :, t] = torch.einsum("bhkv,bhk->bhv", s, q[:, :, t])
    return o.transpose(1, 2).to(out_dtype), s


def chunk_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule (same maths as the recurrent form, same shapes and results).

    Inside a chunk with cumulative decay G_t = prod_{s<=t} exp(g_s) and entering state S0, the
    updates D = [d_t] solve (I + A) D = beta V - beta G K S0 with A[t, j] = beta_t (G_t / G_j)
    k_t.k_j for j < t (unit lower triangular); then
        o_t = G_t S0^T q_t + sum_{j<=t} (G_t / G_j) (q_t.k_j) d_j
        S   = G_C S0 + sum_j (G_C / G_j) k_j d_j^T.
    Padding tokens have g = 0, beta = 0 and k = 0, so they change nothing.
    """
    out_dtype = v.dtype
    seq_len = v.shape[1]
    q, k, v, g, beta = _prepare(q, k, v, g, beta, scale, use_qk_l2norm)
    s = _initial(initial_state, k, v)
    pad = (-seq_len) % chunk_size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    b, h, t_pad, dk = k.shape
    n, c = t_pad // chunk_size, chunk_size
    q, k, v = (x.reshape(b, h, n, c, -1) for x in (q, k, v))
    g, beta = g.reshape(b, h, n, c), beta.reshape(b, h, n, c)

    cum = g.cumsum(dim=-1)  # log G_t within each chunk
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2) * decay).tril(-1)
    system = system + torch.eye(c, dtype=system.dtype, device=system.device)
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(
        system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True
    )
    intra = q @ k.transpose(-1, -2) * decay
    q_decayed = q * cum.exp()[..., None]
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]

    o = torch.empty_like(v)
    for i in range(n):
        d = u[:, :, i] - w[:, :, i] @ s
        o[:, :, i] = q_decayed[:, :, i] @ s + intra[:, :, i] @ d
        s = s * cum[:, :, i, -1, None, None].exp() + k_to_end[:, :, i].transpose(-1, -2) @ d
    o = o.reshape(b, h, t_pad, -1)[:, :, :seq_len]
    return o.transpose(1, 2).to(out_dtype), s
