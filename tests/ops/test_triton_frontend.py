"""Triton kernels' front end (Python AST -> TTIR) for an sm_90 target, on the CPU.

The front end types a kernel without a GPU: a kernel that only a GPU run would reject (a helper
whose `constexpr` branches return tiles of different shapes, as the FP8 MoE decode kernels' scale
helper once did) fails here, before any device time is spent.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
nvidia = pytest.importorskip("triton.backends.nvidia.compiler")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ninfer.ops.cuda import moe  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def _to_ttir(kernel, signature: dict, constexprs: dict) -> None:
    """Runs the front end of `kernel` for TARGET (raises its CompilationError)."""
    from triton._C.libtriton import ir

    backend = nvidia.CUDABackend(TARGET)
    options = backend.parse_options({})
    ctx = ir.context()
    ir.load_dialects(ctx)
    backend.load_dialects(ctx)
    src = ASTSource(kernel, signature, constexprs=constexprs)
    codegen = backend.get_codegen_implementation(options)
    src.make_ir(TARGET, options, codegen, backend.get_module_map(), ctx)


@triton.jit
def _scaled_tile(scales, out, ROW_SCALE: tl.constexpr):
    """A [32, 2, 128] tile through `moe._scaled`, summed into out[32]."""
    rows = tl.arange(0, 32)[:, None] * 2 + tl.arange(0, 2)[None, :]
    ok = rows >= 0
    wf = tl.full((32, 2, 128), 1.0, tl.float32)
    wf = moe._scaled(wf, scales + rows * 4, 0, 128, ok, 128, 128, ROW_SCALE)
    tl.store(out + tl.arange(0, 32), tl.sum(tl.sum(wf, 2), 1))


@pytest.mark.parametrize("row_scale", [True, False])
def test_fp8_scale_helper_types_for_both_scale_layouts(row_scale):
    """The FP8 MoE decode kernels' scale helper compiles for one scale per row (a K step inside
    one scale block) and for per-element gathered scales."""
    _to_ttir(_scaled_tile, {"scales": "*fp32", "out": "*fp32", "ROW_SCALE": "constexpr"},
             {"ROW_SCALE": row_scale})  # fmt: skip
