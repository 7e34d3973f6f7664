"""GPU tests: CudaOps.linear on FP8 weights (`ninfer.ops.cuda.fp8`) against the reference op
(dequantise, then multiply in x's dtype), and the FP8 MoE against the reference MoE.

Errors are ||out - ref|| / ||ref||, ref the float64 product of x with the dequantised weight
(MoE: the reference MoE over the same FP8 experts).
Decode (M <= 8, `fp8_skinny`): x stays bf16, the kernel keeps the dequantised weight unrounded,
so it is closer to the exact product than the reference (which rounds the weight to bf16):
< 1e-2 like the bf16 skinny GEMM, autotuned and with every config that fits forced, plus
CUDA-graph capture and replay. Prefill (M = 1024): x is quantised to e4m3 per token per 128
columns (or per token for per-channel weights), about 2^-4 relative per element, random signs:
< 4e-2. Shapes from the 27B (hidden 5120, MLP 17408, attention q 12288, GDN qkv 10240 and
value 6144). Skipped without CUDA or without triton.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")

from triton.runtime.errors import OutOfResources  # noqa: E402

from ninfer.ops.choices import OpChoices  # noqa: E402
from ninfer.ops.cuda import CudaOps, grouped_fp8  # noqa: E402
from ninfer.ops.cuda.fp8 import (  # noqa: E402
    ACT_EPS,  # noqa: E402
    CONFIGS,
    Fp8Gemm,
    _fits,
    a8_admits,
    fp8_skinny,
    quantize_groups,
    quantize_groups_ref,
    skinny_fits,
    tuned_config,
    w8a8_fits,
    w8a8_gemm,
)
from ninfer.ops.cuda.moe import (  # noqa: E402
    DECODE_PAIRS,
    _sorted_pairs,
    block_fusable,
    moe_block_decode,
    moe_grouped_fp8,
    moe_grouped_mm,
)
from ninfer.ops.fp8 import FP8_DTYPE, FP8_MAX, Fp8Weight, quantize_fp8  # noqa: E402
from ninfer.ops.reference import ReferenceOps, moe_ref  # noqa: E402
from ninfer.ops.reference.dense import moe_block_ref, route_ref  # noqa: E402

DEV = torch.device("cuda")
SHAPES = [(5120, 6144), (17408, 5120), (5120, 17408), (12288, 5120), (10240, 5120), (1000, 4100)]
BLOCKS = [pytest.param((128, 128), id="block128"), pytest.param((1, 0), id="per-channel")]


@pytest.fixture(scope="module")
def ops() -> CudaOps:
    return CudaOps()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert not out.isnan().any(), "NaN in output"
    return ((out - ref).norm() / ref.norm()).item()


def fp8_inputs(m: int, n: int, k: int, block: tuple[int, int], seed: int = 0):
    gen = torch.Generator(DEV).manual_seed(seed)
    block = (1, k) if block == (1, 0) else block
    w = quantize_fp8(torch.randn(n, k, device=DEV, generator=gen) * 0.02, block)
    x = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
    exact = x.double() @ w.dequantize(torch.float64).t()
    return x, w, exact


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize(("n", "k"), SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
def test_decode_linear_matches_reference(ops, m, n, k, block):
    x, w, exact = fp8_inputs(m, n, k, block)
    assert skinny_fits(x, w)
    got = ops.linear(x, w)
    ref = ReferenceOps().linear(x, w)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    assert rel_err(got, exact) < 1e-2
    assert rel_err(got, exact) <= rel_err(ref, exact) * 1.5 + 1e-3


@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.kwargs.values())))
def test_every_skinny_config(config, m):
    """Each config with the x dtype it serves (BITS ones bf16, the others fp16)."""
    x, w, exact = fp8_inputs(m, 1000, 4096, (128, 128))
    x = x if config.kwargs["BITS"] else x.half()
    if not _fits(config, m == 1, 4096, 128, x.dtype):
        pytest.skip("config does not take this shape")
    try:
        got = fp8_skinny(x, w, config)
    except OutOfResources:
        pytest.skip("config exceeds this GPU's resources")
    assert rel_err(got, exact) < 1e-2


A8 = [c for c in CONFIGS if c.kwargs["A8"]]


def quantised_exact(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """The float64 product of x quantised as prefill quantises it (per token per 128 columns,
    `quantize_groups_ref`) with the dequantised weight."""
    q, xs = quantize_groups_ref(x, 128)
    xq = q.double() * xs.double().repeat_interleave(128, dim=1)
    return xq @ w.dequantize(torch.float64).t()


@pytest.mark.parametrize("m", [1, 4, 8])
@pytest.mark.parametrize("config", A8, ids=lambda c: "-".join(map(str, c.kwargs.values())))
def test_every_a8_config_quantises_x_as_prefill_does(config, m):
    """An A8 config's output is the float64 product of the prefill's quantised x within its
    fp32 sums and bf16 rounding (< 5e-3; about 1.6e-3 of it is the rounding), while the
    unquantised x's product lies about 2.4e-2 away: a kernel that skipped the quantisation, or
    quantised other groups, or other values, fails."""
    x, w, exact = fp8_inputs(m, 1000, 4096, (128, 128))
    want = quantised_exact(x, w)
    assert _fits(config, m == 1, 4096, 128, x.dtype, a8=1)
    assert not _fits(config, m == 1, 4096, 128, x.dtype)  # only where asked
    try:
        got = fp8_skinny(x, w, config)
    except OutOfResources:
        pytest.skip("config exceeds this GPU's resources")
    assert rel_err(want, exact) > 1.5e-2
    assert rel_err(got, want) < 5e-3


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("acts", ["fastest", "w8a8"])
@pytest.mark.parametrize("m", [1, 8])
def test_decode_activations_follow_acts(m, acts, block):
    """`acts` "w8a8" runs an A8 config, "fastest" tunes over both kinds: an A8 choice computes
    as the prefill's quantised x does, any other as the dequantised product; a per-channel
    weight (its prefill quantises per token) never takes A8, nor does the default "w8a16"."""
    x, w, exact = fp8_inputs(m, 5120, 6144, block)
    got = fp8_skinny(x, w, acts=acts)
    chosen = tuned_config(x, w, acts)
    assert chosen is not None and chosen.kwargs["A8"] <= a8_admits(w)
    if acts == "w8a8":
        assert chosen.kwargs["A8"] == a8_admits(w)
    if chosen.kwargs["A8"]:
        assert rel_err(got, quantised_exact(x, w)) < 5e-3
    else:
        assert rel_err(got, exact) < 1e-2
    fp8_skinny(x, w)
    assert not tuned_config(x, w).kwargs["A8"]
    with pytest.raises(ValueError, match="acts"):
        fp8_skinny(x, w, acts="fp8")


def test_the_op_set_passes_its_fp8_decode_choice():
    """`OpChoices.fp8_decode` reaches the FP8 GEMV: "w8a8" decodes as prefill quantises."""
    x, w, _ = fp8_inputs(4, 5120, 6144, (128, 128))
    ops = CudaOps(choices=OpChoices(fp8_decode="w8a8"))
    got = ops.linear(x, w)
    assert tuned_config(x, w, "w8a8").kwargs["A8"]
    assert rel_err(got, quantised_exact(x, w)) < 5e-3


def every_e4m3_weight(n: int = 128, k: int = 256) -> Fp8Weight:
    """Row r, column c holds the e4m3 byte (2 r + c) mod 256 (the two NaN bytes as zero), so
    columns 0 and 1 hold every byte: signs, zeros, subnormals, 448. Scales 2^-7 per block."""
    r, c = torch.arange(n)[:, None], torch.arange(k)[None, :]
    byte = ((2 * r + c) % 256).to(torch.uint8)
    byte[(byte & 0x7F) == 0x7F] = 0
    scale = torch.full((n // 128, k // 128), 2.0**-7)
    return Fp8Weight(byte.view(FP8_DTYPE).to(DEV), scale.to(DEV), (128, 128))


@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.kwargs.values())))
def test_every_skinny_config_widens_every_e4m3_value_exactly(config, m):
    """One-hot rows of x pick columns of the weight: each output is one dequantised weight,
    exact in bf16, so every config (the integer widening of BITS ones included) must give it
    bit for bit, subnormal e4m3 values and signed zeros' products included; x bf16 for the
    BITS configs, fp16 for the others (every e4m3 value times 2^-7 is an fp16 value too)."""
    w = every_e4m3_weight()
    dtype = torch.bfloat16 if config.kwargs["BITS"] else torch.float16
    if not _fits(config, m == 1, w.shape[1], 128, dtype):
        pytest.skip("config does not take this shape")
    for cols in ([0], [1]) if m == 1 else ([0, 1, 2, 3],):
        x = torch.zeros(m, w.shape[1], device=DEV, dtype=dtype)
        x[torch.arange(m), cols] = 1.0
        want = w.dequantize(torch.float32)[:, cols].t().to(dtype)
        try:
            got = fp8_skinny(x, w, config)
        except OutOfResources:
            pytest.skip("config exceeds this GPU's resources")
        assert torch.equal(got, want), (cols, (got.float() - want.float()).abs().max())


@pytest.mark.parametrize(("m", "k"), [(1, 128), (37, 640), (1024, 17408), (0, 256)])
def test_activation_quantisation_is_the_torch_ops_bit_for_bit(m, k):
    """The prefill's one-pass quantisation (`quantize_groups`) gives the torch ops' e4m3 values
    and scales exactly, scales column-major; rows of zeros, huge and tiny values included."""
    gen = torch.Generator(DEV).manual_seed(m + k)
    x = torch.randn(m, k, device=DEV, generator=gen)
    if m > 2:
        x[1] = 0.0
        x[2, :128] *= 1e4
        x[2, 128:] *= 1e-30
    x = x.to(torch.bfloat16)
    q, s = quantize_groups(x, 128)
    q_ref, s_ref = quantize_groups_ref(x, 128)
    assert q.dtype == q_ref.dtype and s.shape == s_ref.shape
    assert m == 0 or s.stride() == s_ref.stride() == (1, m)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s, s_ref)


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize(("n", "k"), SHAPES[:5], ids=lambda v: str(v))
def test_prefill_linear_matches_reference(n, k, block):
    x, w, exact = fp8_inputs(1024, n, k, block)
    gemm = Fp8Gemm()
    got = gemm(x, w)
    assert got.shape == (1024, n) and got.dtype == torch.bfloat16
    assert rel_err(got, exact) < 4e-2


@pytest.mark.skipif(torch.cuda.get_device_capability() != (9, 0), reason="sm_90 only")
def test_cublas_fp8_gemms_serve_prefill_on_hopper():
    """On an H100 / H200 with torch >= 2.10 and cuBLAS >= 12.9 both FP8 GEMMs run (else the
    prefill dequantises: correct but slow, and this test says so)."""
    gemm = Fp8Gemm()
    for block in ((128, 128), (1, 0)):
        x, w, _ = fp8_inputs(256, 1024, 2048, block)
        gemm(x, w)
    assert gemm.support == {"blockwise": True, "rowwise": True}


@pytest.mark.parametrize(
    ("m", "n", "k"), [(1024, 5120, 6144), (300, 1000, 4096), (8192, 17408, 5120)]
)
def test_triton_w8a8_gemm_matches_reference(m, n, k):
    """Our Triton GEMM (the prefill path where cuBLAS has no block-scaled FP8 GEMM)."""
    x, w, exact = fp8_inputs(m, n, k, (128, 128))
    assert w8a8_fits(x, w)
    got = w8a8_gemm(x, w)
    assert got.shape == (m, n) and rel_err(got, exact) < 4e-2


def test_prefill_off_the_cublas_grid_dequantises():
    """K not a multiple of 128: neither cuBLAS nor the Triton GEMM, the dequantising path."""
    x, w, exact = fp8_inputs(64, 1000, 4100, (128, 128))
    assert Fp8Gemm._kind(x, w) is None and not w8a8_fits(x, w)
    assert rel_err(Fp8Gemm()(x, w), exact) < 1e-2


@pytest.mark.parametrize("acts", ["w8a16", "w8a8"])
def test_decode_graph_replays_new_inputs(acts):
    """A captured decode GEMV reads the new x on replay; w8a8: the quantising launch and the A8
    config, both in the graph."""
    x, w, _ = fp8_inputs(4, 5120, 6144, (128, 128))
    gemm = Fp8Gemm(acts)
    gemm(x, w)  # autotune outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gemm(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    if acts == "w8a8":
        assert rel_err(y, quantised_exact(x, w)) < 5e-3
    else:
        assert rel_err(y, F.linear(x.double(), w.dequantize(torch.float64))) < 1e-2


def fp8_experts(e: int, h: int, i: int, block: tuple[int, int], seed: int = 1):
    gen = torch.Generator(DEV).manual_seed(seed)
    per_channel = block == (1, 0)
    gate_up = torch.randn(e, 2 * i, h, device=DEV, generator=gen) * 0.02
    down = torch.randn(e, h, i, device=DEV, generator=gen) * 0.02
    return (
        quantize_fp8(gate_up, (1, h) if per_channel else block),
        quantize_fp8(down, (1, i) if per_channel else block),
    )


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("n", [1, 4, 8, 300, 2048], ids=lambda n: f"N{n}")
def test_fp8_moe_matches_reference(ops, n, block):
    """35B-A3B shapes (E 256, H 2048, I 512, top-8): N <= 8 the decode kernels on e4m3
    weights, N = 300 and 2048 the FP8 grouped GEMM (`moe_grouped_fp8`, BLOCK_M 16 and 64)."""
    gen = torch.Generator(DEV).manual_seed(2)
    e, h, i, top_k = 256, 2048, 512, 8
    x = torch.randn(n, h, device=DEV, generator=gen).to(torch.bfloat16)
    router = (torch.randn(e, h, device=DEV, generator=gen) * 0.02).to(torch.bfloat16)
    gate_up, down = fp8_experts(e, h, i, block)
    got = ops.moe(x, router, gate_up, down, top_k)
    ref = moe_ref(x, router, gate_up, down, top_k)
    assert rel_err(got, ref) < 1e-2


@contextlib.contextmanager
def full_reductions():
    """cuBLAS's bf16 / fp16 GEMMs without reduced-precision (bf16 / fp16) split-K sums, which
    torch allows by default: a reference's per-expert GEMMs of one to three rows may otherwise
    round their partial sums."""
    matmul = torch.backends.cuda.matmul
    saved = (matmul.allow_bf16_reduced_precision_reduction,
             matmul.allow_fp16_reduced_precision_reduction)  # fmt: skip
    matmul.allow_bf16_reduced_precision_reduction = False
    matmul.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        (matmul.allow_bf16_reduced_precision_reduction,
         matmul.allow_fp16_reduced_precision_reduction) = saved  # fmt: skip


def prefill_linear_ref(x: torch.Tensor, w) -> torch.Tensor:
    """`Fp8Gemm`'s prefill arithmetic in fp32 torch ops: x quantised to e4m3 per token per 128
    columns (128 x 128-block weights) or per token (per-channel weights), times the dequantised
    weight. A bf16 weight is the plain product."""
    if not isinstance(w, Fp8Weight):
        return F.linear(x.float(), w.float()).to(x.dtype)
    if w.per_channel:  # one scale per token
        xf = x.float()
        xs = xf.abs().amax(dim=-1, keepdim=True).clamp(min=ACT_EPS) / FP8_MAX
        xq = (xf / xs).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float() * xs
    else:
        q, xs = quantize_groups_ref(x, 128)
        xq = q.float() * xs.repeat_interleave(128, dim=1)
    return F.linear(xq, w.dequantize(torch.float32)).to(x.dtype)


def silu_mul_once(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`CudaOps.silu_mul`'s arithmetic (its Triton kernel; `test_silu_mul_matches_torch`):
    silu(gate) * up in fp32, rounded to gate.dtype once. The reference op rounds silu's output
    to bf16 first, as transformers' MLP does, so about a quarter of the products lie one bf16
    ulp apart; where the next linear quantises them to e4m3 (the prefill GEMM) such a
    difference flips the e4m3 rounding of some, and the shared expert's output moves by about
    1e-2 (a CPU emulation of the N40 block: 0.012 against the twice-rounding reference, 0.004
    with one rounding on both sides). An oracle for the unfused block must round as the op
    does."""
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("n", [1, 8, 32, 40], ids=lambda n: f"N{n}")
def test_fp8_moe_block_with_its_shared_expert(ops, n, block):
    """The MoE block over FP8 experts and an FP8 shared expert (35B-A3B shapes): up to
    DECODE_PAIRS routed pairs `CudaOps.moe_block` fuses it (`moe_block_decode`: four launches,
    the shared expert's e4m3 tiles times their own scales), beyond it composes the separate
    ops, whose shared expert's linears then take the prefill GEMM (activations quantised to
    e4m3, `prefill_linear_ref`, after `silu_mul_once`). Either way within the decode kernels'
    error (1e-2) of the reference block with the same arithmetic."""
    gen = torch.Generator(DEV).manual_seed(4)
    e, h, i, top_k = 256, 2048, 512, 8
    x = torch.randn(n, h, device=DEV, generator=gen).to(torch.bfloat16)
    router = (torch.randn(e + 1, h, device=DEV, generator=gen) * 0.02).to(torch.bfloat16)
    gate_up, down = fp8_experts(e, h, i, block)
    shared_gate_up, shared_down = (w.expert(0) for w in fp8_experts(1, h, i, block, seed=5))
    args = (x, router, gate_up, down, shared_gate_up, shared_down, top_k)
    got = ops.moe_block(*args)
    fused = n * top_k <= DECODE_PAIRS
    ref_ops = ReferenceOps()
    linear = ref_ops.linear if fused else prefill_linear_ref
    silu_mul = ref_ops.silu_mul if fused else silu_mul_once
    with full_reductions():  # the oracle's per-expert bf16 GEMMs without bf16 split-K sums
        ref = moe_block_ref(*args, moe_ref, linear, silu_mul, ref_ops.sigmoid_mul)
    assert rel_err(got, ref) < 1e-2
    assert block_fusable(*args) == fused
    if fused:
        assert torch.equal(got, moe_block_decode(*args, ops.linear))


