"""Block-scaled FP8 weights (`ninfer.ops.fp8`) and the reference linear / MoE on them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.ops.fp8 import FP8_DTYPE, FP8_MAX, Fp8Weight, quantize_fp8, scale_shape
from ninfer.ops.reference import ReferenceOps, moe_ref

_DIMS = st.integers(1, 70)
_BLOCKS = st.sampled_from([(1, 16), (16, 16), (32, 8), (8, 128), (128, 128)])


@settings(deadline=None, max_examples=40)
@given(n=_DIMS, k=_DIMS, block=_BLOCKS, seed=st.integers(0, 2**16), spread=st.floats(-6, 6))
def test_quantize_dequantize_error_is_within_e4m3_rounding(n, k, block, seed, spread):
    """Each block's scale is its amax / 448, so its largest value lands on +-448, and every value
    is within half an e4m3 step of its block's grid (3 mantissa bits: relative 2^-4, and an
    absolute floor of half the smallest subnormal, 2^-10 times the scale)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.exp(torch.randn(n, 1, generator=gen) * spread)
    packed = quantize_fp8(w, block)
    assert packed.qweight.dtype == FP8_DTYPE
    assert tuple(packed.scale.shape) == scale_shape((n, k), block)
    assert packed.scale.dtype == torch.float32
    back = packed.dequantize(torch.float32)
    full = packed.scale.repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]
    bound = torch.maximum(w.abs() * 2.0**-4, full * 2.0**-10)
    assert bool(((back - w).abs() <= bound * (1 + 1e-6)).all())
    amax = packed.qweight.float().abs().amax()
    assert amax == FP8_MAX or w.abs().max() == 0


def test_zero_block_scale_is_one():
    packed = quantize_fp8(torch.zeros(4, 4), (2, 2))
    assert torch.equal(packed.scale, torch.ones(2, 2))
    assert torch.equal(packed.dequantize(torch.float32), torch.zeros(4, 4))


def test_fp8_weight_checks_its_parts():
    q = torch.zeros(6, 5, dtype=FP8_DTYPE)
    with pytest.raises(ValueError, match=r"needs scales \[2, 1\]"):
        Fp8Weight(q, torch.ones(3, 1), (4, 8))
    with pytest.raises(ValueError, match="float8"):
        Fp8Weight(torch.zeros(6, 5), torch.ones(2, 1), (4, 8))
    assert Fp8Weight(q, torch.ones(6, 1), (1, 5)).per_channel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_linear_is_dequantise_then_matmul(dtype):
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(48, 40, generator=gen), torch.randn(5, 40, generator=gen).to(dtype)
    packed = quantize_fp8(w, (16, 16))
    got = ReferenceOps().linear(x, packed)
    assert got.dtype == dtype
    assert torch.equal(got, F.linear(x, packed.dequantize(dtype)))
    # dequantise in fp32, then round once: not fp8 -> dtype, then a dtype multiply
    full = packed.scale.repeat_interleave(16, 0).repeat_interleave(16, 1)[:, :40]
    manual = (packed.qweight.float() * full).to(dtype)
    assert torch.equal(packed.dequantize(dtype), manual)


def test_reference_moe_dequantises_the_chosen_experts():
    gen = torch.Generator().manual_seed(1)
    e, h, i, n = 4, 32, 16, 7
    x, router = torch.randn(n, h, generator=gen), torch.randn(e, h, generator=gen)
    gate_up = quantize_fp8(torch.randn(e, 2 * i, h, generator=gen), (16, 16))
    down = quantize_fp8(torch.randn(e, h, i, generator=gen), (16, 16))
    assert gate_up.expert(2).qweight.shape == (2 * i, h)
    got = moe_ref(x, router, gate_up, down, 2)
    want = moe_ref(x, router, gate_up.dequantize(x.dtype), down.dequantize(x.dtype), 2)
    assert torch.equal(got, want)


@pytest.mark.parametrize("n", [1, 3, 9], ids=["pairs<E", "pairs<E-2", "pairs>=E"])
def test_sync_free_fp8_moe_equals_the_reference(n):
    """`moe_dequantized` (CudaOps' FP8 experts, torch only: runs on the CPU too) against the
    reference over the same FP8 weights, on both of its branches (fewer pairs than experts:
    per-pair dequantisation; more: every expert dequantised once)."""
    from ninfer.ops.cuda.moe import moe_dequantized

    gen = torch.Generator().manual_seed(2)
    e, h, i, top_k = 8, 32, 16, 2
    x, router = torch.randn(n, h, generator=gen), torch.randn(e, h, generator=gen)
    gate_up = quantize_fp8(torch.randn(e, 2 * i, h, generator=gen), (16, 16))
    down = quantize_fp8(torch.randn(e, h, i, generator=gen), (16, 16))
    got = moe_dequantized(x, router, gate_up, down, top_k)
    want = moe_ref(x, router, gate_up, down, top_k)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
