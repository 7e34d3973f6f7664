"""torch.profiler around a benchmark block: a Chrome trace per block and its top kernels."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch


@contextlib.contextmanager
def profiled(name: str, out: dict, profile_dir: Path | None) -> Iterator[None]:
    """Runs the block under torch.profiler when asked: a Chrome trace and the top kernels."""
    if profile_dir is None:
        yield
        return
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    profile_dir.mkdir(parents=True, exist_ok=True)
    try:  # the engine runs its loop on its own thread: record every thread, not just this one
        config = _ExperimentalConfig(profile_all_threads=True)
    except TypeError:  # older torch: this thread only (CUDA kernels are recorded regardless)
        config = None
    with profile(activities=activities, experimental_config=config) as prof:
        yield
    trace = profile_dir / f"{name}.json"
    prof.export_chrome_trace(str(trace))
    key = "self_device_time_total" if len(activities) > 1 else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:10]
    out["profile"] = {
        "trace": str(trace),
        "top": [{"name": e.key, "self_us": getattr(e, key), "calls": e.count} for e in events],
    }
