"""`CudaOps.linear` on an FP8 weight (`ninfer.ops.fp8.Fp8Weight`): a Triton skinny GEMV for
decode, cuBLAS's block-scaled FP8 GEMM for prefill.

- decode (M <= MAX_M rows, bf16 / fp16 x): `fp8_skinny` reads each e4m3 weight byte once and keeps
  the activations in bf16 (W8A16). Program (nb, s) owns output columns
  [nb * BLOCK_N, (nb + 1) * BLOCK_N) and the s-th of SPLIT_K K ranges (whole steps of
  GROUPS * BLOCK_K columns); per step it loads GROUPS [BLOCK_N, BLOCK_K] e4m3 tiles side by side
  (evict-first), converts each to x's dtype (exact: every e4m3 value is a bf16 value; by the
  conversion unit, or, BITS configs with bf16 x, by integer ops on the bytes, `E4M3_BF16_ASM`),
  multiplies it with the same K slice of x in fp32 (tensor cores with x padded to 16 rows, or,
  M == 1, the CUDA cores) and adds the product times each row's scale for that K slice. A tile
  never crosses a scale block along K (BLOCK_K divides the block's columns, or the block spans K),
  so one scale per row and tile: y = sum over tiles of (x . q) * s, each weight's dequantised
  value never rounded. GROUPS > 1 reads GROUPS * BLOCK_K contiguous bytes of each row a step,
  across scale blocks (a 128 x 128-block weight caps BLOCK_K at 128: 128 bytes of a row, where the
  bf16 GEMV's tiles read 512). SPLIT_K > 1 (a layer with fewer column blocks than twice the SMs:
  more programs in flight) writes fp32 partials that a second launch sums in split order
  (`skinny.reduce_split`: deterministic). Where the caller asks (`acts`, the op choice
  `fp8_decode`) and the weight has 128 x 128 blocks, A8 configs (W8A8) take x quantised first as
  the prefill quantises it and multiply e4m3 by e4m3 on sm_90's wgmma, the weight tile on the
  left (W x^T). The first call per (M rounded up to a power of two, N, K, block, dtype, `acts`)
  autotunes, timing each candidate as a decode graph runs it
  (`timing.graph_bench`: in a CUDA graph, cold L2; a split config with its reduce): keep it out of
  graph capture (the engine's eager warm-up runs it first); later calls launch the chosen config
  directly.
- prefill (more rows): x is quantised per token per 128 columns to e4m3 (scale = amax * 1/448,
  fp32; one Triton pass, `quantize_groups`) and `torch.nn.functional.scaled_mm` multiplies
  with scale recipes BlockWise1x128 (x) and BlockWise128x128 (the weight's 128 x 128
  blocks), where the installed torch and cuBLAS (>= 12.9, sm_90) support it; per-channel
  weights (compressed-tensors) take
  `torch._scaled_mm` with per-token and per-channel scales. Support is probed once per
  `Fp8Gemm` with one small call, outside any capture. Without the block-scaled cuBLAS GEMM, a
  128 x 128-block weight takes our Triton w8a8 GEMM (`w8a8_gemm`: the same quantised x, e4m3
  products on the tensor cores, both scales applied per K block; autotuned per (N, K) on first
  use, outside any capture); any other shape or block is dequantised to x's dtype and
  multiplied by cuBLAS (correct, slow).

Knows nothing about the model.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ninfer.ops.cuda.skinny import num_sms, reduce_split
from ninfer.ops.cuda.timing import graph_bench
from ninfer.ops.fp8 import FP8_DTYPE, FP8_MAX, Fp8Weight, quantize_fp8

logger = logging.getLogger(__name__)
MAX_M = 8
# the decode GEMV's activations (`fp8_skinny`'s `acts`), as the kernel's A8_OK code: x as it
# is (W8A16), quantised like prefill (W8A8, A8 configs only), or whichever the autotuner times
# faster per shape
ACTS = {"w8a16": 0, "fastest": 1, "w8a8": 2}
GROUP = 128  # activation quantisation group (columns) of the block-scaled GEMM
ACT_EPS = 1e-12  # least amax of an activation group (an all-zero group gets a tiny scale)


def _config(
    bn: int,
    bk: int,
    warps: int,
    stages: int,
    dot: bool = True,
    split: int = 1,
    groups: int = 1,
    a8: bool = False,
) -> triton.Config:
    kw = {"BLOCK_N": bn, "BLOCK_K": bk, "DOT": dot, "STAGES": stages, "SPLIT_K": split}
    kw["GROUPS"], kw["BITS"], kw["A8"] = groups, False, a8
    hook = _quantize_hook if a8 else None  # timed with the config, run before its launch
    return triton.Config(kw, num_warps=warps, num_stages=stages, pre_hook=hook)


def _quantize_hook(nargs) -> None:
    """An A8 config's pre-hook: x quantised per token per GROUP columns into its buffers."""
    quant_groups_into(nargs["x"], nargs["xq"], GROUP, nargs["xs"])


