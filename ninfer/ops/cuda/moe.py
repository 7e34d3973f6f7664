"""Routed experts of Qwen3.5-MoE without host synchronisation (capturable in a CUDA graph).

The reference (`moe_ref`) loops over the experts that received tokens, which needs their ids on
the host. Here the (token, expert) pairs are sorted by expert on the device and each projection
is one grouped GEMM over the sorted pairs (`torch._grouped_mm`, per-expert row offsets on the
device):

    pairs p = (token t, choice j), N * top_k of them, sorted by expert id (stable)
    offs[e] = number of pairs with expert id <= e          (scatter_add_ + cumsum, no sync)
    h  = grouped_mm(x[t_p], gate_up[e]^T)  -> silu(gate) * up
    y  = grouped_mm(h, down[e]^T) * w_p;   out[t_p] += y_p  (index_add_)

Dtypes other than bfloat16 (fp32 tests) gather each pair's expert weights and run one bmm: also
sync-free, but it copies the weights, so it is only meant for small models.
Knows nothing about the model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.ops.reference.dense import route_ref


def moe_grouped(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
) -> torch.Tensor:
    """`ninfer.ops.base.Ops.moe`: x [N, H]; gate_up [E, 2I, H]; down [E, H, I] -> [N, H]."""
    n, num_experts = x.shape[0], gate_up.shape[0]
    weights, ids = route_ref(x, router_weight, top_k)  # [N, k] x.dtype, int64
    flat = ids.reshape(-1)
    w = weights.reshape(-1, 1)
    token = torch.arange(n, device=x.device).repeat_interleave(top_k)
    if x.dtype != torch.bfloat16 or not hasattr(torch, "_grouped_mm"):
        gate, up = torch.bmm(gate_up[flat], x[token, :, None]).squeeze(-1).chunk(2, dim=-1)
        y = torch.bmm(down[flat], (F.silu(gate) * up)[:, :, None]).squeeze(-1) * w
        return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    tok = token[order]
    gate, up = torch._grouped_mm(x[tok], gate_up.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, down.transpose(-2, -1), offs=offs) * w[order]
    return torch.zeros_like(x).index_add_(0, tok, y.to(x.dtype))
