"""Skinny GEMM for decode: y[M, N] = x[M, K] @ w[N, K]^T for M <= 8 token rows, in Triton,
reading each weight byte once.

At decode every linear layer is bound by reading its weight (an nn.Linear weight, row-major).
cuBLAS nears the device copy bandwidth only on the largest (the lm_head); on mid-sized layers it
stays well below it and adds a split-K reduce kernel on the K-heavy ones. Meant for the linear
layers of a decode step (M = 1..8); for larger M use F.linear.

Program (nb, s) owns output columns [nb * BLOCK_N, (nb + 1) * BLOCK_N) and the s-th of SPLIT_K
K ranges (whole BLOCK_K steps). Each K step loads a [BLOCK_N, BLOCK_K] weight tile (evict-first)
and the same K slice of all M rows of x, then either

- DOT: x padded to 16 rows, acc[16, BLOCK_N] += x_tile @ w_tile^T on the tensor cores, or
- not DOT (M == 1 only): acc[BLOCK_N, BLOCK_K] += w_tile * x_tile on the CUDA cores, summed
  over K once at the end,

in fp32 (fp32 inputs: IEEE products, not TF32). The K loop is software-pipelined STAGES deep
(`tl.range(num_stages=...)`, which also pipelines loads that feed no dot). SPLIT_K == 1 stores
y in x.dtype directly; SPLIT_K > 1 stores fp32 partials [SPLIT_K, M, N] in a scratch and a
second launch sums them in a fixed order: deterministic.

The first `skinny_linear` call for a key (M rounded up to a power of two, N, K, dtype) runs
`triton.autotune` over CONFIGS (pruned by shape and SM count; a split-K config is timed with its
reduce) and remembers the winner, which later calls launch directly. Tuning times each
candidate as a decode graph runs it (`timing.graph_bench`: in a CUDA graph, cold L2), so that
first call must come before any CUDA-graph capture (the engine's warm-up);
later calls have no host sync and allocate only by shape (y, and the partials of a split-K
config), so they can be captured. Knows nothing about the model.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ninfer.ops.cuda.timing import graph_bench

MAX_M = 8
REDUCE_BLOCK = 1024


def _config(bn: int, bk: int, warps: int, stages: int, split: int = 1, dot: bool = True):
    kw = {"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "DOT": dot, "STAGES": stages}
    return triton.Config(kw, num_warps=warps, num_stages=stages)


# (BLOCK_N, BLOCK_K, num_warps, stages[, SPLIT_K[, DOT]]). A DOT stage holds BLOCK_N x BLOCK_K
# weights plus 16 x BLOCK_K of x in shared memory (bf16: 12-48 KiB); the M == 1 configs keep
# BLOCK_N * BLOCK_K / (32 * num_warps) <= 64 fp32 accumulators per thread.
CONFIGS = [
    _config(16, 512, 4, 4),
    _config(16, 256, 4, 5),
    _config(16, 512, 8, 3),
    _config(32, 128, 4, 5),
    _config(32, 256, 4, 4),
    _config(32, 512, 8, 3),
    _config(64, 128, 4, 5),
    _config(64, 256, 8, 4),
    _config(128, 64, 4, 5),
    _config(128, 128, 8, 4),
    _config(16, 512, 4, 4, split=2),
    _config(32, 256, 4, 4, split=2),
    _config(64, 256, 8, 3, split=2),
    _config(16, 256, 4, 4, split=4),
    _config(32, 256, 4, 4, split=4),
    _config(64, 128, 4, 4, split=4),
    _config(16, 512, 4, 3, dot=False),
    _config(16, 256, 4, 5, dot=False),
    _config(32, 256, 4, 4, dot=False),
    _config(32, 512, 8, 3, dot=False),
    _config(64, 128, 4, 4, dot=False),
    _config(16, 256, 4, 4, split=2, dot=False),
]


@functools.cache
def num_sms(device: torch.device) -> int:
    """The device's streaming multiprocessors (the split-K pruning's measure)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _candidates(one_row: bool, n: int, k: int, sms: int) -> tuple[triton.Config, ...]:
    """The configs worth timing for a shape: non-DOT only for M == 1; SPLIT_K > 1 only with
    fewer than 2 column blocks per SM and at least 4 K steps per split; at least half a program
    per SM, else (small N) the configs with the most programs."""

    def programs(c: triton.Config) -> int:
        return triton.cdiv(n, c.kwargs["BLOCK_N"]) * c.kwargs["SPLIT_K"]

    def fits(c: triton.Config) -> bool:
        kw = c.kwargs
        if not kw["DOT"] and not one_row:
            return False
        split = kw["SPLIT_K"]
        blocks = triton.cdiv(n, kw["BLOCK_N"])
        return split == 1 or (blocks < 2 * sms and triton.cdiv(k, kw["BLOCK_K"]) >= 4 * split)

    ok = [c for c in CONFIGS if fits(c)]
    full = [c for c in ok if 2 * programs(c) >= sms]
    if full:
        return tuple(full)
    most = max(map(programs, ok))
    return tuple(c for c in ok if programs(c) == most)


