"""`Fp8Linear`: the model's slot for a linear layer whose weight is block-scaled FP8.

It holds the two tensors under the checkpoint's own names (`weight` e4m3 [N, K] and
`weight_scale_inv` fp32 [ceil(N / bn), ceil(K / bk)], `ninfer.ops.fp8`), so loading stays a
name match, and hands the op set an `Fp8Weight` (`packed`). Which modules become FP8 is
`ninfer.models.quantize`'s decision. Knows nothing about checkpoints.
"""

from __future__ import annotations

import torch
from torch import nn

from ninfer.ops.fp8 import FP8_DTYPE, Fp8Weight, quantize_fp8, scale_shape


class Fp8Linear(nn.Module):
    """A bias-free linear layer with an FP8 weight in blocks of `block` (bn, bk)."""

    def __init__(
        self, n_in: int, n_out: int, block: tuple[int, int], device: torch.device | str | None
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.block = n_in, n_out, block
        q = torch.empty(n_out, n_in, dtype=FP8_DTYPE, device=device)
        s = torch.empty(scale_shape((n_out, n_in), block), dtype=torch.float32, device=device)
        self.weight = nn.Parameter(q, requires_grad=False)
        self.weight_scale_inv = nn.Parameter(s, requires_grad=False)

    @classmethod
    def quantized(cls, linear: nn.Linear, block: tuple[int, int]) -> Fp8Linear:
        """`linear`'s weight quantised to e4m3 in blocks of `block` (`quantize_fp8`)."""
        n_out, n_in = linear.weight.shape
        out = cls(n_in, n_out, block, device="meta")
        packed = quantize_fp8(linear.weight.detach(), block)
        out.weight = nn.Parameter(packed.qweight, requires_grad=False)
        out.weight_scale_inv = nn.Parameter(packed.scale, requires_grad=False)
        return out

    @property
    def packed(self) -> Fp8Weight:
        return Fp8Weight(self.weight, self.weight_scale_inv, self.block)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, block={self.block}"


def fuses_with(linears: list[nn.Module]) -> bool:
    """Whether `linears` can share one row-fused weight: all dense of one dtype, or all FP8
    of one block with every part's N a multiple of the block's rows (each part's scale rows
    then stay its own)."""
    first = linears[0]
    if isinstance(first, Fp8Linear):
        return all(
            isinstance(m, Fp8Linear)
            and m.block == first.block
            and m.weight.shape[0] % m.block[0] == 0
            for m in linears
        )
    return all(isinstance(m, nn.Linear) and m.weight.dtype == first.weight.dtype for m in linears)