@pytest.mark.parametrize("block", BLOCKS)
def test_fp8_moe_block_parts_at_40_tokens(ops, block):
    """The block test's N40 inputs, part by part, each against the reference the block test
    composes: the routed experts (320 pairs: the FP8 grouped GEMM) against `moe_ref`, the
    shared expert's gated output (the prefill GEMM at 40 rows) against `prefill_linear_ref`'s
    after `silu_mul_once`. Says which part carries the block's error where the block test
    fails. And the op's shared expert lies closer to that reference than to the one whose
    SwiGLU rounds twice (`silu_mul_once`: why the block's oracle rounds once)."""
    gen = torch.Generator(DEV).manual_seed(4)
    e, h, i, top_k, n = 256, 2048, 512, 8, 40
    x = torch.randn(n, h, device=DEV, generator=gen).to(torch.bfloat16)
    router = (torch.randn(e + 1, h, device=DEV, generator=gen) * 0.02).to(torch.bfloat16)
    gate_up, down = fp8_experts(e, h, i, block)
    shared_gate_up, shared_down = (w.expert(0) for w in fp8_experts(1, h, i, block, seed=5))
    ref_ops = ReferenceOps()

    def shared(linear, silu_mul, sigmoid_mul):
        gate, up = linear(x, shared_gate_up).chunk(2, dim=-1)
        return sigmoid_mul(linear(silu_mul(gate, up), shared_down), linear(x, router[e:]))

    with full_reductions():
        routed_ref = moe_ref(x, router[:e], gate_up, down, top_k)
        shared_ref = shared(prefill_linear_ref, silu_mul_once, ref_ops.sigmoid_mul)
        shared_twice = shared(prefill_linear_ref, ref_ops.silu_mul, ref_ops.sigmoid_mul)
    routed = rel_err(ops.moe(x, router[:e], gate_up, down, top_k), routed_ref)
    got_shared = shared(ops.linear, ops.silu_mul, ops.sigmoid_mul)
    shared_err = rel_err(got_shared, shared_ref)
    assert routed < 1e-2 and shared_err < 1e-2, (routed, shared_err)
    assert rel_err(got_shared, shared_twice) > shared_err, rel_err(got_shared, shared_twice)


