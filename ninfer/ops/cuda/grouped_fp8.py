"""A grouped GEMM over FP8 expert weights (W8A16), for the MoE's prefill-sized passes.

The pairs (token, expert) come sorted by expert: pair rows [offs[e - 1], offs[e]) belong to
expert e. The rows of each expert are cut into blocks of BLOCK_M; `block_end[e]` is the number
of blocks of experts 0..e (a cumulative sum: no host sync). Program (b, nb) finds the expert of
block b by a binary search over block_end (a program past the last block returns), and computes

    out[r, n] = sum_k a[src(r), k] * float(q[e, n, k]) * scale[e, n // BN_W, k // BK_W]

for the block's rows r and columns [nb * BLOCK_N, (nb + 1) * BLOCK_N); src(r) = rows[r] (the
token of a sorted pair: a gather of x) or r itself. Each K step loads a [BLOCK_M, BLOCK_K] tile
of a and a [BLOCK_N, BLOCK_K] e4m3 tile of the expert, converts the e4m3 tile to a's dtype
(exact: every e4m3 value is a bf16 value), multiplies on the tensor cores with fp32 sums, and
adds that product times the step's column scales (a step lies inside one scale block along K:
BLOCK_K divides BK_W, or the block spans K; so the dequantised weight is never rounded). The
output is rounded to out's dtype once; with `weights` it is then multiplied by the pair's
routing weight and rounded again, as the reference's `grouped_mm(...) * w` rounds.

Against expanding every expert to bf16 per call (`moe.moe_dequantized`), it reads each e4m3
weight byte once per M block and allocates no [E, N, K] bf16 copy. BLOCK_M is chosen by the
caller from the mean pairs per expert (`block_m`); BLOCK_N, BLOCK_K, warps and stages are
autotuned per (N, K, BLOCK_M, scale block), timed in a CUDA graph (`timing.graph_bench`). The
first call per weight shape tunes and compiles every BLOCK_M at once, so a later pass of
another length, or a CUDA-graph capture, finds them ready; that first call must be eager (the
engine's warm-up makes it), and one inside a capture raises. Knows nothing about the model.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.ops.cuda.timing import graph_bench
from ninfer.ops.fp8 import Fp8Weight

_INTERPRET = triton.knobs.runtime.interpret


def _config(bn: int, bk: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps, num_stages=stages)


# (BLOCK_N, BLOCK_K, warps, stages); BLOCK_K <= 128 keeps a step inside a 128-column scale block
CONFIGS = [
    _config(64, 128, 4, 3),
    _config(128, 128, 4, 3),
    _config(128, 128, 8, 3),
    _config(128, 64, 4, 4),
    _config(64, 64, 4, 4),
    _config(256, 64, 8, 3),
]


def _fits(c: triton.Config, k: int, bk_w: int) -> bool:
    """A config's K step lies inside one scale block."""
    return bk_w >= k or bk_w % c.kwargs["BLOCK_K"] == 0


def _prune(configs, nargs, **kwargs) -> list[triton.Config]:
    return [c for c in configs if _fits(c, nargs["K"], nargs["BK_W"])]


