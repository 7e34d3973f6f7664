"""Plain-PyTorch causal depthwise conv1d with SiLU, for one sequence or a batch of one-token steps.

The state is the last K-1 *inputs* (not outputs) before the current token, channel-major
[C, K-1], oldest first, as in the `causal_conv1d` package. Math is fp32 (fp64 for fp64 inputs,
for tests); results are cast back to the input dtype. Knows nothing about ragged batches or
state pools.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d_ref(
    x: torch.Tensor, weight: torch.Tensor, initial_state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """y[t, c] = silu(sum_j weight[c, j] * X[t + j, c]) with X = concat(state^T, x) over time.

    x [T, C]; weight [C, K] (weight[:, K-1] multiplies the current token); initial_state
    [C, K-1] or None (zeros). Returns y [T, C] in x.dtype and the final state [C, K-1] in x.dtype
    (the last K-1 inputs, taking from initial_state when T < K-1).
    """
    width = weight.shape[1]
    if initial_state is None:
        initial_state = x.new_zeros(x.shape[1], width - 1)
    xs = torch.cat([initial_state.t().to(x.dtype), x], dim=0)  # [T + K - 1, C]
    acc = torch.promote_types(x.dtype, torch.float32)
    windows = xs.to(acc).unfold(0, width, 1)  # [T, C, K]
    y = F.silu((windows * weight.to(acc)).sum(dim=-1))
    return y.to(x.dtype), xs[xs.shape[0] - (width - 1) :].t()


def causal_conv1d_update_ref(
    x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step for N independent sequences.

    x [N, C] (one token each); weight [C, K]; state [N, C, K-1]. Returns y [N, C] in x.dtype and
    the new state [N, C, K-1] in state.dtype (shifted left by one, x appended). Does not write
    into `state`.
    """
    window = torch.cat([state.to(x.dtype), x[:, :, None]], dim=-1)  # [N, C, K]
    acc = torch.promote_types(x.dtype, torch.float32)
    y = F.silu((window.to(acc) * weight.to(acc)).sum(dim=-1))
    return y.to(x.dtype), window[:, :, 1:].to(state.dtype)
