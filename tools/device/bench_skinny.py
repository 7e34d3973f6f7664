"""Times `skinny_linear` (Triton) against F.linear (cuBLAS) at the decode linear shapes of
Qwen3.5 9B / 27B (H200), M = 1, 4, 8 token rows, bf16.

First the device copy bandwidth: a 2 GiB D2D `copy_`, read + write bytes counted. Then per
shape and M: one eager call (autotunes skinny_linear; its time is reported), the relative
error against F.linear, and per implementation a CUDA graph of CALLS back-to-back calls, each
on the next of several weight copies (enough that no call finds its weight in the 50 MB L2),
replayed REPLAYS times between CUDA events. Reported per call: µs, TB/s of weight bytes read,
the fraction of the copy bandwidth, and for skinny_linear its tuned config and the speed-up
over cuBLAS. One JSON line per measurement on stdout; `--json PATH` writes them all there.

Usage (device machine, repo root, PYTHONPATH=.):
    python3 tools/device/bench_skinny.py [--json PATH] [--shapes 9B,27B,head]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

from ninfer.ops.cuda.skinny import skinny_linear, tuned_config

DEV = torch.device("cuda")
BF16 = torch.bfloat16
GIB = 1 << 30
SHAPES = {  # (N, K) of the linear layers: nn.Linear weights [N, K]
    "9B": [(12352, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (10240, 4096)],
    "27B": [(34816, 5120), (5120, 17408), (5120, 6144), (16480, 5120)],
    "head": [(248320, 4096)],  # the 9B's lm_head, 2 GB: cuBLAS's best case
}
ROWS = (1, 4, 8)
CALLS, REPLAYS = 20, 20
SPAN = 512 << 20  # weight bytes the CALLS calls cycle over, at least (L2: 50 MB)
RESULTS: list[dict] = []


def report(**row) -> None:
    RESULTS.append(row)
    print(json.dumps(row), flush=True)


def events_ms(fn, reps: int) -> float:
    """Mean ms of one fn() over reps back-to-back calls between CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def copy_bandwidth() -> float:
    """Measured D2D copy bandwidth in bytes/s, read + write."""
    src = torch.empty(2 * GIB, dtype=torch.uint8, device=DEV).random_()
    dst = torch.empty_like(src)
    events_ms(lambda: dst.copy_(src), 3)
    ms = events_ms(lambda: dst.copy_(src), 20)
    bw = 4 * GIB / ms * 1e3
    report(name="d2d copy 2 GiB", us=round(ms * 1e3, 1), tb_s=round(bw / 1e12, 3))
    return bw


def graph_us(fn, x: torch.Tensor, weights: list[torch.Tensor]) -> float:
    """µs per call of fn(x, w) in a CUDA graph of CALLS calls cycling over the weights."""

    def calls():
        for i in range(CALLS):
            fn(x, weights[i % len(weights)])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (cuBLAS workspaces)
        calls()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    graph.replay()
    return events_ms(graph.replay, REPLAYS) * 1e3 / CALLS


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def bench_shape(name: str, n: int, k: int, bw: float) -> None:
    nbytes = n * k * 2
    copies = max(2, math.ceil(SPAN / nbytes))
    weights = [torch.randn(n, k, device=DEV, dtype=BF16) * k**-0.5 for _ in range(copies)]
    for m in ROWS:
        x = torch.randn(m, k, device=DEV, dtype=BF16)
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = skinny_linear(x, weights[0])
        torch.cuda.synchronize()
        tune_s = time.perf_counter() - t
        err = rel_err(out, F.linear(x, weights[0]))
        cfg = tuned_config(x, weights[0])
        cfg = {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        base = dict(set=name, N=n, K=k, M=m, mb=round(nbytes / 1e6, 1), copies=copies)
        us = {}
        for impl, fn in (("cublas", F.linear), ("skinny", skinny_linear)):
            us[impl] = graph_us(fn, x, weights)
            tb_s = nbytes / us[impl] / 1e6
            extra = {}
            if impl == "skinny":
                extra = dict(
                    vs_cublas=round(us["cublas"] / us[impl], 3),
                    rel_err=float(f"{err:.2e}"),
                    first_call_s=round(tune_s, 2),
                    config=cfg,
                )
            report(
                **base,
                impl=impl,
                us=round(us[impl], 2),
                tb_s=round(tb_s, 3),
                of_copy=round(tb_s * 1e12 / bw, 3),
                **extra,
            )
    del weights
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write every result row (JSON lines) to this path")
    ap.add_argument("--shapes", default="9B,27B,head", help=f"sets among {','.join(SHAPES)}")
    args = ap.parse_args()
    sets = args.shapes.split(",")
    if unknown := set(sets) - set(SHAPES):
        ap.error(f"unknown shape sets {sorted(unknown)}")
    start = time.perf_counter()
    print(torch.cuda.get_device_name(DEV), flush=True)
    bw = copy_bandwidth()
    for name in sets:
        for n, k in SHAPES[name]:
            print(f"{name} {n}x{k} ({time.perf_counter() - start:.0f} s)", flush=True)
            bench_shape(name, n, k, bw)
    print(f"done in {time.perf_counter() - start:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in RESULTS)


if __name__ == "__main__":
    main()
