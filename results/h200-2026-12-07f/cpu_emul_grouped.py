"""CPU emulation (no GPU) of test_fp8_grouped_gemm_against_the_grouped_path_on_dequantised_experts'
roundings: the MoE with the dequantised experts unrounded (as the FP8 grouped GEMM) against the
same with the experts rounded to bf16 (the grouped path on `dequantize(bf16)`), each projection
rounded to bf16, SwiGLU and the routing weight's product in bf16, the top-k terms summed in
bf16. Also fp32 against float64 sums, and the top-k sums in reverse order. From the repository
root:

    python3 results/h200-2026-12-07f/cpu_emul_grouped.py 1000 b128   # or 40; pc: per-channel
"""

import sys

import torch
import torch.nn.functional as F

from ninfer.ops.fp8 import quantize_fp8
from ninfer.ops.reference.dense import route_ref

torch.manual_seed(0)
e, h, i, top_k, n = 256, 2048, 512, 8, int(sys.argv[1])
per_channel = sys.argv[2] == "pc"
gate_up = quantize_fp8(torch.randn(e, 2 * i, h) * 0.02, (1, h) if per_channel else (128, 128))
down = quantize_fp8(torch.randn(e, h, i) * 0.02, (1, i) if per_channel else (128, 128))
G, D = gate_up.dequantize(torch.float32), down.dequantize(torch.float32)
x = torch.randn(n, h).to(torch.bfloat16)
router = (torch.randn(e, h) * 0.02).to(torch.bfloat16)
weights, ids = route_ref(x, router, top_k)


def run(gw, dw, acc=torch.float64, order=range(top_k)):
    ys = torch.zeros(n, top_k, h, dtype=torch.bfloat16)
    for ex in range(e):
        t, j = (ids == ex).nonzero(as_tuple=True)
        if len(t):
            g, u = (x[t].to(acc) @ gw[ex].to(acc).t()).to(torch.bfloat16).chunk(2, -1)
            y = ((F.silu(g) * u).to(acc) @ dw[ex].to(acc).t()).to(torch.bfloat16)
            ys[t, j] = y * weights[t, j, None]
    out = torch.zeros(n, h, dtype=torch.bfloat16)
    for j in order:
        out += ys[:, j]
    return out


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


exact = run(G, D)
print(n, sys.argv[2], "unrounded against bf16 weights", rel(exact, run(G.bfloat16(), D.bfloat16())))
print("fp32 against float64 sums", rel(run(G, D, torch.float32), exact))
print("top-k sums reversed", rel(run(G, D, order=reversed(range(top_k))), exact))
