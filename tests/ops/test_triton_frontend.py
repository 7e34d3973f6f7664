"""Triton kernels' front end (Python AST -> TTIR) for an sm_90 target, on the CPU.

The front end types a kernel without a GPU: a kernel that only a GPU run would reject (a helper
whose `constexpr` branches return tiles of different shapes, as the FP8 MoE decode kernels' scale
helper once did) fails here, before any device time is spent.
"""

from __future__ import annotations

import pytest
import torch

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
def _scaled_tile(scales, out, BK_W, SCALES: tl.constexpr):
    """A [32, 2, 128] tile through `moe._scaled`, summed into out[32]."""
    rows = tl.arange(0, 32)[:, None] * 2 + tl.arange(0, 2)[None, :]
    ok = rows >= 0
    wf = tl.full((32, 2, 128), 1.0, tl.float32)
    wf = moe._scaled(wf, scales + rows * 4, 0, 128, ok, 128, BK_W, SCALES)
    tl.store(out + tl.arange(0, 32), tl.sum(tl.sum(wf, 2), 1))


@pytest.mark.parametrize("scales", [1, 2, 4, 0])
def test_fp8_scale_helper_types_for_every_scale_layout(scales):
    """The FP8 MoE decode kernels' scale helper compiles for one scale per row (a K step inside
    one scale block), a scale per row and block (a step spanning whole blocks) and per-element
    gathered scales."""
    sig = {"scales": "*fp32", "out": "*fp32", "BK_W": "i32", "SCALES": "constexpr"}
    _to_ttir(_scaled_tile, sig, {"SCALES": scales})


_DTYPES = {
    torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
    torch.float8_e4m3fn: "fp8e4nv", torch.int32: "i32", torch.int64: "i64",
    torch.uint8: "u8", torch.int8: "i8", torch.bool: "i1",
}  # fmt: skip


