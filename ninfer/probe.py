"""Measured machine limits: the bounds benchmark figures are printed beside, and the rates the
cost model probes on a CUDA device at start-up (`ninfer.costs.device_rates`).

`copy_bandwidth` times a large tensor copy (bytes read + written per second): the bound for
decode (weights + KV + state streamed once per step) and for restores and taps. `matmul_peak`
times a square matmul in the model dtype: the bound for prefill FLOPs. Both are measured on the
benchmark's own device, so a CPU run gets CPU figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_memory() -> None:
    """Let a closed engine's pools go before the next one sizes itself from free memory
    ("auto" KV capacity): collect its reference cycles and return cached CUDA blocks."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def timeit(fn: Callable[[], object], device: torch.device, iters: int, warmup: int = 2) -> float:
    """Best seconds of one call of `fn`: a bandwidth or peak is what the machine can do, and the
    minimum filters out the preemptions a busy CPU adds (a descheduled worker thread costs a
    whole scheduler time slice)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def device_seconds(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Best seconds of one call of `fn`. On CUDA: after `spin` (30 ms: clocks up from idle),
    `iters` batches of 5 calls back to back, timed by CUDA events; the best batch's mean. A host
    timer around each call adds the launch and the synchronisation to a millisecond-long copy
    or product (a bound too loose, every fraction of it high); and the best batch, not a long
    sustained run, is what the chip reaches: clocks settle lower under sustained load, so the
    burst figure makes the stricter MFU (docs/results-h200.md, "What the figures count now").
    On a CPU: `timeit`."""
    if device.type != "cuda":
        return timeit(fn, device, iters)
    spin(fn, device, 0.03)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(max(2, 2 * iters)):
        start.record()
        for _ in range(5):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / 5)
    return best


def spin(fn: Callable[[], object], device: torch.device, seconds: float) -> None:
    """Runs `fn` for about `seconds`: an idle GPU starts at low clocks."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(8):
            fn()
        sync(device)


def copy_bandwidth(device: torch.device, mib: int | None = None, iters: int = 5) -> float:
    """Bytes per second of a device-to-device copy, counting the read and the write."""
    mib = mib or (1024 if device.type == "cuda" else 128)
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    seconds = device_seconds(lambda: dst.copy_(src), device, iters)
    return 2 * src.numel() / seconds


def link_bandwidth(device: torch.device, mib: int = 256, iters: int = 5) -> float:
    """Bytes per second from pinned Host memory to the device (CPU: half the copy traffic)."""
    if device.type != "cuda":
        return copy_bandwidth(device) / 2
    src = torch.empty(mib << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    return src.numel() / device_seconds(lambda: dst.copy_(src, non_blocking=True), device, iters)


def readback_bandwidth(device: torch.device, mib: int = 256, iters: int = 5) -> float:
    """Bytes per second from the device to pinned Host memory (CPU: half the copy traffic)."""
    if device.type != "cuda":
        return copy_bandwidth(device) / 2
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty(mib << 20, dtype=torch.uint8, pin_memory=True)
    return src.numel() / device_seconds(lambda: dst.copy_(src, non_blocking=True), device, iters)


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int | None = None) -> float:
    """FLOP/s of an n x n x n matmul in `dtype` (n: 8192 on CUDA, 1024 on a CPU), random data;
    `device_seconds`, not single calls timed on the host, whose launch and synchronisation
    would read the peak low."""
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    seconds = device_seconds(lambda: a @ b, device, iters=5 if device.type == "cuda" else 3)
    return 2 * n**3 / seconds


def machine_bounds(device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    copy = copy_bandwidth(device)
    return {
        "copy_bytes_per_s": copy,
        "link_bytes_per_s": link_bandwidth(device) if device.type == "cuda" else copy / 2,
        "matmul_flops_per_s": matmul_peak(device, dtype),
    }
