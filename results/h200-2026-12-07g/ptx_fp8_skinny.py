"""The FP8 GEMV (`ninfer.ops.cuda.fp8._fp8_skinny_kernel`) compiled for sm_90 on the CPU (no
GPU): per config that takes the shape, the PTX's tensor-core products (mma), divisions,
conversions and global loads, and ptxas's registers and spills. Every pointer and each int
divisible by 16 gets the divisibility hint Triton's launcher gives it. Run from the repository
root:

    python3 results/h200-2026-12-07g/ptx_fp8_skinny.py [M] [N] [K] [ACTS]
"""

import re
import subprocess
import sys
import tempfile
from collections import Counter

import torch
from triton.backends.nvidia.compiler import get_ptxas

sys.path.insert(0, "tests/ops")
import test_triton_frontend as frontend  # noqa: E402  (its compile to PTX for sm_90)

from ninfer.ops.cuda import fp8  # noqa: E402
from ninfer.ops.fp8 import quantize_fp8  # noqa: E402

# tensor-core products, float divisions and conversions, weight streaming
OPS = (
    r"\b(mma\.sync[.\w]*|wgmma\.mma[.\w]*|div\.rn[.\w]*|cvt\.rn[.\w]*|cp\.async\.\w+"
    r"|ld\.global[.\w]*)"
)
m, n, k = (int(a) for a in (sys.argv[1:4] if len(sys.argv) > 3 else (1, 5120, 6144)))
acts = sys.argv[4] if len(sys.argv) > 4 else "fastest"
w = quantize_fp8(torch.randn(n, k) * 0.02, (128, 128))
x = torch.randn(m, k).to(torch.bfloat16)
y = torch.empty(m, n, dtype=torch.bfloat16)
a8 = fp8.a8_code(w, acts)
ptxas = get_ptxas(90)
ptxas = getattr(ptxas, "path", ptxas)
kernel = fp8._fp8_skinny_kernel
jit = kernel.fn.fn  # autotuner -> heuristics -> the JITFunction
for c in fp8.CONFIGS:
    if not fp8._fits(c, m == 1, k, 128, x.dtype, a8):
        continue
    args = fp8._args(x, w.qweight, w.scale, w.block, y, c.kwargs["SPLIT_K"], a8)
    values = dict(zip(jit.arg_names, args, strict=False))
    values.update(c.kwargs)
    values["EVEN_N"] = n % c.kwargs["BLOCK_N"] == 0
    values["EVEN_K"] = k % (c.kwargs["BLOCK_K"] * c.kwargs["GROUPS"]) == 0
    ptx = frontend._ptx(jit, values, c.num_warps, c.num_stages)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"],
                             capture_output=True, text=True)  # fmt: skip
    info = [s.strip() for s in (out.stdout + out.stderr).splitlines() if "registers" in s]
    ops = Counter(re.findall(OPS, ptx))
    top = {o: v for o, v in ops.most_common(8)}
    kw = c.kwargs
    name = "A8" if kw["A8"] else "BITS" if kw["BITS"] else "cvt"
    cfg = (kw["BLOCK_N"], kw["BLOCK_K"], c.num_warps, c.num_stages, kw["SPLIT_K"], kw["GROUPS"])
    print(name, cfg, "dot" if kw["DOT"] else "cuda-cores", top,
          info[0].split(":", 1)[-1].strip() if info else out.stderr[-300:])  # fmt: skip
