"""CPU emulation (no GPU) of one grouped projection: the output rounded to bf16 from the
unrounded dequantised weights (the FP8 grouped GEMM) and from weights rounded to bf16
(`_grouped_mm` on `dequantize(bf16)`), each against the float64 product. From the repository
root:

    python3 results/h200-2026-12-07f/cpu_emul_gemm.py
"""

import torch

from ninfer.ops.fp8 import quantize_fp8

torch.manual_seed(0)
experts, rows = 64, 31
for block in ((128, 128), (1, 2048)):
    w = quantize_fp8(torch.randn(experts, 1024, 2048) * 0.02, block)
    x = torch.randn(rows * experts, 2048).to(torch.bfloat16)
    parts = [x[j * rows : (j + 1) * rows] for j in range(experts)]
    exact = torch.cat([p.double() @ w.expert(j).dequantize(torch.float64).t()
                       for j, p in enumerate(parts)])  # fmt: skip
    ours = torch.cat([(p.float() @ w.expert(j).dequantize(torch.float32).t()).bfloat16()
                      for j, p in enumerate(parts)])  # fmt: skip
    bf16 = torch.cat([(p.float() @ w.expert(j).dequantize(torch.bfloat16).float().t()).bfloat16()
                      for j, p in enumerate(parts)])  # fmt: skip
    errs = [((a.double() - exact).norm() / exact.norm()).item() for a in (ours, bf16)]
    print(block, "unrounded weights", errs[0], "bf16 weights", errs[1])