def _prune(configs, nargs, **kwargs) -> list[triton.Config]:
    m, n, k = nargs["M"], nargs["N"], nargs["K"]
    keep = _candidates(m == 1, n, k, num_sms(nargs["x"].device))
    return [c for c in configs if c in keep]


def _reduce_hook(nargs, exception=None) -> None:
    """Autotune post-hook: a split-K config is timed with its reduce launch."""
    if exception is None and nargs["SPLIT_K"] > 1:
        reduce_split(nargs["part"], nargs["y"], nargs["SPLIT_K"])


@triton.autotune(
    CONFIGS,
    key=["M_KEY", "N", "K"],
    prune_configs_by={"early_config_prune": _prune},
    post_hook=_reduce_hook,
    do_bench=graph_bench,
)
@triton.heuristics(
    {
        "EVEN_N": lambda a: a["N"] % a["BLOCK_N"] == 0,
        "EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0,
    }
)
@triton.jit
def _skinny_kernel(
    x, w, y, part, M, N, K, M_KEY, s_xm, s_ym,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, DOT: tl.constexpr,
    STAGES: tl.constexpr, IEEE: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    """Program (nb, s): columns [nb * BLOCK_N, (nb + 1) * BLOCK_N) over the s-th K range, into
    y (SPLIT_K == 1) or part[s] (fp32 [SPLIT_K, M, N]). M_KEY is only an autotune key."""
    nb, s = tl.program_id(0), tl.program_id(1)
    n0 = nb * BLOCK_N
    k_span = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = s * k_span
    k_hi = tl.minimum(K, k_lo + k_span)
    rows = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    n_ok = n0 + rows < N
    w_ptrs = w + n0.to(tl.int64) * K + rows[:, None] * K + (k_lo + cols)[None, :]
    if DOT:
        xm = tl.arange(0, 16)
        x_ptrs = x + xm[:, None] * s_xm + (k_lo + cols)[None, :]
        acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    else:
        x_ptrs = x + k_lo + cols
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
        k_ok = k + cols < K  # a split's range ends on a BLOCK_K step or at K
        if EVEN_N and EVEN_K:
            wt = tl.load(w_ptrs, eviction_policy="evict_first")
        elif EVEN_K:
            wt = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0, eviction_policy="evict_first")
        else:
            w_ok = n_ok[:, None] & k_ok[None, :]
            wt = tl.load(w_ptrs, mask=w_ok, other=0.0, eviction_policy="evict_first")
        if DOT:
            x_ok = (xm < M)[:, None]
            if not EVEN_K:
                x_ok = x_ok & k_ok[None, :]
            xt = tl.load(x_ptrs, mask=x_ok, other=0.0)
            if IEEE:
                acc = tl.dot(xt, tl.trans(wt), acc, input_precision="ieee")
            else:
                acc = tl.dot(xt, tl.trans(wt), acc)
        else:
            if EVEN_K:
                xt = tl.load(x_ptrs)
            else:
                xt = tl.load(x_ptrs, mask=k_ok, other=0.0)
            acc += wt.to(tl.float32) * xt.to(tl.float32)[None, :]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    offs_n = n0 + rows
    if DOT:
        ok = (xm < M)[:, None] & n_ok[None, :]
        if SPLIT_K == 1:
            y_ptrs = y + xm[:, None] * s_ym + offs_n[None, :]
            tl.store(y_ptrs, acc.to(y.dtype.element_ty), mask=ok)
        else:
            tl.store(part + (s * M + xm)[:, None] * N + offs_n[None, :], acc, mask=ok)
    else:
        out = tl.sum(acc, axis=1)
        if SPLIT_K == 1:
            tl.store(y + offs_n, out.to(y.dtype.element_ty), mask=n_ok)
        else:
            tl.store(part + s * N + offs_n, out, mask=n_ok)


