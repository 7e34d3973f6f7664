"""The one place that picks the op set and prepares the runner before serving.

    CPU                                   -> ReferenceOps
    CUDA, flashinfer + fla + triton import -> CudaOps (norms, RoPE, glue compiled if compile)
    CUDA, a kernel library missing        -> ReferenceOps, with one warning saying which

`prepare_runner` fuses the model's projections (one GEMM per group of projections that read
the same input: fewer, larger weight reads per decode step), decides which CudaOps fast paths
take the model's shapes and dtype (`CudaOps.configure`: the others run their reference op, one
warning each, and CUDA graphs go off when a replayed op falls back), runs the kernel warm-up (JIT,
autotune, compile: one prefill, one decode per batch size) and, with `cuda_graphs` on a CudaOps
engine, captures the decode graphs; it logs the startup time. Warm-up writes into pool pages and
state slots that it borrows free from the pools and gives back, so it is safe whenever the pools
hold nothing else in those entries.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time

import torch

logger = logging.getLogger(__name__)


def select_ops(device: torch.device, compile: bool = False):
    """The op set for `device` (see the module docstring)."""
    from ninfer.ops.reference import ReferenceOps

    if device.type != "cuda":
        return ReferenceOps()
    missing = [m for m in ("flashinfer", "fla", "triton") if importlib.util.find_spec(m) is None]
    if missing:
        logger.warning(
            "ninfer: CUDA device but %s not importable: using the slow ReferenceOps",
            ", ".join(missing),
        )
        return ReferenceOps()
    # Triton keeps compiled kernels on disk by default, autotune results only when asked: ask,
    # so that a restart skips the autotune of the GDN / GEMM kernels (most of a cold startup).
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    try:
        from ninfer.ops.cuda import CudaOps

        return CudaOps(device, compile=compile)
    except ImportError as e:  # a kernel library present but broken
        logger.warning("ninfer: CudaOps unavailable (%r): using the slow ReferenceOps", e)
        return ReferenceOps()


def prepare_runner(runner, cfg, bridge) -> dict[str, float]:
    """Warm-up (and decode-graph capture) of `runner` before the engine serves. Borrows 3 free
    pages and max_concurrency free active state slots from the bridge's pools and returns them
    (and writes a scratch or unused snapshot slot).
    Returns the startup figures (seconds), also kept in `runner.startup`; nothing on the CPU
    (no kernel to build)."""
    if runner.device.type != "cuda":
        return {}
    t0 = time.perf_counter()
    runner.model.fuse_projections()
    ops = runner.ops
    if hasattr(ops, "configure"):  # CudaOps: which fast paths take this model (warns per op)
        ops.configure(runner.model.config.head_dims, cfg.dtype, cfg.kv_dtype)
    capture = bool(cfg.cuda_graphs) and getattr(ops, "name", "") == "cuda"
    if capture and not ops.capturable:
        logger.warning("ninfer: CUDA graphs off: a reference op cannot be captured")
        capture = False
    pages = bridge.kv.alloc(3)
    slots = [bridge.states.acquire() for _ in range(cfg.max_concurrency)]
    # the warm-up's in-pass snapshot (a cached turn's final chunk): a slot no lane holds and
    # no snapshot uses yet (the index is empty until the engine serves or loads a cache file)
    states = bridge.states
    spare = (states.scratch_slots or states.snap_phys or [None])[0]
    prefill_graph = None
    if capture and cfg.prefill_graph_tokens > 0 and ops.prefill_capturable:
        scratch = (bridge.kv.scratch_pages[0], bridge.states.scratch_slots[0])
        prefill_graph = (cfg.prefill_graph_tokens, *scratch)
    try:
        figures = runner.warm_up(
            pages, slots, capture, cfg.max_pages_per_lane, prefill_graph, cfg.solo_prefill_chunk,
            spare,
        )  # fmt: skip
    finally:  # in reverse, so the free lists end as they were
        for s in reversed(slots):
            bridge.states.release(s)
        bridge.kv.free(reversed(pages))
    figures["warm_up_s"] = time.perf_counter() - t0
    planner = getattr(runner.ops, "attention_planner", None)
    if planner is not None:  # its pass counters count served passes, not the warm-up's
        planner.gathered_passes = 0
    prefill = runner.prefill_graphs
    logger.info(
        "ninfer: %s ops, warm-up %.2f s (prefill %.2f, decode %.2f, graphs %.2f: %s; "
        "prefill graphs %.2f: %s)",
        runner.ops.name,
        figures["warm_up_s"],
        figures["warm_prefill_s"],
        figures["warm_decode_s"],
        figures["capture_s"],
        f"batch 1..{cfg.max_concurrency}" if runner.graphs is not None else "off",
        figures.get("prefill_capture_s", 0.0),
        f"{len(prefill.buckets)} sizes to {prefill.max_tokens} tokens" if prefill else "off",
    )
    return figures
