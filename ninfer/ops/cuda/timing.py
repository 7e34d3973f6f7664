"""Device time of a decode-sized call as a CUDA graph pays it: the call captured in a graph
(so no Python launch cost counts, and a second launch, such as a split-K reduce, costs what it
costs on the device) and preceded by a write of a buffer larger than the L2 (a decode step
reads each weight once, so from HBM), that write timed alone and subtracted. Used by
`linear.DecodeLinear`'s race of cuBLAS and the skinny GEMM (`cold_call_ms`) and, as
`triton.autotune`'s timer (`graph_bench`), by the Triton kernels' config choices (skinny, fp8,
moe, grouped_fp8). Run it outside any CUDA-graph capture.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

CALLS = 4  # calls per captured graph
REPLAYS = 3
FLUSH_BYTES = 128 << 20  # > the L2 of any current GPU (H200: 60 MiB)


def flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer whose `zero_()` evicts the L2."""
    return torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device=device)


def graph_ms(fn: Callable[[], object], flush: torch.Tensor | None) -> float:
    """Device ms per call of `fn` (each preceded by `flush.zero_()` when given), replayed as one
    CUDA graph of CALLS calls. `fn` runs once eagerly first (compiles, allocates)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            if flush is not None:
                flush.zero_()
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (REPLAYS * CALLS)


def cold_call_ms(fns: dict, device: torch.device) -> dict:
    """{name: device ms of one cold-L2 call of fns[name]} (`graph_ms` less the flush alone)."""
    flush = flush_buffer(device)
    base = graph_ms(lambda: None, flush)
    return {name: max(graph_ms(fn, flush) - base, 0.0) for name, fn in fns.items()}


def graph_bench(fn: Callable[[], object], quantiles=None):
    """`triton.autotune`'s `do_bench` as a decode graph pays: cold-L2 device ms of one call of
    `fn` (the autotuner's launch of a config, with its pre- and post-hooks) in a CUDA graph.
    Eager timing would charge each launch's Python cost, and a split-K config's second launch
    its gap, neither of which a replayed graph pays. One figure stands for every quantile."""
    t = cold_call_ms({"fn": fn}, torch.device("cuda", torch.cuda.current_device()))["fn"]
    return [t] * len(quantiles) if quantiles else t
