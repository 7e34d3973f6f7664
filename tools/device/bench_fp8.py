"""Times CudaOps' FP8 linear (`ninfer.ops.cuda.fp8`) at Qwen3.5-27B shapes beside bf16, against
the H200's bounds.

Decode (M in 1, 2, 4, 8): `fp8_skinny` against the bf16 `DecodeLinear` (cuBLAS or the bf16
skinny GEMM, whichever it picks) on the same weights, each as one CUDA graph of CALLS calls
cycling over enough weight copies that no call finds its weight in L2; GB/s = weight bytes
(e4m3 values + fp32 scales; bf16) per second, beside the device copy bandwidth measured first
(read + write of a 2 GiB copy_, the rate a weight-bound GEMV can reach; about 4.2 TB/s, against
4.8 TB/s nominal). Prefill (M = 1024, 8192): `Fp8Gemm` (activation quantisation included) and
our Triton w8a8 GEMM (`w8a8_gemm`, what serves where cuBLAS cannot) and cuBLAS bf16,
TFLOP/s = 2 M N K per second, beside the nominal dense peaks (H200: FP8 1979,
bf16 989 TFLOP/s; about 770 bf16 measured for 8192^3). Also each path's relative error against
the float64 product with the dequantised weight, and which prefill GEMM served. One JSON line
per measurement on stdout (and in --json PATH).

--a8: the decode rows' autotuner may also pick the W8A8 configs (x quantised in the kernel,
`fp8_skinny(..., acts="fastest")`); fp8-best-A8 / fp8-best-BITS rows race each kind's best.

Usage (device machine, repo root): PYTHONPATH=. python3 tools/device/bench_fp8.py [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics

import torch
import torch.nn.functional as F
import triton

from ninfer.ops.cuda.fp8 import Fp8Gemm, fp8_skinny, tuning_times, w8a8_gemm
from ninfer.ops.cuda.fp8 import tuned_config as fp8_tuned
from ninfer.ops.cuda.linear import DecodeLinear
from ninfer.ops.fp8 import quantize_fp8

DEV = torch.device("cuda")
BF16 = torch.bfloat16
GIB = 1 << 30
SPAN = 512 << 20  # weight bytes cycled through per graph (> the 60 MiB L2)
CALLS, REPLAYS, REPEATS = 20, 5, 5
FP8_PEAK, BF16_PEAK = 1979e12, 989e12  # H200 dense, nominal
# 27B: (name, N, K)
SHAPES = [
    ("attn q|k|v", 14336, 5120), ("attn o", 5120, 6144), ("gdn qkv|z", 16384, 5120),
    ("gdn out", 5120, 6144), ("mlp gate|up", 34816, 5120), ("mlp down", 5120, 17408),
]  # fmt: skip
DECODE_ROWS, PREFILL_ROWS = (1, 2, 4, 8), (1024, 8192)
RESULTS: list[dict] = []


def report(**row) -> None:
    RESULTS.append(row)
    print(json.dumps(row), flush=True)


def events_ms(fn, calls: int) -> float:
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def copy_bandwidth() -> float:
    src = torch.empty(2 * GIB, dtype=torch.uint8, device=DEV).random_()
    dst = torch.empty_like(src)
    events_ms(lambda: dst.copy_(src), 3)
    bw = 4 * GIB / events_ms(lambda: dst.copy_(src), 20) * 1e3
    report(name="d2d copy 2 GiB", tb_s=round(bw / 1e12, 3))
    return bw


def graph_us(fn, x: torch.Tensor, weights: list) -> float:
    """µs per call of fn(x, w) in a CUDA graph of CALLS calls cycling over the weights."""

    def calls():
        for i in range(CALLS):
            fn(x, weights[i % len(weights)])

    calls()  # autotune and probes, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    graph.replay()
    return events_ms(graph.replay, REPLAYS) * 1e3 / CALLS


def rel_err(out: torch.Tensor, exact: torch.Tensor) -> float:
    return ((out.double() - exact).norm() / exact.norm()).item()


def bench_shape(
    name: str, n: int, k: int, bw: float, prefill: bool = True, rows=DECODE_ROWS, a8=False
) -> None:
    fp8_bytes = n * k + math.ceil(n / 128) * math.ceil(k / 128) * 4
    copies = max(2, math.ceil(SPAN / fp8_bytes))
    dense = [torch.randn(n, k, device=DEV) * k**-0.5 for _ in range(copies)]
    fp8 = [quantize_fp8(w, (128, 128)) for w in dense]
    bf16 = [w.to(BF16) for w in dense]
    del dense
    bf16_linear, gemm = DecodeLinear(), Fp8Gemm()
    acts = "fastest" if a8 else "w8a16"
    skinny = functools.partial(fp8_skinny, acts=acts)
    for m in rows:
        x = torch.randn(m, k, device=DEV, dtype=BF16)
        exact = x.double() @ fp8[0].dequantize(torch.float64).t()
        err = rel_err(skinny(x, fp8[0]), exact)
        # the autotuner's fastest config that reads one 128-column tile a step (GROUPS 1), raced
        # in the same graphs as the one it chose (GROUPS > 1 reads several side by side)
        times = tuning_times(x, fp8[0], acts)
        one = [c for c in times if c.kwargs.get("GROUPS", 1) == 1]
        best_one = min(one, key=times.get) if one else None
        races = [("bf16", bf16_linear, bf16, n * k * 2), ("fp8", skinny, fp8, fp8_bytes)]
        for kind in ("A8", "BITS") if a8 else ():  # each kind's best, raced in the graphs
            own = [c for c in times if c.kwargs[kind]]
            if own:
                best = min(own, key=times.get)
                fn = lambda x, w, c=best: fp8_skinny(x, w, c)  # noqa: E731
                races.append((f"fp8-best-{kind}", fn, fp8, fp8_bytes))
        if best_one is not None and best_one is not fp8_tuned(x, fp8[0], acts):
            g1 = lambda x, w, c=best_one: fp8_skinny(x, w, c)  # noqa: E731
            races.append(("fp8-groups1", g1, fp8, fp8_bytes))
        for impl, fn, ws, nbytes in races:
            us = graph_us(fn, x, ws)
            gb_s = nbytes / us / 1e3
            extra = {}
            if impl == "fp8":  # the config the autotuner chose (SPLIT_K > 1: split-K)
                tuned = fp8_tuned(x, fp8[0], acts)
                extra = {
                    "rel_err": float(f"{err:.2e}"),
                    "config": tuned and tuned.kwargs,
                    "tuning_ms": {str(c.kwargs): round(t, 4) for c, t in times.items()},
                }
            elif impl == "fp8-groups1":
                extra = {"config": best_one.kwargs}
            elif impl.startswith("fp8-best"):
                c = fn.__defaults__[0]
                extra = {
                    "config": c.kwargs,
                    "rel_err": float(f"{rel_err(fn(x, fp8[0]), exact):.2e}"),
                }
            report(set=name, N=n, K=k, M=m, impl=impl, us=round(us, 2), gb_s=round(gb_s, 1),
                   of_copy=round(gb_s * 1e9 / bw, 3), **extra)  # fmt: skip
    for m in PREFILL_ROWS if prefill else ():  # --no-prefill: decode shapes only
        x = torch.randn(m, k, device=DEV, dtype=BF16)
        exact = x.double() @ fp8[0].dequantize(torch.float64).t()
        err = rel_err(gemm(x, fp8[0]), exact)
        for impl, fn, ws, peak in (("bf16", F.linear, bf16, BF16_PEAK),
                                   ("fp8", gemm, fp8, FP8_PEAK),
                                   ("fp8-triton", w8a8_gemm, fp8, FP8_PEAK)):  # fmt: skip
            us = graph_us(fn, x, ws[:2])
            tflops = 2 * m * n * k / us / 1e6
            extra = {"rel_err": float(f"{err:.2e}"), "gemm": gemm.support} if impl == "fp8" else {}
            if impl == "fp8-triton":
                extra = {"rel_err": float(f"{rel_err(w8a8_gemm(x, fp8[0]), exact):.2e}")}
            report(set=name, N=n, K=k, M=m, impl=impl, us=round(us, 1),
                   tflop_s=round(tflops, 1), of_peak=round(tflops * 1e12 / peak, 3),
                   **extra)  # fmt: skip
    del fp8, bf16
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write every result row (JSON lines) to this path")
    ap.add_argument("--no-prefill", action="store_true", help="decode shapes only")
    ap.add_argument("--shapes", help="comma-separated names of SHAPES (default: all)")
    ap.add_argument("--rows", help="decode rows, e.g. 1,8 (default: 1,2,4,8)")
    ap.add_argument("--a8", action="store_true", help="decode may pick the W8A8 configs too")
    args = ap.parse_args()
    # time every candidate here, not a disk-cached choice (tools/device/env.sh turns the cache
    # on): the fp8-groups1 rows race the autotuner's timings
    triton.knobs.autotuning.cache = False
    names = args.shapes.split(",") if args.shapes else [s[0] for s in SHAPES]
    rows = tuple(map(int, args.rows.split(","))) if args.rows else DECODE_ROWS
    bw = copy_bandwidth()
    for name, n, k in SHAPES:
        if name in names:
            bench_shape(name, n, k, bw, prefill=not args.no_prefill, rows=rows, a8=args.a8)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in RESULTS)


if __name__ == "__main__":
    main()