@triton.jit
def _reduce_kernel(part, y, M, N, s_ym, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """Program (m, nb): y[m, n] = sum over s in order of part[s, m, n], n in block nb."""
    m, nb = tl.program_id(0), tl.program_id(1)
    offs = nb * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    acc = tl.load(part + m * N + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(part + (s * M + m) * N + offs, mask=ok, other=0.0)
    tl.store(y + m * s_ym + offs, acc.to(y.dtype.element_ty), mask=ok)


def reduce_split(part: torch.Tensor, y: torch.Tensor, split: int) -> None:
    """y [M, N] = the sum, in split order, of the fp32 partials part [split, M, N] (a split-K
    launch's; also `fp8.fp8_skinny`'s)."""
    m, n = y.shape
    grid = (m, triton.cdiv(n, REDUCE_BLOCK))
    _reduce_kernel[grid](part, y, m, n, y.stride(0), SPLIT_K=split, BLOCK=REDUCE_BLOCK)


def _args(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, split: int) -> tuple:
    """The kernel's positional args, with a fp32 scratch for `split` partials (a 1-element
    stand-in when split == 1)."""
    (m, k), n = x.shape, w.shape[0]
    part = torch.empty(split * m * n if split > 1 else 1, dtype=torch.float32, device=x.device)
    return x, w, y, part, m, n, k, triton.next_power_of_2(m), x.stride(0), y.stride(0)


def _launch(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, config: triton.Config) -> None:
    """y = x @ w^T with one config, no autotune (also under the Triton interpreter)."""
    split = config.kwargs["SPLIT_K"]
    args = _args(x, w, y, split)
    grid = (triton.cdiv(w.shape[0], config.kwargs["BLOCK_N"]), split)
    _skinny_kernel.fn[grid](*args, IEEE=x.dtype == torch.float32, **config.all_kwargs())
    if split > 1:
        reduce_split(args[3], y, split)


def _tune(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> triton.Config:
    """y = x @ w^T through the autotuner (times the candidates on first use of a key); returns
    the config it ran."""
    (m, k), n = x.shape, w.shape[0]
    split = max(c.kwargs["SPLIT_K"] for c in _candidates(m == 1, n, k, num_sms(x.device)))
    args = _args(x, w, y, split)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])
    _skinny_kernel[grid](*args, IEEE=x.dtype == torch.float32)
    config = _skinny_kernel.best_config
    if config.kwargs["SPLIT_K"] > 1:
        reduce_split(args[3], y, config.kwargs["SPLIT_K"])
    return config


_TUNED: dict[tuple, triton.Config] = {}  # (M rounded up to a power of two, N, K, dtype)


def _key(x: torch.Tensor, w: torch.Tensor) -> tuple:
    return triton.next_power_of_2(x.shape[0]), w.shape[0], x.shape[1], x.dtype


def skinny_linear(
    x: torch.Tensor, w: torch.Tensor, config: triton.Config | None = None
) -> torch.Tensor:
    """y = x @ w^T (F.linear without bias) for x [M, K] with M <= MAX_M and unit stride along
    K, w [N, K] contiguous, same dtype (bf16, fp16 or fp32). Returns y [M, N] in x.dtype.

    Runs `config` if given (one of CONFIGS, or any with their kwargs), else the config tuned
    for the shapes: the first call for a key autotunes, timing the candidates on the device, so
    keep it out of graph capture. `tuned_config` tells which config that is.
    """
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"skinny_linear needs x [M, K], w [N, K], got x {x.shape}, w {w.shape}")
    m, n = x.shape[0], w.shape[0]
    if m > MAX_M:
        raise ValueError(f"skinny_linear needs x with at most {MAX_M} rows, got {m}")
    if x.dtype != w.dtype:
        raise ValueError(f"skinny_linear needs x and w of one dtype, got {x.dtype}, {w.dtype}")
    if not w.is_contiguous():
        raise ValueError("skinny_linear needs a contiguous w")
    if x.stride(1) != 1:
        raise ValueError("skinny_linear needs x with unit stride along K")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if config is None:
        config = _TUNED.get(_key(x, w))
    if config is None:
        _TUNED[_key(x, w)] = _tune(x, w, y)
    else:
        _launch(x, w, y, config)
    return y


def tuned_config(x: torch.Tensor, w: torch.Tensor) -> triton.Config | None:
    """The config `skinny_linear(x, w)` runs (None until its first call for these shapes)."""
    return _TUNED.get(_key(x, w))
