"""Plain-PyTorch token-wise ops: the two RMSNorms, partial NeoX RoPE and the MoE experts.

Dtype behaviour follows transformers' Qwen3.5 modules (fp32 statistics, results in the input
dtype) so that fp32 and bf16 runs compare like for like. Knows nothing about batches or caches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.ops.fp8 import Fp8Weight, fp8_linear_ref


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm: x [..., D], weight [D] -> x * rsqrt(mean(x^2) + eps) * (1 + w)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (y * (1.0 + weight.float())).to(x.dtype)


def add_rms_norm_ref(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, rms_norm(s)) with s = x + delta in x.dtype (s = x when delta is None)."""
    s = x if delta is None else x + delta
    return s, rms_norm_ref(s, weight, eps)


def gdn_gates_ref(
    a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDN decay and write strength from the a, b projections [T, Hv]: g = -exp(A_log) *
    softplus(a + dt_bias) in fp32 (<= 0), beta = sigmoid(b) in b.dtype."""
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.sigmoid()


def silu_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU glue: silu(gate) * up, in gate.dtype."""
    return F.silu(gate) * up


def sigmoid_mul_ref(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Output gate: x * sigmoid(gate) (gate broadcast to x), in x.dtype."""
    return x * gate.sigmoid()


def gated_rms_norm_ref(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Norm then SiLU gate: x, z [..., dv]; weight [dv] (plain scale, not zero-centred)."""
    xf = x.float()
    n = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    return ((weight * n) * F.silu(z.float())).to(x.dtype)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, R] for positions [T] and inv_freq [R/2] (fp32 math, cast to dtype);
    positions [T, R/2]: a position per token and frequency (multimodal RoPE)."""
    pos = positions.float() if positions.dim() == 2 else positions.float()[:, None]
    freqs = pos * inv_freq.float()[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope_ref(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int
) -> torch.Tensor:
    """NeoX rotation of x [T, H, D] on dims [0, rotary_dim) with cos, sin [T, rotary_dim]."""
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([rot * cos + rotated * sin, rest], dim=-1)


def route_ref(
    x: torch.Tensor, router_weight: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax (fp32) top-k routing, renormalised. x [N, H], router_weight [E, H].

    Returns weights [N, top_k] in x.dtype and expert ids [N, top_k] int64.
    """
    probs = F.linear(x, router_weight).float().softmax(dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(x.dtype), ids


def linear_ref(x: torch.Tensor, weight: torch.Tensor | Fp8Weight) -> torch.Tensor:
    """F.linear without bias; an FP8 weight is dequantised to x.dtype first."""
    if isinstance(weight, Fp8Weight):
        return fp8_linear_ref(x, weight)
    return F.linear(x, weight)


def expert_weight(w: torch.Tensor | Fp8Weight, e: int, dtype: torch.dtype) -> torch.Tensor:
    """Expert `e` of stacked expert weights [E, N, K] (FP8: dequantised to `dtype`)."""
    return w.expert(e).dequantize(dtype) if isinstance(w, Fp8Weight) else w[e]


def moe_ref(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor | Fp8Weight,
    down: torch.Tensor | Fp8Weight,
    top_k: int,
) -> torch.Tensor:
    """Routed experts: x [N, H]; gate_up [E, 2I, H] (first I rows gate); down [E, H, I] (FP8:
    the experts that received tokens are dequantised to x.dtype per call).

    Loops over the experts that received tokens (syncs with the host). Returns [N, H] x.dtype.
    """
    weights, ids = route_ref(x, router_weight, top_k)
    out = torch.zeros_like(x)
    for e in ids.unique().tolist():
        token, slot = torch.where(ids == e)
        w_gate_up, w_down = expert_weight(gate_up, e, x.dtype), expert_weight(down, e, x.dtype)
        gate, up = F.linear(x[token], w_gate_up).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w_down) * weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


def moe_block_experts(router_weight: torch.Tensor, gate_up: torch.Tensor) -> int:
    """E of a MoE block's experts gate_up [E, 2I, H]; ValueError unless router_weight is
    [E + 1, H] (the router's E rows, then the shared expert's gate row)."""
    num_experts = gate_up.shape[0]
    if router_weight.shape[0] != num_experts + 1:
        raise ValueError(
            f"moe_block needs router_weight [E + 1, H], got {tuple(router_weight.shape)} for "
            f"E={num_experts}"
        )
    return num_experts


def moe_block_ref(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    shared_gate_up: torch.Tensor,
    shared_down: torch.Tensor,
    top_k: int,
    moe=moe_ref,
    linear=linear_ref,
    silu_mul=silu_mul_ref,
    sigmoid_mul=sigmoid_mul_ref,
) -> torch.Tensor:
    """The whole MoE block: routed experts plus the sigmoid-gated shared expert.

    router_weight [E + 1, H] (the router's E rows, then the shared expert's gate row);
    gate_up [E, 2I, H], down [E, H, I] as `moe_ref`; shared_gate_up [2Is, H] (first Is rows
    gate), shared_down [H, Is]. Composed from the separate ops, each rounding to x.dtype as
    the model's unfused forward does: routed = moe(x, router_weight[:E], ...); shared =
    linear(silu_mul(g, u), shared_down) with g | u = linear(x, shared_gate_up);
    out = routed + sigmoid_mul(shared, linear(x, router_weight[E:])). The ops default to the
    reference ones (`ReferenceOps.moe_block`); `CudaOps.moe_block` passes its own where its
    fused path does not apply.
    """
    e = moe_block_experts(router_weight, gate_up)
    routed = moe(x, router_weight[:e], gate_up, down, top_k)
    gate, up = linear(x, shared_gate_up).chunk(2, dim=-1)
    shared = linear(silu_mul(gate, up), shared_down)
    return routed + sigmoid_mul(shared, linear(x, router_weight[e:]))
