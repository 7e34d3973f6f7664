"""Times the routed-MoE decode path against the grouped GEMM at Qwen3.5-35B-A3B shapes (H200).

H=2048, E=256 experts, top_k=8, I=512, bf16, random weights ~ N(0, 0.02). For N in {1, 4, 8}
tokens, `moe_decode` (router linear + three Triton kernels) and `moe_grouped_mm` (`route_ref` +
two grouped GEMMs), each timed with CUDA events: eager (ITERS calls after warm-up) and as one
CUDA graph of GRAPH_CALLS calls (launch overhead removed); routing alone as a graph too,
`moe_route` (router linear + routing kernel, what `moe_decode` runs) beside `route_ref` (router
linear + ~7 torch kernels). Calls cycle over LAYERS weight sets, so that, as in a real decode
step, no call finds its experts in L2.

Each row gives µs per call, the bytes of distinct expert weights the call needs (distinct ids x
3 I H x 2 B, plus the router), GB/s and the bound those bytes give at the device copy bandwidth
measured first (read + write bytes of a 2 GiB copy_). Also `moe_decode`'s relative error against
`moe_ref`, whether `moe_route` picks `route_ref`'s experts, and the autotuner's pick and
per-config timings of each kernel for each N. One JSON line per
measurement on stdout (and in --json PATH).

Usage (device machine, repo root): PYTHONPATH=. python3 tools/device/bench_moe.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from ninfer.ops.cuda import moe
from ninfer.ops.reference.dense import moe_ref, route_ref

DEV = torch.device("cuda")
H, E, TOP_K, INTER = 2048, 256, 8, 512
LAYERS, ITERS, GRAPH_CALLS, REPEATS = 4, 200, 20, 5
GIB = 1 << 30
RESULTS: list[dict] = []


def report(name: str, **fields) -> None:
    row = {"name": name, **fields}
    RESULTS.append(row)
    print(json.dumps(row), flush=True)


def events_us(fn, calls: int) -> float:
    """Median over REPEATS of fn's device time (CUDA events), divided by the calls it makes."""
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/µs, read + write bytes counted."""
    src = torch.empty(2 * GIB, dtype=torch.uint8, device=DEV).random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    us = events_us(lambda: dst.copy_(src), 1)
    report("d2d copy 2 GiB", us=round(us, 2), gb_s=round(4 * GIB / us / 1e3, 1))
    return 4 * GIB / us


def layer_weights() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """LAYERS sets of (router [E, H], gate_up [E, 2I, H], down [E, H, I]) bf16 ~ N(0, 0.02)."""
    shapes = ((E, H), (E, 2 * INTER, H), (E, H, INTER))
    return [
        tuple(torch.empty(s, device=DEV, dtype=torch.bfloat16).normal_(0, 0.02) for s in shapes)
        for _ in range(LAYERS)
    ]


def graph_us(step, calls: int) -> float:
    """µs per call of step(0..calls-1) captured as one CUDA graph (NaN if capture fails)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(calls):
            step(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for i in range(calls):
                step(i)
    except RuntimeError as e:  # reported, so that a path that cannot be captured shows up
        print(f"capture failed: {e}", flush=True)
        return float("nan")
    for _ in range(3):
        graph.replay()
    return events_us(graph.replay, calls)


def autotune_rows(n: int) -> None:
    """The autotuner's pick for the key just tuned, and its per-config median times."""
    kernels = (
        ("route", moe._route_kernel),
        ("gate_up", moe._gate_up_silu_kernel),
        ("down+sum", moe._down_sum_kernel),
    )
    for name, kernel in kernels:
        timings = getattr(kernel, "configs_timings", None) or {}
        report(
            f"autotune {name} N={n}",
            best=str(kernel.best_config),
            us={str(c): round(t[0] * 1e3, 2) for c, t in timings.items()},
        )


def bench_tokens(n: int, layers, bw: float) -> None:
    xs = [torch.randn(n, H, device=DEV, dtype=torch.bfloat16) for _ in layers]
    moe.moe_decode(xs[0], *layers[0], TOP_K)  # autotune for this N, eagerly
    autotune_rows(n)
    for name, fn in (("decode", moe.moe_decode), ("grouped_mm", moe.moe_grouped_mm)):
        out, ref = fn(xs[0], *layers[0], TOP_K).double(), moe_ref(xs[0], *layers[0], TOP_K)
        err = ((out - ref.double()).norm() / ref.double().norm()).item()
        report(f"moe {name} N={n} rel err vs moe_ref", rel_err=err, nan=bool(out.isnan().any()))
    route_w, ids = moe.moe_route(xs[0], layers[0][0], TOP_K)
    ref_w, ref_ids = route_ref(xs[0], layers[0][0], TOP_K)
    report(
        f"moe_route N={n} vs route_ref",
        same_ids=bool(torch.equal(ids, ref_ids)),
        same_sets=bool(torch.equal(ids.sort(1).values, ref_ids.sort(1).values)),
        max_rel_w=((route_w.float() - ref_w.float()).abs() / ref_w.float().abs()).max().item(),
    )
    distinct = [
        route_ref(x, w[0], TOP_K)[1].unique().numel() for x, w in zip(xs, layers, strict=True)
    ]
    expert_bytes = 3 * INTER * H * 2
    nbytes = statistics.mean(distinct) * expert_bytes + E * H * 2
    pair_bytes = n * TOP_K * expert_bytes + E * H * 2  # what moe_decode streams (per pair)
    bound = nbytes / bw
    report(
        f"moe N={n} bytes",
        distinct_experts=distinct,
        distinct_mib=round(nbytes / 2**20, 1),
        per_pair_mib=round(pair_bytes / 2**20, 1),
        bound_us=round(bound, 2),
    )
    for name, fn in (("decode", moe.moe_decode), ("grouped_mm", moe.moe_grouped_mm)):
        step = lambda i, fn=fn: fn(xs[i % LAYERS], *layers[i % LAYERS], TOP_K)
        for i in range(LAYERS):
            step(i)
        eager = events_us(lambda step=step: [step(i) for i in range(ITERS)], ITERS)
        graph = graph_us(step, GRAPH_CALLS)
        for mode, us in (("eager", eager), ("graph", graph)):
            report(
                f"moe {name} N={n} {mode}",
                us=round(us, 2),
                gb_s=round(nbytes / us / 1e3, 1),
                bound_us=round(bound, 2),
                of_bound=round(bound / us, 3),
            )
    for name, fn in (("moe_route", moe.moe_route), ("route_ref", route_ref)):
        route = lambda i, fn=fn: fn(xs[i % LAYERS], layers[i % LAYERS][0], TOP_K)
        report(f"{name} N={n} graph", us=round(graph_us(route, GRAPH_CALLS), 2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="also write the JSON lines here")
    p.add_argument("--tokens", default="1,4,8", help="comma-separated token counts N")
    args = p.parse_args()
    torch.manual_seed(0)
    report("device", gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    bw = copy_bandwidth()
    layers = layer_weights()
    for n in map(int, args.tokens.split(",")):
        bench_tokens(n, layers, bw)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in RESULTS)


if __name__ == "__main__":
    main()
