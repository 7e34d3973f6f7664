"""`CudaOps`: the op contract (`ninfer.ops.base.Ops`) on FlashInfer, fla-core and Triton.

Attention (FlashInfer), GDN (fla-core prefill, own Triton decode) and the causal conv (own
Triton) have fast paths; norms, RoPE and MoE are the reference's torch code for now
(torch.compile of the model's dense parts is the plan for those). The kernel modules import
triton / flashinfer / fla, so they are imported when a `CudaOps` is built, not when this module
is.
"""

from __future__ import annotations

import torch

from ninfer.models.batch import ForwardBatch
from ninfer.ops.reference import ReferenceOps


class CudaOps(ReferenceOps):
    """Fast ops on one CUDA device. Plans attention once per `ForwardBatch` object: a caller
    must build a new batch (or change its row lengths) for every forward pass."""

    name = "cuda"

    def __init__(self, device: torch.device | str = "cuda") -> None:
        from ninfer.ops.cuda import conv, gdn
        from ninfer.ops.cuda.attention import PagedAttention

        self._attention = PagedAttention(torch.device(device))
        self._conv, self._gdn = conv, gdn

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        batch: ForwardBatch,
        scale: float,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> torch.Tensor:
        return self._attention(q, k, v, kv_cache, batch, scale, k_scale, v_scale)

    def causal_conv(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        conv_state: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        return self._conv.causal_conv(x, weight, conv_state, batch)

    def gdn(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
        batch: ForwardBatch,
        scale: float,
    ) -> torch.Tensor:
        if batch.is_decode:
            return self._gdn.gdn_decode(q, k, v, g, beta, state, batch.state_slots, scale)
        return self._gdn.gdn_prefill(q, k, v, g, beta, state, batch, scale)
