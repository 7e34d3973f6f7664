"""The FP8 MoE decode kernels compiled for sm_90 on the CPU (no GPU): per autotune config, the
static global-load instructions of the PTX, its line count, and ptxas's registers and spills.
Ints divisible by 16 and every pointer get the divisibility hint Triton's launcher gives them.
Run from the repository root, before and after a change to ninfer/ops/cuda/moe.py:

    python3 results/h200-2026-12-07e/ptx_loads_moe_fp8.py [tokens]
"""

import re
import subprocess
import sys
import tempfile
from collections import Counter

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

sys.path.insert(0, "tests/ops")
import test_triton_frontend as frontend  # noqa: E402  (its launch-capture helpers)

from ninfer.ops.cuda import moe  # noqa: E402
from ninfer.ops.fp8 import quantize_fp8  # noqa: E402


class Patch:  # the monkeypatch `frontend._launches` takes, undone by hand
    def __init__(self):
        self.undo = []

    def setattr(self, obj, name, value):
        self.undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)


e, h, i, top_k = 8, 2048, 512, 8  # the 35B-A3B's expert shapes
gate_up = quantize_fp8(torch.randn(e, 2 * i, h) * 0.02, (128, 128))
down = quantize_fp8(torch.randn(e, h, i) * 0.02, (128, 128))
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
x = torch.randn(n, h).to(torch.bfloat16)
weights, ids = torch.rand(n, top_k), torch.randint(0, e, (n, top_k), dtype=torch.int32)
patch = Patch()
launches = frontend._launches(
    patch, lambda: moe._experts(x, gate_up, down, weights, ids, top_k, None)
)
for obj, name, value in reversed(patch.undo):
    setattr(obj, name, value)
warps = [c[2] for c in moe.DECODE_CONFIGS] + [c[2] for c in moe.DOWN_CONFIGS]
ptxas = get_ptxas(90)
ptxas = getattr(ptxas, "path", ptxas)
for (fn, values), num_warps in zip(launches, warps, strict=True):
    constexprs, sig, attrs = {}, {}, {}
    for idx, p in enumerate(fn.params):
        v = values.get(p.name, p.default)
        if p.is_constexpr:
            constexprs[p.name], sig[p.name] = v, "constexpr"
            continue
        sig[p.name] = frontend._arg_type(v)
        hinted = isinstance(v, int) and not isinstance(v, bool) and v % 16 == 0
        if isinstance(v, torch.Tensor) or (hinted and p.name not in ("pairs", "tokens")):
            attrs[(idx,)] = [["tt.divisibility", 16]]
    options = {"num_warps": num_warps, "num_stages": constexprs.get("STAGES", 1)}
    src = ASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"],
                             capture_output=True, text=True)  # fmt: skip
    info = [s.strip() for s in (out.stdout + out.stderr).splitlines() if "registers" in s]
    loads = dict(Counter(re.findall(r"ld\.global[.\w]*", ptx)))
    names = ("BLOCK_N", "BLOCK_K", "STAGES", "SCALES", "ROW_SCALE")  # the last: before 7f4eeef
    cfg = {c: constexprs[c] for c in names if c in constexprs}
    print(fn.__name__, cfg, "warps", num_warps, loads, len(ptx.splitlines()), "lines;",
          info[0].split(":", 1)[-1].strip() if info else "")  # fmt: skip