@pytest.mark.parametrize("block", BLOCKS)
def test_fp8_grouped_gemm_against_the_grouped_path_on_dequantised_experts(block):
    """`grouped_fp8` never rounds a dequantised weight, so its projections lie closer to the
    exact product than `torch._grouped_mm`'s over the experts dequantised to bf16 (which rounds
    each weight): in a CPU emulation of both at these shapes, 0.0017 against 0.0023 (the
    output's own bf16 rounding against that plus the weights'). End to end, `moe_grouped_fp8`
    and `moe_grouped_mm` on the dequantised experts then differ by the weights' rounding carried
    through SwiGLU, the down projection and the top-k sums (0.007 emulated): within 1e-2. And
    it allocates no bf16 copy of the experts."""
    gen = torch.Generator(DEV).manual_seed(6)
    e, h, i, top_k, n = 256, 2048, 512, 8, 1000
    x = torch.randn(n, h, device=DEV, generator=gen).to(torch.bfloat16)
    router = (torch.randn(e, h, device=DEV, generator=gen) * 0.02).to(torch.bfloat16)
    gate_up, down = fp8_experts(e, h, i, block)
    moe_grouped_fp8(x, router, gate_up, down, top_k)  # tunes first
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    got = moe_grouped_fp8(x, router, gate_up, down, top_k)
    peak = torch.cuda.max_memory_allocated() - base
    dense = [w.dequantize(torch.bfloat16) for w in (gate_up, down)]
    want = moe_grouped_mm(x, router, *dense, top_k)
    assert rel_err(got, want) < 1e-2
    assert peak < dense[0].numel() * 2 // 4, peak  # far below one projection's bf16 copy
    # the gate_up projection of the sorted pairs: ours, bf16 weights', exact
    _, tok, counts = _sorted_pairs(*route_ref(x, router, top_k), e)
    pairs = n * top_k
    bm = grouped_fp8.block_m(pairs, e)
    offs, block_end = grouped_fp8.block_table(counts, bm)
    proj = grouped_fp8.grouped_fp8(x, tok, gate_up, offs, block_end, bm, pairs)
    ends = torch.cumsum(counts, 0, dtype=torch.int32)
    proj_bf16 = torch._grouped_mm(x[tok], dense[0].transpose(-2, -1), offs=ends)
    starts = [0, *ends.tolist()]
    exact = torch.cat([
        x[tok[a:b]].double() @ gate_up.expert(j).dequantize(torch.float64).t()
        for j, (a, b) in enumerate(zip(starts, starts[1:], strict=False))
    ])  # fmt: skip
    ours, theirs = rel_err(proj, exact), rel_err(proj_bf16, exact)
    assert ours < 2e-3 and ours < 0.8 * theirs, (ours, theirs)


