"""The linear op of `CudaOps`: cuBLAS, or the Triton skinny GEMM where it is faster.

Decode linears (M <= 8 rows, bf16 / fp16, contiguous weight) can run either on cuBLAS
(`F.linear`) or on `skinny.skinny_linear`. Which one is faster depends on the weight's shape:
cuBLAS nears the copy bandwidth on very wide weights and falls short on mid-sized ones. So the
first call for a (rows, N, K, dtype) key races the two (after the skinny kernel's own autotune)
and keeps the faster for good; a tie goes to cuBLAS. The race measures what a decode graph
pays (`timing.cold_call_ms`: device time in a CUDA graph, cold L2). It runs outside any
CUDA-graph capture (the engine's warm-up runs every decode batch size eagerly before capturing);
a key first seen during a capture takes cuBLAS. An FP8 weight (`ninfer.ops.fp8.Fp8Weight`) goes
to `fp8.Fp8Gemm` (its own skinny GEMV at decode, its activations as `fp8_decode` says;
cuBLAS's FP8 GEMM for prefill), `enabled` or not. Every other call is F.linear. Knows nothing
about the model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.ops.cuda.fp8 import Fp8Gemm
from ninfer.ops.cuda.skinny import MAX_M, skinny_linear
from ninfer.ops.cuda.timing import cold_call_ms
from ninfer.ops.fp8 import Fp8Weight

MARGIN = 0.98  # the skinny kernel must be at least 2 % faster to be chosen


class DecodeLinear:
    """y = x @ w^T (F.linear semantics, no bias). `enabled=False`: always F.linear."""

    def __init__(self, enabled: bool = True, fp8_decode: str = "w8a16") -> None:
        self.enabled = enabled
        self.choice: dict[tuple, bool] = {}  # key -> skinny chosen
        self.timings: dict[tuple, tuple[float, float]] = {}  # key -> (cuBLAS ms, skinny ms)
        self.fp8 = Fp8Gemm(fp8_decode)

    def _eligible(self, x: torch.Tensor, w: torch.Tensor) -> bool:
        return (
            self.enabled
            and x.dim() == 2
            and 0 < x.shape[0] <= MAX_M
            and x.dtype in (torch.bfloat16, torch.float16)
            and w.dtype == x.dtype
            and x.stride(-1) == 1
            and w.is_contiguous()
        )

    def __call__(self, x: torch.Tensor, w: torch.Tensor | Fp8Weight) -> torch.Tensor:
        if isinstance(w, Fp8Weight):
            return self.fp8(x, w)
        if not self._eligible(x, w):
            return F.linear(x, w)
        key = (x.shape[0], *w.shape, x.dtype)
        use = self.choice.get(key)
        if use is None:
            if torch.cuda.is_current_stream_capturing():
                return F.linear(x, w)
            use = self.choice[key] = self._race(key, x, w)
        return skinny_linear(x, w) if use else F.linear(x, w)

    def _race(self, key: tuple, x: torch.Tensor, w: torch.Tensor) -> bool:
        skinny_linear(x, w)  # autotune first: not part of the race
        fns = {"cublas": lambda: F.linear(x, w), "skinny": lambda: skinny_linear(x, w)}
        times = cold_call_ms(fns, x.device)
        cublas, skinny = times["cublas"], times["skinny"]
        self.timings[key] = (cublas, skinny)
        return skinny < MARGIN * cublas
