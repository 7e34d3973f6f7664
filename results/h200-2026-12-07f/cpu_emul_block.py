"""CPU emulation (no GPU) of test_fp8_moe_block_with_its_shared_expert[N40-*]: the reference block
(`moe_ref` on experts dequantised to bf16, the shared expert through the prefill GEMM's
arithmetic) against the same block with the routed experts unrounded (as the FP8 grouped GEMM
serves 40 tokens), their top-k terms summed in either order. From the repository root:

    python3 results/h200-2026-12-07f/cpu_emul_block.py b128   # or pc (per-channel)
"""

import sys

import torch
import torch.nn.functional as F

from ninfer.ops.cuda.fp8 import ACT_EPS, quantize_groups_ref
from ninfer.ops.fp8 import FP8_DTYPE, FP8_MAX, Fp8Weight, quantize_fp8
from ninfer.ops.reference import ReferenceOps, moe_ref
from ninfer.ops.reference.dense import moe_block_ref, route_ref

torch.manual_seed(4)
e, h, i, top_k, n = 256, 2048, 512, 8, 40
per_channel = sys.argv[1] == "pc"


def experts(count, seed):
    g = torch.Generator().manual_seed(seed)
    gu = torch.randn(count, 2 * i, h, generator=g) * 0.02
    dn = torch.randn(count, h, i, generator=g) * 0.02
    blocks = ((1, h), (1, i)) if per_channel else ((128, 128), (128, 128))
    return quantize_fp8(gu, blocks[0]), quantize_fp8(dn, blocks[1])


def prefill_linear_ref(x, w):  # as tests/ops/test_cuda_fp8.py's
    if not isinstance(w, Fp8Weight):
        return F.linear(x.float(), w.float()).to(x.dtype)
    if w.per_channel:
        xf = x.float()
        xs = xf.abs().amax(dim=-1, keepdim=True).clamp(min=ACT_EPS) / FP8_MAX
        xq = (xf / xs).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float() * xs
    else:
        q, xs = quantize_groups_ref(x, 128)
        xq = q.float() * xs.repeat_interleave(128, dim=1)
    return F.linear(xq, w.dequantize(torch.float32)).to(x.dtype)


def unrounded_moe(order):
    def moe(x, router, gate_up, down, top_k):
        weights, ids = route_ref(x, router, top_k)
        ys = torch.zeros(x.shape[0], top_k, h, dtype=x.dtype)
        for ex in ids.unique().tolist():
            t, j = torch.where(ids == ex)
            gw = gate_up.expert(ex).dequantize(torch.float32)
            dw = down.expert(ex).dequantize(torch.float32)
            g, u = (x[t].float() @ gw.t()).to(x.dtype).chunk(2, -1)
            ys[t, j] = ((F.silu(g) * u).float() @ dw.t()).to(x.dtype) * weights[t, j, None]
        out = torch.zeros_like(x)
        for j in order:
            out += ys[:, j]
        return out

    return moe


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


x = torch.randn(n, h).to(torch.bfloat16)
router = (torch.randn(e + 1, h) * 0.02).to(torch.bfloat16)
gu, dn = experts(e, 1)
sgu, sd = (w.expert(0) for w in experts(1, 5))
ops = ReferenceOps()
args = (x, router, gu, dn, sgu, sd, top_k)
ref = moe_block_ref(*args, moe_ref, prefill_linear_ref, ops.silu_mul, ops.sigmoid_mul)
for name, order in (("slot order", range(top_k)), ("reversed", reversed(range(top_k)))):
    moe = unrounded_moe(list(order))
    got = moe_block_ref(*args, moe, prefill_linear_ref, ops.silu_mul, ops.sigmoid_mul)
    print(sys.argv[1], name, rel(got, ref))