def _arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def _launches(monkeypatch, call) -> list[tuple]:
    """(JITFunction, its arguments by name) of every kernel launch `call()` makes, captured
    instead of run (CPU tensors stand in for CUDA ones); an autotuned kernel is launched once
    per config, through its heuristics if it has any."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    seen: list[tuple] = []

    def jit_run(self, *args, grid, warmup, **kwargs):
        values = dict(zip(self.arg_names, args, strict=False))
        values.update({k: v for k, v in kwargs.items() if k in self.arg_names})
        seen.append((self, values))

    def tuned_run(self, *args, **kwargs):
        kwargs.pop("grid", None), kwargs.pop("warmup", None)
        for cfg in self.configs:
            self.fn.run(*args, grid=None, warmup=False, **kwargs, **cfg.kwargs)

    monkeypatch.setattr(JITFunction, "run", jit_run)
    monkeypatch.setattr(Autotuner, "run", tuned_run)
    call()
    return seen


def _compile_launches(launches) -> int:
    """Runs the front end for every captured launch; returns how many compiled."""
    for fn, values in launches:
        constexprs, signature = {}, {}
        for p in fn.params:
            v = values.get(p.name, p.default)
            if p.is_constexpr:
                constexprs[p.name] = v
                signature[p.name] = "constexpr"
            else:
                signature[p.name] = _arg_type(v)
        _to_ttir(fn, signature, constexprs)
    return len(launches)


@pytest.mark.parametrize("block", [(128, 128), (1, 0)], ids=["block128", "per-channel"])
@pytest.mark.parametrize("n", [1, 8])
def test_fp8_moe_decode_kernels_compile(monkeypatch, n, block):
    """The routed-expert decode kernels on FP8 weights (35B-A3B's expert shapes, top-8), every
    autotune config, through Triton's front end for sm_90."""
    from ninfer.ops.fp8 import quantize_fp8

    e, h, i, top_k = 8, 2048, 512, 4
    blk = (1, h) if block == (1, 0) else block
    gate_up = quantize_fp8(torch.randn(e, 2 * i, h) * 0.02, blk)
    down = quantize_fp8(torch.randn(e, h, i) * 0.02, (1, i) if block == (1, 0) else block)
    x = torch.randn(n, h).to(torch.bfloat16)
    weights = torch.rand(n, top_k)
    ids = torch.randint(0, e, (n, top_k), dtype=torch.int32)
    launches = _launches(
        monkeypatch, lambda: moe._experts(x, gate_up, down, weights, ids, top_k, None)
    )
    assert {f.__name__ for f, _ in launches} == {"_gate_up_silu_kernel", "_down_sum_kernel"}
    assert _compile_launches(launches) >= 2


@pytest.mark.parametrize("block", [(128, 128), (1, 0)], ids=["block128", "per-channel"])
def test_fp8_moe_block_kernels_with_the_shared_expert_compile(monkeypatch, block):
    """The fused MoE block on FP8 experts and an FP8 shared expert (`_experts` with `shared`),
    every autotune config, through the front end for sm_90."""
    from ninfer.ops.fp8 import quantize_fp8

    e, h, i, top_k, n = 8, 2048, 512, 4, 3
    gate_blk = (1, h) if block == (1, 0) else block
    down_blk = (1, i) if block == (1, 0) else block
    gate_up = quantize_fp8(torch.randn(e + 1, 2 * i, h) * 0.02, gate_blk)
    down = quantize_fp8(torch.randn(e + 1, h, i) * 0.02, down_blk)
    routed = (quantize_fp8(gate_up.dequantize(torch.float32)[:e], gate_blk),
              quantize_fp8(down.dequantize(torch.float32)[:e], down_blk))  # fmt: skip
    shared = (gate_up.expert(e), down.expert(e))
    x = torch.randn(n, h).to(torch.bfloat16)
    weights = torch.rand(n, top_k + 1)
    ids = torch.randint(0, e, (n, top_k + 1), dtype=torch.int64)
    launches = _launches(monkeypatch, lambda: moe._experts(x, *routed, weights, ids, top_k, shared))
    assert {f.__name__ for f, _ in launches} == {"_gate_up_silu_kernel", "_down_sum_kernel"}
    assert all(v["SHARED"] == 1 and v["FP8"] == 1 for _, v in launches)
    assert _compile_launches(launches) >= 2


@pytest.mark.parametrize("block", [(128, 128), (1, 0)], ids=["block128", "per-channel"])
def test_fp8_grouped_gemm_compiles(monkeypatch, block):
    """The MoE's FP8 grouped GEMM (`moe.moe_grouped_fp8`: gate_up with the token gather, down
    with the routing weights), every autotune config, through the front end for sm_90."""
    from ninfer.ops.fp8 import quantize_fp8

    e, h, i, top_k, n = 16, 2048, 512, 8, 64
    gate_up = quantize_fp8(torch.randn(e, 2 * i, h) * 0.02, (1, h) if block == (1, 0) else block)
    down = quantize_fp8(torch.randn(e, h, i) * 0.02, (1, i) if block == (1, 0) else block)
    x = torch.randn(n, h).to(torch.bfloat16)
    router = torch.randn(e, h).to(torch.bfloat16)
    launches = _launches(monkeypatch, lambda: moe.moe_grouped_fp8(x, router, gate_up, down, top_k))
    assert {f.__name__ for f, _ in launches} == {"_grouped_fp8_kernel"}
    assert {(v["GATHER"], v["WEIGHTED"]) for _, v in launches} == {(True, False), (False, True)}
    assert _compile_launches(launches) == len(launches)


def test_state_tap_kernels_compile(monkeypatch):
    """The conv state taps' two launches (`conv._tap_init`, `conv._write_taps`) through the
    front end for sm_90: a bf16 pass over a bf16 conv state, taps near their row's start."""
    from ninfer.forward import StateTap
    from ninfer.ops.cuda import conv
    from ninfer.ops.cuda.passmeta import PassMeta

    width, channels = 4, 640
    meta = PassMeta.of(
        [5, 90], [30, 0], torch.device("cpu"), [StateTap(0, 2, 5), StateTap(1, 70, 6)]
    )
    pool = torch.randn(8, channels, width - 1).to(torch.bfloat16)
    x = torch.randn(95, channels).to(torch.bfloat16)
    slots = torch.tensor([1, 2], dtype=torch.int32)

    def both():
        conv._write_taps(x, width, pool, meta.taps, conv._tap_init(pool, slots, meta))

    launches = _launches(monkeypatch, both)
    names = [f.__name__ for f, _ in launches]
    assert names == ["_tap_init_kernel", "_write_taps_kernel"], names
    assert _compile_launches(launches) == 2


def test_verify_rows_with_their_gates_compile(monkeypatch):
    """`gdn.gdn_rows` with the gates in the kernel (the verify graphs' rows) and without,
    through the front end for sm_90."""
    from ninfer.ops.cuda import gdn
    from ninfer.ops.cuda.passmeta import PassMeta

    t, hk, hv, dk, dv = 8, 2, 4, 128, 128
    q, k = (torch.randn(t, hk, dk).to(torch.bfloat16) for _ in range(2))
    v = torch.randn(t, hv, dv).to(torch.bfloat16)
    a, b = (torch.randn(t, hv).to(torch.bfloat16) for _ in range(2))
    state = torch.zeros(6, hv, dk, dv)
    cu = torch.tensor([0, 4, 8])
    meta = PassMeta(torch.zeros(t, dtype=torch.int64), torch.tensor([1, 0]), cu, cu, cu,
                    tap_tok=torch.full((t,), -1, dtype=torch.int64))  # fmt: skip
    slots = torch.tensor([0, 1], dtype=torch.int32)
    gates = (torch.randn(hv), torch.randn(hv).to(torch.bfloat16))

    def both():
        gdn.gdn_rows(q, k, v, a, b, state, slots, 0.1, meta, gates=gates)
        gdn.gdn_rows(q, k, v, a.float(), b, state, slots, 0.1, meta)

    launches = _launches(monkeypatch, both)
    assert [v["GATES"] for _, v in launches] == [True, False]
    assert _compile_launches(launches) == 2


@pytest.mark.parametrize("n", [1, 3, 12, 24, 32])
def test_moe_decode_kernels_tune_per_power_of_two(monkeypatch, n):
    """The MoE decode kernels' autotune keys (`tokens`, `pairs`: the grid's first dim) are
    rounded up to a power of two, so a pass of any token count up to DECODE_PAIRS reuses one of
    the six tunings the warm-up made instead of tuning while serving."""
    e, h, i, top_k = 8, 256, 128, 8
    gate_up = torch.randn(e, 2 * i, h).to(torch.bfloat16)
    down = torch.randn(e, h, i).to(torch.bfloat16)
    x = torch.randn(n, h).to(torch.bfloat16)
    weights = torch.rand(n, top_k).to(torch.bfloat16)
    ids = torch.randint(0, e, (n, top_k), dtype=torch.int64)
    launches = _launches(
        monkeypatch, lambda: moe._experts(x, gate_up, down, weights, ids, top_k, None)
    )
    pow2 = 1 << (n - 1).bit_length()
    keys = {f.__name__: v.get("pairs", v.get("tokens")) for f, v in launches}
    assert keys == {"_gate_up_silu_kernel": pow2 * top_k, "_down_sum_kernel": pow2}, keys


def _ptx(kernel, values: dict, num_warps: int, num_stages: int) -> str:
    """The whole compile of `kernel` for TARGET (front end, layouts, LLVM, ptxas), its PTX."""
    constexprs, signature, attrs = {}, {}, {}
    for idx, p in enumerate(kernel.params):
        v = values[p.name]
        if p.is_constexpr:
            constexprs[p.name], signature[p.name] = v, "constexpr"
            continue
        signature[p.name] = _arg_type(v)
        if isinstance(v, torch.Tensor) or (isinstance(v, int) and v % 16 == 0 and v > 1):
            attrs[(idx,)] = [["tt.divisibility", 16]]  # as Triton's launcher hints them
    src = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(src, target=TARGET, options=options).asm["ptx"]


@pytest.mark.parametrize("m", [1, 8])
def test_fp8_gemv_a8_configs_multiply_e4m3_on_sm90_tensor_cores(m):
    """The FP8 GEMV's A8 configs exist to multiply e4m3 by e4m3 without widening the weight:
    for sm_90 their PTX must hold wgmma e4m3 products and no e4m3 -> f16 conversion (with x as
    the left operand Triton widens both to f16 for mma.sync instead)."""
    from ninfer.ops.cuda import fp8
    from ninfer.ops.fp8 import quantize_fp8

    n, k = 1024, 1024
    w = quantize_fp8(torch.randn(n, k) * 0.02, (128, 128))
    x = torch.randn(m, k).to(torch.bfloat16)
    y = torch.empty(m, n, dtype=torch.bfloat16)
    kernel = fp8._fp8_skinny_kernel.fn.fn  # autotuner -> heuristics -> JITFunction
    configs = [c for c in fp8.CONFIGS if c.kwargs["A8"]]
    assert configs
    for c in (configs[0], configs[-1]):
        args = fp8._args(x, w.qweight, w.scale, w.block, y, c.kwargs["SPLIT_K"], 2)
        values = {**dict(zip(kernel.arg_names, args, strict=False)), **c.kwargs}
        values["EVEN_N"] = values["EVEN_K"] = True
        ptx = _ptx(kernel, values, c.num_warps, c.num_stages)
        assert "e4m3.e4m3" in ptx and "wgmma.mma_async" in ptx, c
        assert "cvt.rn.f16x2.e4m3x2" not in ptx, c


def test_the_fp8_gemv_serves_every_fp8_decode_choice():
    """The op choice's values (`OpChoices.fp8_decode`) are the GEMV's `acts`, each with its
    own kernel code."""
    from ninfer.ops.choices import FP8_DECODE
    from ninfer.ops.cuda.fp8 import ACTS

    assert set(ACTS) == set(FP8_DECODE) and len(set(ACTS.values())) == len(ACTS)