def test_fp8_grouped_gemm_captures_any_length_after_one_eager_call():
    """The first eager call tunes every BLOCK_M, so a prefill graph of another length (another
    BLOCK_M) captures and replays new inputs."""
    gen = torch.Generator(DEV).manual_seed(7)
    e, h, i, top_k = 64, 1024, 256, 8
    gate_up, down = fp8_experts(e, h, i, (128, 128))
    router = (torch.randn(e, h, device=DEV, generator=gen) * 0.02).to(torch.bfloat16)
    moe_grouped_fp8(torch.randn(40, h, device=DEV).to(torch.bfloat16), router, gate_up, down, 8)
    x = torch.randn(1000, h, device=DEV, generator=gen).to(torch.bfloat16)  # BLOCK_M 128
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = moe_grouped_fp8(x, router, gate_up, down, top_k)
    x.copy_(torch.randn(x.shape, device=DEV, generator=gen).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(y, moe_ref(x, router, gate_up, down, top_k)) < 1e-2


def test_fp8_moe_decode_graph_replays_new_inputs(ops):
    gen = torch.Generator(DEV).manual_seed(3)
    e, h, i, top_k = 64, 2048, 512, 8
    x = torch.randn(4, h, device=DEV, generator=gen).to(torch.bfloat16)
    router = (torch.randn(e, h, device=DEV, generator=gen) * 0.02).to(torch.bfloat16)
    gate_up, down = fp8_experts(e, h, i, (128, 128))
    ops.moe(x, router, gate_up, down, top_k)  # autotune outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.moe(x, router, gate_up, down, top_k)
    x.copy_(torch.randn(x.shape, device=DEV, generator=gen).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(y, moe_ref(x, router, gate_up, down, top_k)) < 1e-2