@triton.autotune(
    CONFIGS[:1] if _INTERPRET else CONFIGS,
    key=["N", "K", "BLOCK_M", "BN_W", "BK_W", "GATHER", "WEIGHTED"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=graph_bench,
)
@triton.jit
def _grouped_fp8_kernel(
    a, rows, q, s, offs, block_end, wts, out, N, K, E, s_am, s_qe, s_qn, s_se, s_sn, s_om,
    BN_W, BK_W, BLOCK_M: tl.constexpr, LOG_E: tl.constexpr, GATHER: tl.constexpr,
    WEIGHTED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program (b, nb): out rows of M block b, columns block nb (module docstring). LOG_E:
    the binary search's steps (2 ** LOG_E >= E)."""
    b, nb = tl.program_id(0), tl.program_id(1)
    if b >= tl.load(block_end + E - 1):
        return
    lo = b * 0
    hi = lo + E - 1
    for _ in tl.static_range(LOG_E):  # the least e with block_end[e] > b
        mid = (lo + hi) // 2
        above = tl.load(block_end + mid) > b
        hi = tl.where(above, mid, hi)
        lo = tl.where(above, lo, mid + 1)
    e = lo
    first = tl.load(block_end + e - 1, mask=e > 0, other=0)  # blocks of experts before e
    start = tl.load(offs + e - 1, mask=e > 0, other=0)
    end = tl.load(offs + e)
    r = start + (b - first) * BLOCK_M + tl.arange(0, BLOCK_M)
    r_ok = r < end
    if GATHER:
        src = tl.load(rows + r, mask=r_ok, other=0)
    else:
        src = r
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a + src.to(tl.int64)[:, None] * s_am + offs_k[None, :]
    q_ptrs = q + e.to(tl.int64) * s_qe + offs_n.to(tl.int64)[:, None] * s_qn + offs_k[None, :]
    s_ptrs = s + e.to(tl.int64) * s_se + (offs_n // BN_W) * s_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + offs_k < K
        at = tl.load(a_ptrs + k0, mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        qt = tl.load(q_ptrs + k0, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        sc = tl.load(s_ptrs + k0 // BK_W, mask=n_ok, other=0.0)  # [BLOCK_N] fp32
        acc += tl.dot(at, tl.trans(qt.to(at.dtype))) * sc[None, :]
    dt = out.dtype.element_ty
    y = acc.to(dt)
    if WEIGHTED:
        w = tl.load(wts + r, mask=r_ok, other=0.0).to(tl.float32)
        y = (y.to(tl.float32) * w[:, None]).to(dt)
    o_ptrs = out + r.to(tl.int64)[:, None] * s_om + offs_n[None, :]
    tl.store(o_ptrs, y, mask=r_ok[:, None] & n_ok[None, :])


BLOCK_MS = (16, 32, 64, 128)  # the BLOCK_M `block_m` picks from


def block_m(pairs: int, experts: int) -> int:
    """BLOCK_M for `pairs` sorted pairs over `experts` experts: the least of BLOCK_MS at or
    above the mean pairs per expert (the largest past it)."""
    mean = -(-pairs // max(experts, 1))
    return next((m for m in BLOCK_MS if m >= mean), BLOCK_MS[-1])


def block_table(counts: torch.Tensor, bm: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(offs, block_end) int32 [E] for per-expert pair counts [E] and BLOCK_M `bm`, on the
    device (no host sync)."""
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    block_end = torch.cumsum((counts + bm - 1) // bm, 0, dtype=torch.int32)
    return offs, block_end


def fits(dtype: torch.dtype, w: Fp8Weight) -> bool:
    """Whether `grouped_fp8` takes activations of `dtype` and the stacked FP8 experts w
    [E, N, K]: bf16 or fp16 (fp32 too under the interpreter), contiguous e4m3 values, scales
    with unit stride along K, and some config's K step inside one scale block."""
    dtypes = (torch.bfloat16, torch.float16) + ((torch.float32,) if _INTERPRET else ())
    if dtype not in dtypes or w.qweight.dim() != 3:
        return False
    if not (w.qweight.is_contiguous() and w.scale.stride(-1) == 1):
        return False
    k = w.qweight.shape[-1]
    return any(_fits(c, k, w.block[1]) for c in CONFIGS)


def grouped_fp8(
    a: torch.Tensor,
    rows: torch.Tensor | None,
    w: Fp8Weight,
    offs: torch.Tensor,
    block_end: torch.Tensor,
    bm: int,
    pairs: int,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """out [pairs, N] in a.dtype: sorted pair r times its expert's dequantised weight (module
    docstring). a [R, K] (`fits`; any row stride, unit stride along K); rows [pairs] (the row
    of a each pair reads; None: row r); offs and block_end from `block_table(counts, bm)`;
    weights [pairs] (the pairs' routing weights, in sorted order) multiply the output when
    given."""
    shaped = a.dim() == 2 and a.shape[1] == w.shape[-1] and a.stride(1) == 1
    if not (shaped and fits(a.dtype, w)):
        raise ValueError(
            f"grouped_fp8 needs a [R, K] bf16/fp16 and contiguous stacked FP8 experts, got a "
            f"{tuple(a.shape)} {a.dtype}, w {tuple(w.shape)} block {w.block}"
        )
    experts, n, k = w.qweight.shape
    out = torch.empty(pairs, n, dtype=a.dtype, device=a.device)
    if pairs == 0:
        return out
    key = (experts, n, k, w.block, a.dtype, rows is not None, weights is not None)
    if key not in _PRIMED:
        if a.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"grouped_fp8 first called for {key} inside a CUDA-graph capture: its tuning "
                "and compiles need an eager call first (the engine's warm-up)"
            )
        counts = torch.diff(offs, prepend=offs.new_zeros(1))
        for m in BLOCK_MS:  # every BLOCK_M a later pass (or a capture) may pick
            if m != bm:
                _launch(a, rows, w, offs, block_table(counts, m)[1], m, pairs, weights, out)
        _PRIMED.add(key)
    _launch(a, rows, w, offs, block_end, bm, pairs, weights, out)
    return out


# (E, N, K, block, dtype, gather, weighted) `grouped_fp8` has tuned and compiled at every BLOCK_M
_PRIMED: set[tuple] = set()


def _launch(a, rows, w, offs, block_end, bm, pairs, weights, out) -> None:
    experts, n, k = w.qweight.shape
    max_blocks = triton.cdiv(pairs, bm) + experts  # sum of ceil(count / bm) over the experts
    grid = lambda meta: (max_blocks, triton.cdiv(n, meta["BLOCK_N"]))  # noqa: E731
    log_e = max(1, (experts - 1).bit_length())
    rows_arg = rows if rows is not None else offs  # unread when GATHER is off
    wts = weights if weights is not None else offs  # unread when WEIGHTED is off
    _grouped_fp8_kernel[grid](
        a, rows_arg, w.qweight, w.scale, offs, block_end, wts, out, n, k, experts, a.stride(0),
        w.qweight.stride(0), w.qweight.stride(1), w.scale.stride(0), w.scale.stride(1),
        out.stride(0), w.block[0], w.block[1], BLOCK_M=bm, LOG_E=log_e,
        GATHER=rows is not None, WEIGHTED=weights is not None,
    )  # fmt: skip
