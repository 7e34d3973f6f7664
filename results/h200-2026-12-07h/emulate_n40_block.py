"""CPU emulation of tests/ops/test_cuda_fp8.py's N40 MoE block (35B-A3B shapes, 128 x 128
blocks): why the GPU's unfused block lay 0.014-0.015 from its oracle (call R2 of 2026-12-07g).

The unfused block's shared expert runs silu_mul (CudaOps: a Triton kernel that rounds
silu(gate) * up once) and then the prefill GEMM, which quantises its input to e4m3. The
reference's silu_mul rounds silu's output to bf16 first (as transformers' MLP does). Prints
the shared expert's and the block's relative error between the two roundings, against the
spread of fp32 / fp64 sums and of rounded / unrounded expert weights.

    python3 results/h200-2026-12-07h/emulate_n40_block.py [block128 | per-channel]
    (about 40 s on 2 cores; per-channel: one weight scale per row, x scaled per token)
"""

import sys

import torch
import torch.nn.functional as F

from ninfer.ops.cuda.fp8 import quantize_groups_ref
from ninfer.ops.fp8 import quantize_fp8
from ninfer.ops.reference import moe_ref
from ninfer.ops.reference.dense import route_ref

E, H, INTER, TOP_K, N = 256, 2048, 512, 8, 40
PER_CHANNEL = sys.argv[1:] == ["per-channel"]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def experts(e, seed):
    g = torch.Generator().manual_seed(seed)
    gu = torch.randn(e, 2 * INTER, H, generator=g) * 0.02
    d = torch.randn(e, H, INTER, generator=g) * 0.02
    if PER_CHANNEL:
        return quantize_fp8(gu, (1, H)), quantize_fp8(d, (1, INTER))
    return quantize_fp8(gu, (128, 128)), quantize_fp8(d, (128, 128))


gen = torch.Generator().manual_seed(4)
x = torch.randn(N, H, generator=gen).bfloat16()
router = (torch.randn(E + 1, H, generator=gen) * 0.02).bfloat16()
gate_up, down = experts(E, 1)
s_gate_up, s_down = (w.expert(0) for w in experts(1, 5))


def prefill_linear(a, w, acc):
    """x quantised per token per 128 columns, times the dequantised weight, sums in acc."""
    group = a.shape[1] if PER_CHANNEL else 128  # per token, or per token per 128 columns
    q, xs = quantize_groups_ref(a, group)
    xq = q.to(acc) * xs.to(acc).repeat_interleave(group, 1)
    return F.linear(xq, w.dequantize(torch.float64).to(acc)).to(a.dtype)


def shared(acc, once):
    g, u = prefill_linear(x, s_gate_up, acc).chunk(2, -1)
    h = (F.silu(g.float()) * u.float()).bfloat16() if once else F.silu(g) * u
    gate = F.linear(x.float(), router[E:].float()).bfloat16()
    return prefill_linear(h, s_down, acc) * gate.sigmoid()


def routed_unrounded():
    """The FP8 grouped GEMM's arithmetic: dequantised weights never rounded (fp64 here)."""
    w, ids = route_ref(x, router[:E], TOP_K)
    out = torch.zeros(N, H, dtype=torch.float64)
    for t in range(N):
        for j in range(TOP_K):
            ex = ids[t, j].item()
            gu, d = (m.expert(ex).dequantize(torch.float64) for m in (gate_up, down))
            g, u = (gu @ x[t].double()).bfloat16().chunk(2)
            y = (d @ (F.silu(g) * u).double()).bfloat16().double() * w[t, j].double()
            out[t] += y.bfloat16().double()
    return out.bfloat16()


ref_routed = moe_ref(x, router[:E], gate_up, down, TOP_K)  # weights rounded to bf16
op_routed = routed_unrounded()
twice32, once32 = shared(torch.float32, False), shared(torch.float32, True)
once64 = shared(torch.float64, True)
op_block = op_routed + once64
print(f"shared, fp32 against fp64 sums (one rounding): {rel(once32, once64):.2e}")
print(f"shared, silu_mul rounded once against twice:  {rel(once32, twice32):.4f}")
print(f"routed, unrounded against bf16-rounded weights: {rel(op_routed, ref_routed):.4f}")
print(f"block, op against the twice-rounding oracle:   {rel(op_block, ref_routed + twice32):.4f}")
print(f"block, op against the once-rounding oracle:    {rel(op_block, ref_routed + once32):.4f}")
