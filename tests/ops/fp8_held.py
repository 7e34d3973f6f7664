"""FP8 weights for the checks that run Triton kernels under the CPU interpreter
(tests/ops/test_*_interpret.py, in a subprocess with this folder on PYTHONPATH). The
interpreter has no e4m3, so a weight goes in as fp32 holding the e4m3 values (`Held`), beside
its block scales; the kernels convert each tile to x's dtype first: the same products."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ninfer.ops.fp8 import Fp8Weight, quantize_fp8


class Held(Fp8Weight):
    """An `Fp8Weight` whose values are held in fp32 (no dtype check)."""

    __slots__ = ()

    def __post_init__(self):
        pass


def held_fp8(gen: torch.Generator, shape, spread: float, block):
    """A random weight of `shape` ([..., N, K]) quantised in `block` (None: per channel), its
    rows' magnitudes spread over 10 ** spread (so that rows of scale blocks differ): (the
    `Held` weight, its dequantised fp32 values)."""
    w = torch.randn(*shape, generator=gen) * 0.05
    w = w * torch.logspace(0, spread, shape[-2]).view(-1, 1)
    q = quantize_fp8(w, (1, shape[-1]) if block is None else block)
    return Held(q.qweight.float(), q.scale, q.block), q.dequantize(torch.float32)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def interpreter_env() -> dict:
    """The environment of a check's subprocess: the interpreter on, this folder importable."""
    path = os.pathsep.join(
        p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p
    )
    return {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