# (BLOCK_N, BLOCK_K, num_warps, stages[, DOT[, SPLIT_K[, GROUPS]]]). e4m3 tiles are half the
# bytes of bf16 ones, so the tiles are wider than skinny.py's for the same bytes in flight; the
# GROUPS > 1 ones read 256 or 512 contiguous bytes of a row a step from a 128 x 128-block weight.
# Each comes twice: widening e4m3 by integer ops (BITS), for bf16 x, and by the conversion unit,
# for any other x. bf16 x times only the BITS ones: their best beat the conversion's best at
# every shape measured (docs/results-h200.md, the BITS configs).
_SHAPES = [
    _config(16, 128, 4, 4),
    _config(32, 128, 4, 4),
    _config(64, 128, 4, 4),
    _config(64, 128, 8, 3),
    _config(128, 128, 8, 3),
    _config(32, 64, 4, 5),
    _config(64, 64, 4, 5),
    _config(16, 256, 4, 4),
    _config(32, 256, 8, 3),
    _config(16, 128, 4, 4, dot=False),
    _config(32, 128, 4, 4, dot=False),
    _config(64, 128, 8, 3, dot=False),
    _config(32, 64, 4, 5, dot=False),
    _config(16, 256, 4, 4, dot=False),
    _config(16, 128, 4, 4, split=2),
    _config(32, 128, 4, 4, split=2),
    _config(64, 128, 8, 3, split=2),
    _config(16, 256, 4, 4, split=2),
    _config(16, 128, 4, 4, split=4),
    _config(32, 128, 4, 4, split=4),
    _config(16, 128, 4, 4, dot=False, split=2),
    _config(32, 128, 4, 4, dot=False, split=2),
    _config(16, 128, 4, 4, dot=False, split=4),
    _config(32, 128, 4, 3, groups=2),
    _config(16, 128, 4, 3, groups=4),
    _config(32, 128, 8, 3, groups=4),
    _config(64, 128, 8, 2, groups=2),
    _config(32, 128, 4, 3, groups=2, split=2),
    _config(16, 128, 4, 3, dot=False, groups=2),
    _config(16, 128, 4, 3, dot=False, groups=4),
    _config(32, 128, 8, 3, dot=False, groups=2),
]
# W8A8 (A8): x quantised to e4m3 first, as the prefill quantises it (per token per GROUP
# columns; one `quant_groups_into` launch, the config's pre-hook), and the product taken as
# W x^T, the weight tile on the left: at 64 or more rows Triton gives it to sm_90's wgmma
# straight from shared memory, e4m3 x e4m3, the weight never widened (under 64 rows it would
# widen both operands to f16).
_A8 = [
    _config(64, 128, 4, 4, a8=True),
    _config(64, 128, 4, 4, split=4, a8=True),
    _config(128, 128, 4, 4, a8=True),
    _config(128, 128, 8, 3, a8=True),
    _config(256, 128, 8, 3, a8=True),
    _config(64, 128, 4, 4, split=2, a8=True),
    _config(128, 128, 8, 3, split=2, a8=True),
    _config(128, 128, 4, 4, split=4, a8=True),
    _config(64, 128, 4, 3, groups=2, a8=True),
    _config(128, 128, 8, 3, groups=2, a8=True),
    _config(64, 128, 8, 3, groups=4, a8=True),
]
CONFIGS = (
    _SHAPES
    + [
        triton.Config({**c.kwargs, "BITS": True}, num_warps=c.num_warps, num_stages=c.num_stages)
        for c in _SHAPES
    ]
    + _A8
)


def _fits(
    c: triton.Config,
    one_row: bool,
    k: int,
    block_k: int,
    dtype: torch.dtype = torch.bfloat16,
    a8: int = 0,
) -> bool:
    """A config takes the shape: non-DOT only for M == 1; a K step inside one scale block;
    BITS exactly for bf16 x (`_widen`'s integer recipe is bf16's; other dtypes convert); A8
    configs only where asked, `a8` the mode's code in ACTS (0: none, 1: beside the others,
    2: alone)."""
    kw = c.kwargs
    if kw["A8"]:
        return a8 > 0 and kw["DOT"] and kw["BLOCK_K"] == GROUP and k % GROUP == 0
    if a8 == 2 or (not kw["DOT"] and not one_row) or kw["BITS"] != (dtype == torch.bfloat16):
        return False
    return block_k >= k or block_k % kw["BLOCK_K"] == 0


