"""FP8 linear weights: e4m3 values with one fp32 scale per block, and their torch reference.

A weight W [N, K] is stored as `qweight` (float8_e4m3fn, [N, K]) and `scale` (fp32,
[ceil(N / bn), ceil(K / bk)]) for a block of (bn, bk) = `block`:

    W[n, k] ~= float(qweight[n, k]) * scale[n // bn, k // bk]

The fine-grained checkpoints use 128 x 128 blocks (`weight_scale_inv`, a multiplier despite its
name); a per-channel scale (compressed-tensors' `weight_scale` [N, 1]) is the block (1, K).
MoE experts stack E weights: qweight [E, N, K], scale [E, ceil(N / bn), ceil(K / bk)].
`Ops.linear` accepts an `Fp8Weight` wherever it accepts a weight tensor; the reference op
dequantises it and multiplies in the activations' dtype (the oracle of the FP8 kernels).
Knows nothing about checkpoints or the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """The scale's shape for a weight of `shape` ([..., N, K]) in blocks of `block`."""
    *lead, n, k = shape
    return (*lead, -(-n // block[0]), -(-k // block[1]))


def _expand(scale: torch.Tensor, n: int, k: int, block: tuple[int, int]) -> torch.Tensor:
    """scale [..., ceil(N/bn), ceil(K/bk)] repeated over its blocks to [..., N, K]."""
    full = scale.repeat_interleave(block[0], dim=-2)[..., :n, :]
    return full.repeat_interleave(block[1], dim=-1)[..., :k]


@dataclass(frozen=True, slots=True)
class Fp8Weight:
    """A block-scaled FP8 weight: qweight [..., N, K] e4m3, scale fp32 (module docstring)."""

    qweight: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]

    def __post_init__(self) -> None:
        if self.qweight.dtype != FP8_DTYPE:
            raise ValueError(f"Fp8Weight needs {FP8_DTYPE} values, got {self.qweight.dtype}")
        want = scale_shape(tuple(self.qweight.shape), self.block)
        if tuple(self.scale.shape) != want:
            raise ValueError(
                f"Fp8Weight of shape {list(self.qweight.shape)} in blocks {list(self.block)} "
                f"needs scales {list(want)}, got {list(self.scale.shape)}"
            )

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    @property
    def per_channel(self) -> bool:
        """One scale per output row (the block spans all of K)."""
        return self.block[0] == 1 and self.block[1] >= self.qweight.shape[-1]

    def expert(self, e: int) -> Fp8Weight:
        """Expert `e` of a stacked [E, N, K] weight."""
        return Fp8Weight(self.qweight[e], self.scale[e], self.block)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """qweight * scale (fp32 products, broadcast per block), rounded to `dtype`."""
        n, k = self.qweight.shape[-2:]
        full = _expand(self.scale.float(), n, k, self.block)
        return (self.qweight.float() * full).to(dtype)


def quantize_fp8(w: torch.Tensor, block: tuple[int, int]) -> Fp8Weight:
    """`w` [..., N, K] as e4m3 with one scale per block: scale = amax(|block|) / FP8_MAX (1 for
    an all-zero block), values w / scale rounded to nearest (what the fine-grained FP8
    checkpoints hold)."""
    n, k = w.shape[-2:]
    pad_n, pad_k = -n % block[0], -k % block[1]
    wf = torch.nn.functional.pad(w.float(), (0, pad_k, 0, pad_n))
    *lead, pn, pk = wf.shape
    tiles = wf.view(*lead, pn // block[0], block[0], pk // block[1], block[1])
    amax = tiles.abs().amax(dim=(-3, -1))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (w.float() / _expand(scale, n, k, block)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return Fp8Weight(q, scale.contiguous(), block)


def fp8_linear_ref(x: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    """x [T, K] @ dequantize(weight)^T [K, N] -> [T, N] in x.dtype (weight dequantised to
    x.dtype first: the products of a bf16 model whose weights are qweight * scale)."""
    return torch.nn.functional.linear(x, weight.dequantize(x.dtype))