def a8_admits(w: Fp8Weight) -> bool:
    """Whether decode may quantise x for w (A8 configs): GROUP x GROUP blocks, the fine-grained
    scheme whose prefill quantises x per token per GROUP columns, so decode then computes as
    prefill does."""
    return w.block == (GROUP, GROUP) and w.qweight.shape[-1] % GROUP == 0


def check_acts(acts: str) -> str:
    """`acts` itself; ValueError unless it is one of ACTS."""
    if acts not in ACTS:
        raise ValueError(f"acts must be one of {tuple(ACTS)}, got {acts!r}")
    return acts


def a8_code(w: Fp8Weight, acts: str) -> int:
    """`acts` (one of ACTS) as the kernel's A8_OK: 0 where w admits no A8 config."""
    return ACTS[check_acts(acts)] if a8_admits(w) else 0


def _worth_timing(c: triton.Config, n: int, k: int, sms: int) -> bool:
    """SPLIT_K > 1 only where the columns leave SMs idle (fewer than 2 column blocks per SM)
    and each split keeps at least 4 K steps, as `skinny` prunes."""
    kw = c.kwargs
    split = kw["SPLIT_K"]
    blocks = triton.cdiv(n, kw["BLOCK_N"])
    steps = triton.cdiv(k, kw["BLOCK_K"] * kw["GROUPS"])
    return split == 1 or (blocks < 2 * sms and steps >= 4 * split)


def _prune(configs, nargs, **kwargs) -> list[triton.Config]:
    one_row, n, k, block_k = nargs["M"] == 1, nargs["N"], nargs["K"], nargs["BK_W"]
    x, a8 = nargs["x"], nargs["A8_OK"]
    sms = num_sms(x.device)
    fits = [c for c in configs if _fits(c, one_row, k, block_k, x.dtype, a8)]
    return [c for c in fits if _worth_timing(c, n, k, sms)]


def _reduce_hook(nargs, exception=None) -> None:
    """Autotune post-hook: a split-K config is timed with its reduce launch."""
    if exception is None and nargs["SPLIT_K"] > 1:
        reduce_split(nargs["part"], nargs["y"], nargs["SPLIT_K"])


# Four e4m3 bytes ($2, one 32-bit word) -> four bf16 ($0: bytes 0 and 1, $1: bytes 2 and 3).
# prmt puts each byte in the top of a 16-bit lane (sign at bit 15, exponent and mantissa under
# it); the exponent and mantissa move four places down, into bf16's, which gives the e4m3 value
# times 2^-120 (bf16's exponent bias, 127, against e4m3's 7; subnormals included: bf16 subnormals
# times 2^-120 likewise); one bf16x2 multiply by 2^120 (0x7B80) per two weights makes it exact.
E4M3_BF16_ASM = tl.constexpr("""{
.reg .b32 a, b, lift, nz;
mov.b32 lift, 0x7B807B80;
mov.b32 nz, 0x80008000;
prmt.b32 a, $2, 0, 0x1404;
prmt.b32 b, $2, 0, 0x3424;
and.b32 $0, a, 0x80008000;
and.b32 $1, b, 0x80008000;
and.b32 a, a, 0x7F007F00;
and.b32 b, b, 0x7F007F00;
shr.b32 a, a, 4;
shr.b32 b, b, 4;
or.b32 $0, $0, a;
or.b32 $1, $1, b;
fma.rn.bf16x2 $0, $0, lift, nz;
fma.rn.bf16x2 $1, $1, lift, nz;
}""")


@triton.jit
def _widen(wt, dtype: tl.constexpr, BITS: tl.constexpr):  # dtype: x's
    """e4m3 -> dtype, exact. BITS (bf16 x only): four weights a time in integer ops and two
    bf16x2 multiplies (`E4M3_BF16_ASM`). Else the conversion unit's: e4m3x2 -> f16x2, then one
    f16 -> bf16 per weight."""
    if BITS and dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(
            asm=E4M3_BF16_ASM,
            constraints="=r,=r,r",
            args=[wt.to(tl.uint8, bitcast=True)],
            dtype=tl.bfloat16,
            is_pure=True,
            pack=4,
        )
    return wt.to(dtype)


@triton.autotune(
    CONFIGS,
    key=["M_KEY", "N", "K", "BN_W", "BK_W", "A8_OK"],
    prune_configs_by={"early_config_prune": _prune},
    post_hook=_reduce_hook,
    do_bench=graph_bench,
)
@triton.heuristics(
    {
        "EVEN_N": lambda a: a["N"] % a["BLOCK_N"] == 0,
        "EVEN_K": lambda a: a["K"] % (a["BLOCK_K"] * a["GROUPS"]) == 0,
    }
)
@triton.jit
def _fp8_skinny_kernel(
    x, w, s, y, part, xq, xs, M, N, K, M_KEY, s_xm, s_ym, s_sn, s_qm, s_xsg, BN_W, BK_W, A8_OK,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr, STAGES: tl.constexpr,
    SPLIT_K: tl.constexpr, GROUPS: tl.constexpr, BITS: tl.constexpr, A8: tl.constexpr,
    EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    """Program (nb, sk): y[:, nb * BLOCK_N : (nb + 1) * BLOCK_N] over the sk-th K range, into y
    (SPLIT_K == 1) or part[sk] (fp32 [SPLIT_K, M, N]). w [N, K] e4m3, s the scales
    [ceil(N / BN_W), ceil(K / BK_W)] fp32 with row stride s_sn. A step covers GROUPS tiles of
    BLOCK_K columns, each inside one scale block. A8: x quantised beforehand (BLOCK_K == GROUP):
    xq [M, K] e4m3 (row stride s_qm) with scales xs [M, K / GROUP] (group stride s_xsg), e4m3
    products times both scales. M_KEY and A8_OK are only autotune keys."""
    STEP: tl.constexpr = BLOCK_K * GROUPS
    nb, sk = tl.program_id(0), tl.program_id(1)
    n0 = nb * BLOCK_N
    k_span = tl.cdiv(tl.cdiv(K, STEP), SPLIT_K) * STEP
    k_lo = sk * k_span
    k_hi = tl.minimum(K, k_lo + k_span)
    rows = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    n_ok = n0 + rows < N
    w_ptrs = w + n0.to(tl.int64) * K + rows[:, None] * K + (k_lo + cols)[None, :]
    s_ptrs = s + ((n0 + rows) // BN_W).to(tl.int64) * s_sn  # each row's scale row
    if A8:  # W x^T: the weight tile is the product's left operand (64+ rows: wgmma)
        xm = tl.arange(0, 16)
        x_ptrs = xq + xm[:, None] * s_qm + (k_lo + cols)[None, :]
        acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    elif DOT:
        xm = tl.arange(0, 16)
        x_ptrs = x + xm[:, None] * s_xm + (k_lo + cols)[None, :]
        acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    else:
        x_ptrs = x + k_lo + cols
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in tl.range(k_lo, k_hi, STEP, num_stages=STAGES):
        for g in tl.static_range(GROUPS):  # the step's tiles, loaded side by side along K
            kg = k + g * BLOCK_K
            k_ok = kg + cols < K
            if EVEN_N and EVEN_K:
                wt = tl.load(w_ptrs + g * BLOCK_K, eviction_policy="evict_first")
            elif EVEN_K:
                wt = tl.load(
                    w_ptrs + g * BLOCK_K, mask=n_ok[:, None], other=0.0,
                    eviction_policy="evict_first",
                )  # fmt: skip
            else:
                w_ok = n_ok[:, None] & k_ok[None, :]
                wt = tl.load(
                    w_ptrs + g * BLOCK_K, mask=w_ok, other=0.0, eviction_policy="evict_first"
                )
            # [BLOCK_N] fp32; a tile past K (the last step's) is zeros: any in-range scale
            sc = tl.load(s_ptrs + tl.minimum(kg, K - 1) // BK_W, mask=n_ok, other=0.0)
            if DOT:
                x_ok = (xm < M)[:, None]
                if not EVEN_K:
                    x_ok = x_ok & k_ok[None, :]
                xt = tl.load(x_ptrs + g * BLOCK_K, mask=x_ok, other=0.0)
                if A8:  # xt: e4m3, with one scale per row for the tile (0 past K: the
                    # tile's scale column lies past xs's, and 0 * a stray NaN would be NaN)
                    x_ok_k = (xm < M) & (kg + xm * 0 < K)  # (a block: the interpreter)
                    x_sc = tl.load(xs + xm + (kg // BLOCK_K) * s_xsg, mask=x_ok_k, other=0.0)
                    prod = tl.dot(wt, tl.trans(xt.to(wt.dtype)))  # [BLOCK_N, 16] fp32
                    acc += prod * sc[:, None] * x_sc[None, :]
                else:
                    prod = tl.dot(xt, tl.trans(_widen(wt, xt.dtype, BITS)))  # [16, BLOCK_N]
                    acc += prod * sc[None, :]
            else:
                if EVEN_K:
                    xt = tl.load(x_ptrs + g * BLOCK_K)
                else:
                    xt = tl.load(x_ptrs + g * BLOCK_K, mask=k_ok, other=0.0)
                wf = _widen(wt, xt.dtype, BITS).to(tl.float32)
                prod = tl.sum(wf * xt.to(tl.float32)[None, :], axis=1)
                acc += prod * sc
        w_ptrs += STEP
        x_ptrs += STEP
    offs_n = n0 + rows
    if A8:
        ok = n_ok[:, None] & (xm < M)[None, :]
        if SPLIT_K == 1:
            out = y + xm[None, :] * s_ym + offs_n[:, None]
            tl.store(out, acc.to(y.dtype.element_ty), mask=ok)
        else:
            tl.store(part + (sk * M + xm)[None, :] * N + offs_n[:, None], acc, mask=ok)
    elif DOT:
        ok = (xm < M)[:, None] & n_ok[None, :]
        if SPLIT_K == 1:
            out = y + xm[:, None] * s_ym + offs_n[None, :]
            tl.store(out, acc.to(y.dtype.element_ty), mask=ok)
        else:
            tl.store(part + (sk * M + xm)[:, None] * N + offs_n[None, :], acc, mask=ok)
    elif SPLIT_K == 1:
        tl.store(y + offs_n, acc.to(y.dtype.element_ty), mask=n_ok)
    else:
        tl.store(part + sk * N + offs_n, acc, mask=n_ok)


def _gemm_config(bm: int, bn: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)


GEMM_CONFIGS = [
    _gemm_config(64, 128, 4, 3),
    _gemm_config(128, 128, 8, 3),
    _gemm_config(128, 64, 4, 4),
    _gemm_config(64, 64, 4, 4),
    _gemm_config(128, 256, 8, 3),
]


@triton.autotune(GEMM_CONFIGS, key=["N", "K"], do_bench=graph_bench)
@triton.jit
def _w8a8_kernel(
    xq, xs, w, ws, y, M, N, K, s_xm, s_xsm, s_xsk, s_wsn, s_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program (mb, nb): y[mb block, nb block] = sum over K blocks kb of
    (xq . wq) * xs[m, kb] * ws[n // BLOCK_K, kb], e4m3 x e4m3 products in fp32 (tensor cores).
    xq [M, K] e4m3 with scales xs [M, K / BLOCK_K] (strides s_xsm, s_xsk); w [N, K] e4m3 with
    scales ws [ceil(N / BLOCK_K), K / BLOCK_K] (row stride s_wsn): square blocks of BLOCK_K."""
    mb, nb = tl.program_id(0), tl.program_id(1)
    rm = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    x_ptrs = xq + rm.to(tl.int64)[:, None] * s_xm + rk[None, :]
    w_ptrs = w + rn.to(tl.int64)[:, None] * K + rk[None, :]
    xs_ptrs = xs + rm * s_xsm
    ws_ptrs = ws + (rn // BLOCK_K) * s_wsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        b = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        a_s = tl.load(xs_ptrs + kb * s_xsk, mask=m_ok, other=0.0)
        b_s = tl.load(ws_ptrs + kb, mask=n_ok, other=0.0)
        acc += tl.dot(a, tl.trans(b)) * a_s[:, None] * b_s[None, :]
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out = y + rm.to(tl.int64)[:, None] * s_ym + rn[None, :]
    tl.store(out, acc.to(y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def w8a8_fits(x: torch.Tensor, w: Fp8Weight) -> bool:
    """Whether `w8a8_gemm` takes x [M, K] and w: bf16 / fp16 x, a contiguous 2-D weight in
    GROUP x GROUP blocks, K a multiple of GROUP."""
    return (
        x.dim() == 2
        and x.dtype in (torch.bfloat16, torch.float16)
        and w.qweight.dim() == 2
        and w.qweight.is_contiguous()
        and w.scale.stride(-1) == 1
        and w.block == (GROUP, GROUP)
        and x.shape[1] % GROUP == 0
    )


def w8a8_gemm(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """y = x @ dequantize(w)^T with x quantised per token per GROUP columns (`quantize_groups`),
    by `_w8a8_kernel` (`w8a8_fits`); the first call per (N, K) autotunes on the device."""
    (m, k), n = x.shape, w.qweight.shape[0]
    q, xs = quantize_groups(x, GROUP)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))  # noqa: E731
    _w8a8_kernel[grid](
        q, xs, w.qweight, w.scale, y, m, n, k, q.stride(0), xs.stride(0), xs.stride(1),
        w.scale.stride(0), y.stride(0), BLOCK_K=GROUP,
    )  # fmt: skip
    return y


def skinny_fits(x: torch.Tensor, w: Fp8Weight) -> bool:
    """Whether `fp8_skinny` takes x [M, K] and w: 1..MAX_M rows of bf16 / fp16 with unit stride
    along K, a contiguous 2-D weight, and some config's K step inside one scale block."""
    if not (x.dim() == 2 and w.qweight.dim() == 2 and 0 < x.shape[0] <= MAX_M):
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) or x.stride(-1) != 1:
        return False
    if not (w.qweight.is_contiguous() and w.scale.stride(-1) == 1):
        return False
    k, block_k = w.qweight.shape[1], w.block[1]
    return any(_fits(c, x.shape[0] == 1, k, block_k, x.dtype) for c in CONFIGS)


def fp8_skinny(
    x: torch.Tensor, w: Fp8Weight, config: triton.Config | None = None, acts: str = "w8a16"
) -> torch.Tensor:
    """y = x @ dequantize(w)^T for x [M, K] (`skinny_fits`), in x.dtype. `acts` (ACTS) where
    `a8_admits(w)`: "w8a8" runs A8 configs (x quantised per token per GROUP columns, as prefill
    does), "fastest" whichever config the autotuner times fastest, A8 or not; elsewhere x stays
    as it is. `config` forces one of CONFIGS (tests); else the autotuned one (first call per
    key times the candidates)."""
    if not skinny_fits(x, w):
        raise ValueError(
            f"fp8_skinny needs x [1..{MAX_M}, K] bf16/fp16 and a contiguous FP8 weight, got x "
            f"{tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} block {w.block}"
        )
    (m, k), n = x.shape, w.qweight.shape[0]
    a8 = a8_code(w, acts)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    key = _key(x, w, a8)
    config = config or _TUNED.get(key)  # `tuned_config`
    if config is not None:
        _launch(x, w.qweight, w.scale, w.block, y, config, a8)
        return y
    # first call for the key: the autotuner times the candidates, then runs the best
    sms = num_sms(x.device)
    split = max(c.kwargs["SPLIT_K"] for c in CONFIGS if _worth_timing(c, n, k, sms))
    args = _args(x, w.qweight, w.scale, w.block, y, split, a8)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])  # noqa: E731
    _fp8_skinny_kernel.configs_timings = None
    _fp8_skinny_kernel[grid](*args)
    config = _TUNED[key] = _fp8_skinny_kernel.best_config
    times = _fp8_skinny_kernel.configs_timings or {}  # None: tuned from the disk cache
    _TIMES[key] = {c: t[0] if isinstance(t, (list, tuple)) else t for c, t in times.items()}
    if config.kwargs["SPLIT_K"] > 1:
        reduce_split(args[4], y, config.kwargs["SPLIT_K"])
    return y


# (M rounded up to a power of two, N, K, block, dtype, `a8_code`)
_TUNED: dict[tuple, triton.Config] = {}
_TIMES: dict[tuple, dict[triton.Config, float]] = {}  # the same keys: `tuning_times`


def _key(x: torch.Tensor, w: Fp8Weight, a8: int) -> tuple:
    n, k = w.qweight.shape
    return (triton.next_power_of_2(x.shape[0]), n, k, w.block, x.dtype, a8)


def tuned_config(x: torch.Tensor, w: Fp8Weight, acts: str = "w8a16") -> triton.Config | None:
    """The config `fp8_skinny(x, w, acts=acts)` runs (None until its first call for these
    shapes)."""
    return _TUNED.get(_key(x, w, a8_code(w, acts)))


def tuning_times(x: torch.Tensor, w: Fp8Weight, acts: str = "w8a16") -> dict[triton.Config, float]:
    """The autotuner's ms per candidate config when `fp8_skinny(x, w, acts=acts)` tuned these
    shapes (cold-L2 device time in a CUDA graph, a split config's reduce included); {} before,
    or when the tuning came from Triton's disk cache."""
    return _TIMES.get(_key(x, w, a8_code(w, acts)), {})


def _args(x, qweight, scale, block, y, split: int, a8: int, quantised: bool | None = None) -> tuple:
    """The kernel's positional args, with a fp32 scratch for `split` partials (a 1-element
    stand-in when split == 1) and, where an A8 config may run (`quantised`, by default a8 > 0),
    the buffers x is quantised into (e4m3, or fp32 under the interpreter, and the scales);
    elsewhere the weight and its scales stand in for them (same dtypes, never read)."""
    (m, k), n = x.shape, qweight.shape[0]
    dev = x.device
    part = torch.empty(split * m * n if split > 1 else 1, dtype=torch.float32, device=dev)
    xq, xs = qweight, scale
    if a8 > 0 if quantised is None else quantised:
        xq = torch.empty(m, k, dtype=qweight.dtype, device=dev)
        xs = torch.empty(k // GROUP, m, dtype=torch.float32, device=dev).t()
    return (x, qweight, scale, y, part, xq, xs, m, n, k, triton.next_power_of_2(m), x.stride(0),
            y.stride(0), scale.stride(0), xq.stride(0), xs.stride(1), *block, a8)  # fmt: skip


def _launch(x, qweight, scale, block, y, config: triton.Config, a8: int = 0) -> None:
    """y = x @ (qweight * scale)^T with one config, no autotune; an A8 config's x quantised
    first, as its pre-hook does. Also under the Triton interpreter, which takes `qweight` in
    x's dtype (e4m3 values are exact there) and keeps an A8 config's quantised x unrounded in
    fp32."""
    split = config.kwargs["SPLIT_K"]
    quantised = config.kwargs["A8"]
    args = _args(x, qweight, scale, block, y, split, a8 or int(quantised), quantised)
    if quantised:
        quant_groups_into(x, args[5], GROUP, args[6])
    grid = (triton.cdiv(qweight.shape[0], config.kwargs["BLOCK_N"]), split)
    _fp8_skinny_kernel.fn[grid](*args, **config.all_kwargs())
    if split > 1:
        reduce_split(args[4], y, split)


def quantize_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of `group`) per token per `group` columns to e4m3: (q [M, K],
    scales [M, K / group] fp32, column-major as cuBLAS reads them). scale = amax * fp32(1 /
    FP8_MAX), as torch's CUDA division by a number computes amax / FP8_MAX. One pass of
    `_quant_groups_kernel` on CUDA (read x once, write q and the scales), bit for bit
    `quantize_groups_ref`, which runs elsewhere."""
    if not x.is_cuda:
        return quantize_groups_ref(x, group)
    x = x if x.stride(-1) == 1 else x.contiguous()  # any row stride; unit stride along K
    q = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    return q, quant_groups_into(x, q, group)


def quantize_groups_ref(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_groups` in torch ops (five passes over an fp32 copy of x): the oracle."""
    m, k = x.shape
    xf = x.float().view(m, k // group, group)
    scale = xf.abs().amax(dim=-1).clamp(min=ACT_EPS) * (1 / FP8_MAX)
    q = (xf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(m, k)
    return q, scale.t().contiguous().t()


QUANT_ROWS = 16  # rows a `_quant_groups_kernel` program takes: a [16, group] tile


def quant_groups_into(
    x: torch.Tensor, q: torch.Tensor, group: int, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] quantised into q ([M, K], unit stride along K; e4m3, or fp32 under the Triton
    interpreter, which holds the unrounded quotients): returns the scales [M, K / group] fp32,
    column-major (into `scale` when given: [M, K / group], unit stride along M)."""
    m, k = x.shape
    if k % group or x.stride(-1) != 1 or q.shape != x.shape or q.stride(-1) != 1:
        raise ValueError(
            f"quant_groups_into needs K a multiple of {group} and x, q of one shape with unit "
            f"stride along K: x {tuple(x.shape)} {x.stride()}, q {tuple(q.shape)} {q.stride()}"
        )
    if scale is None:
        scale = torch.empty(k // group, m, dtype=torch.float32, device=x.device).t()
    elif scale.shape != (m, k // group) or scale.stride(0) != 1:
        raise ValueError(f"quant_groups_into needs scale [{m}, {k // group}] column-major")
    if m == 0:
        return scale
    grid = (triton.cdiv(m, QUANT_ROWS), k // group)
    _quant_groups_kernel[grid](
        x, q, scale, m, x.stride(0), q.stride(0), scale.stride(1), ACT_EPS, 1 / FP8_MAX, FP8_MAX,
        GROUP_K=group, ROWS=QUANT_ROWS,
    )  # fmt: skip
    return scale


@triton.jit
def _quant_groups_kernel(
    x, q, s, M, s_xm, s_qm, s_sg, eps, inv_qmax, qmax, GROUP_K: tl.constexpr, ROWS: tl.constexpr
):
    """Program (pm, g): rows [pm * ROWS, (pm + 1) * ROWS), columns of group g. As the torch
    ops: scale = max(amax, eps) * fp32(1 / qmax) and q = clamp(x / scale), an IEEE division,
    so the e4m3 rounding (round to nearest even) sees the same quotients."""
    pm, g = tl.program_id(0), tl.program_id(1)
    rows = pm * ROWS + tl.arange(0, ROWS)
    cols = g * GROUP_K + tl.arange(0, GROUP_K)
    ok = rows < M
    r64 = rows.to(tl.int64)
    xt = tl.load(x + r64[:, None] * s_xm + cols[None, :], mask=ok[:, None], other=0.0)
    xt = xt.to(tl.float32)
    amax = tl.max(tl.abs(xt), axis=1)
    sc = tl.maximum(amax, eps) * inv_qmax
    qt = tl.math.div_rn(xt, sc[:, None])
    qt = tl.minimum(tl.maximum(qt, -qmax), qmax)
    tl.store(q + r64[:, None] * s_qm + cols[None, :], qt.to(q.dtype.element_ty), mask=ok[:, None])
    tl.store(s + rows + g * s_sg, sc, mask=ok)


def _blockwise(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """cuBLAS's 1x128 x 128x128 block-scaled GEMM: M padded to a multiple of 4 and the weight's
    K blocks to a multiple of 4 (cuBLAS's layout rules), the padding sliced off."""
    m = x.shape[0]
    xp = F.pad(x, (0, 0, 0, -m % 4)) if m % 4 else x
    q, xs = quantize_groups(xp, GROUP)
    kb = w.scale.shape[1]
    ws = F.pad(w.scale, (0, -kb % 4)) if kb % 4 else w.scale
    out = F.scaled_mm(
        q, w.qweight.t(), xs, F.ScalingType.BlockWise1x128, ws.t(),
        F.ScalingType.BlockWise128x128, output_dtype=x.dtype,
    )  # fmt: skip
    return out[:m]


def _rowwise(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """Per-token x scales times per-channel weight scales (`torch._scaled_mm`, row-wise)."""
    xf = x.float()
    xs = xf.abs().amax(dim=-1, keepdim=True).clamp(min=ACT_EPS) / FP8_MAX
    q = (xf / xs).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return torch._scaled_mm(
        q, w.qweight.t(), scale_a=xs, scale_b=w.scale.t().float(), out_dtype=x.dtype
    )


def _dequantized(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    return F.linear(x, w.dequantize(x.dtype))


class Fp8Gemm:
    """y = x @ dequantize(w)^T on CUDA, by shape (module docstring); `acts` (ACTS) the decode
    GEMV's activations. Probes the block-scaled and row-wise GEMMs once each, eagerly; a call
    during a CUDA-graph capture before its probe takes the dequantising fallback."""

    def __init__(self, acts: str = "w8a16") -> None:
        self.acts = check_acts(acts)  # the decode GEMV's activations (`fp8_skinny`)
        self.support: dict[str, bool] = {}  # "blockwise" | "rowwise" -> works here
        self.tuned: set[tuple[int, int]] = set()  # (N, K) the Triton GEMM has tuned

    def __call__(self, x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
        if skinny_fits(x, w):
            return fp8_skinny(x, w, acts=self.acts)
        kind = self._kind(x, w)
        if kind is not None and self._supported(kind, x.device):
            return (_blockwise if kind == "blockwise" else _rowwise)(x, w)
        if w8a8_fits(x, w):
            key = tuple(w.qweight.shape)
            if key in self.tuned or not torch.cuda.is_current_stream_capturing():
                self.tuned.add(key)
                return w8a8_gemm(x, w)
        return _dequantized(x, w)

    @staticmethod
    def _kind(x: torch.Tensor, w: Fp8Weight) -> str | None:
        """The cuBLAS FP8 GEMM whose layout rules these shapes meet, if any."""
        n, k = w.qweight.shape[-2:]
        plain = (
            x.dim() == 2
            and x.dtype in (torch.bfloat16, torch.float16)
            and w.qweight.dim() == 2
            and w.qweight.is_contiguous()
            and k % 16 == 0
            and n % 16 == 0
        )
        if not plain:
            return None
        if w.block == (GROUP, GROUP) and k % GROUP == 0 and n % GROUP == 0:
            return "blockwise"
        return "rowwise" if w.per_channel else None

    def _supported(self, kind: str, device: torch.device) -> bool:
        if kind not in self.support:
            if torch.cuda.is_current_stream_capturing():
                return False
            self.support[kind] = _probe(kind, device)
        return self.support[kind]


def _probe(kind: str, device: torch.device) -> bool:
    """Whether the installed torch / cuBLAS runs `kind` on `device` and matches the
    dequantising product (one warning when not)."""
    gen = torch.Generator(device).manual_seed(0)
    block = (GROUP, GROUP) if kind == "blockwise" else (1, 256)
    w = quantize_fp8(torch.randn(256, 256, device=device, generator=gen), block)
    x = torch.randn(8, 256, device=device, generator=gen).to(torch.bfloat16)
    try:
        got = (_blockwise if kind == "blockwise" else _rowwise)(x, w)
    except (RuntimeError, AttributeError, NotImplementedError, TypeError) as e:
        logger.warning("FP8 %s GEMM unavailable (%s): FP8 prefill dequantises", kind, e)
        return False
    want = _dequantized(x, w).float()
    err = ((got.float() - want).norm() / want.norm()).item()
    if not err < 0.1:
        logger.warning("FP8 %s GEMM is off (relative error %.3g): dequantising", kind, err)
        return False
    return True
