"""The warm-up before serving: every kernel path run once, then the CUDA graphs captured.

`prepare_runner` (called once by the engine, CUDA only) fuses the model's projections (one
GEMM per group of projections that read the same input: fewer, larger weight reads per decode
step), decides which CudaOps fast paths take the model's head dims and dtypes
(`CudaOps.configure`: the others run their reference op, one warning each, and CUDA graphs go
off when a replayed op falls back), runs `warm_up` (JIT builds, Triton autotune,
torch.compile), captures the graphs when asked, and logs the startup time. The warm-up writes
into pool pages and state slots that it borrows free from the pools and gives back, so it is
safe whenever the pools hold nothing else in those entries; it knows nothing about requests or
the prefix cache.
"""

from __future__ import annotations

import logging
import time

import torch

from ninfer.config import MemoryGeometry, OpsConfig
from ninfer.engine.executor.runner import Row, Runner
from ninfer.page import PAGE_SIZE
from ninfer.request import SamplingParams

logger = logging.getLogger(__name__)
# the warm-up's cached-turn pass: queries enough for the gathered attention path at any head
# ratio (`attention.gather_pays`, GATHER_MIN_ROWS), its in-pass snapshot this far from its end,
# off the CUDA ops' 64-token chunk grid (an exact tap: the chunk state's gather and the advance
# over the rest both run, so both compile here)
WARM_CACHED_TOKENS = 1600
WARM_CACHED_TAIL = 587
GREEDY = SamplingParams(temperature=0.0)
# short fresh passes: tokens in (8, 16] and (16, 32], the two token counts past the decode
# batches that the MoE decode kernels tune for (`ops.cuda.moe`: tunings per power of two of
# tokens or pairs, up to DECODE_PAIRS), so that no short prompt tunes them while serving
WARM_SHORT_PASSES = (12, 24)


def prepare_runner(
    runner: Runner,
    op_cfg: OpsConfig,
    memory: MemoryGeometry,
    tune_tokens: int,
    kv_pool,
    state_pool,
    speculator=None,
) -> dict[str, float]:
    """Warm-up (and graph capture, as `op_cfg` says) of `runner` before the engine serves, for
    the pools `memory` describes; `tune_tokens`: the longest pass the engine runs (its solo
    prefill chunk, `warm_up`); `speculator`: an `engine.speculative.Speculator`, whose graphs
    are captured instead of the plain decode and prefill graphs (its steps never run those).
    Borrows 3 free pages of `kv_pool` and max_concurrency free active slots of `state_pool`
    and returns them (and writes a scratch or unused snapshot slot, and the pools' scratch
    entries).
    Returns the startup figures (seconds), also kept in `runner.startup`; nothing on the CPU
    (no kernel to build)."""
    if runner.device.type != "cuda":
        return {}
    t0 = time.perf_counter()
    runner.model.fuse_projections()
    ops = runner.ops
    if hasattr(ops, "configure"):  # CudaOps: which fast paths take this model (warns per op)
        ops.configure(runner.model.config.head_dims, memory.dtype, memory.kv_dtype)
    capture = bool(op_cfg.cuda_graphs) and getattr(ops, "name", "") == "cuda"
    if capture and not ops.capturable:
        logger.warning("ninfer: CUDA graphs off: a reference op cannot be captured")
        capture = False
    pages = kv_pool.alloc(3)
    slots = [state_pool.acquire() for _ in range(memory.max_concurrency)]
    # the warm-up's in-pass snapshot (a cached turn's final chunk): a slot no lane holds and
    # no snapshot uses yet (the index is empty until the engine serves or loads a cache file)
    spare = (state_pool.scratch_slots or state_pool.snap_phys or [None])[0]
    prefill_graph = None
    if capture and op_cfg.prefill_graph_tokens > 0 and ops.prefill_capturable and not speculator:
        scratch = (kv_pool.scratch_pages[0], state_pool.scratch_slots[0])
        prefill_graph = (op_cfg.prefill_graph_tokens, *scratch)
    try:
        figures = warm_up(
            runner, pages, slots, capture, memory.max_pages_per_lane, prefill_graph,
            tune_tokens, spare, speculator,
        )  # fmt: skip
    finally:  # in reverse, so the free lists end as they were
        for s in reversed(slots):
            state_pool.release(s)
        kv_pool.free(reversed(pages))
    figures["warm_up_s"] = time.perf_counter() - t0
    planner = getattr(runner.ops, "attention_planner", None)
    if planner is not None:  # its pass counters count served passes, not the warm-up's
        figures["warm_gathered_passes"] = planner.gathered_passes
        planner.gathered_passes = 0
    prefill = runner.prefill_graphs
    graphs = "off"
    if runner.graphs is not None:
        graphs = f"batch 1..{memory.max_concurrency}"
    elif speculator is not None and speculator.graphs is not None:
        graphs = f"speculative, batch 1..{memory.max_concurrency}"
    logger.info(
        "ninfer: %s ops, warm-up %.2f s (prefill %.2f, decode %.2f, graphs %.2f: %s; "
        "prefill graphs %.2f: %s)",
        runner.ops.name,
        figures["warm_up_s"],
        figures["warm_prefill_s"],
        figures["warm_decode_s"],
        figures["capture_s"],
        graphs,
        figures.get("prefill_capture_s", 0.0),
        f"{len(prefill.buckets)} sizes to {prefill.max_tokens} tokens" if prefill else "off",
    )
    return figures


@torch.no_grad()
def warm_up(
    runner: Runner,
    pages: list[int],
    slots: list[int],
    capture: bool,
    max_pages_per_row: int,
    prefill_graph: tuple[int, int, int] | None = None,
    tune_tokens: int = 0,
    spare_slot: int | None = None,
    speculator=None,
) -> dict[str, float]:
    """Runs every kernel path of `runner` once before serving (JIT builds, Triton autotune,
    torch.compile): with `tune_tokens`, first one fresh row of that many tokens (the longest
    pass the engine runs: see below); then a fresh two-row prefill, a continuing chunk mixed
    with decode rows, fresh rows of WARM_SHORT_PASSES tokens, one eager decode per batch size,
    then (capture=True, CUDA) the decode graphs into `runner.graphs` and, with
    `prefill_graph` = (max tokens, scratch page, scratch slot), the prefill graphs into
    `runner.prefill_graphs` (a capture that fails leaves every prefill eager, with one
    warning); with a `speculator`, its graphs instead
    (`Speculator.capture`). `pages` (>= 3) and `slots` (one per row,
    max batch = len(slots)) are free pool entries that are overwritten. Returns (and keeps in
    `runner.startup`) the seconds per phase.

    Why a long pass first: fla's Triton kernels autotune on their first call, keyed by head
    counts and dims but not by length, and keep that choice for every later pass (and, with
    TRITON_CACHE_AUTOTUNING, on disk): tuned on a short pass, the long passes run slower
    configs (figures: docs/results-h200.md, autotune on a long pass). The tuning row's page
    table repeats one page (its K/V are scratch: nothing reads them).

    Then the eager pass a cached turn's long final chunk is (no cold prompt runs one): one row
    of WARM_CACHED_TOKENS after a cached context, enough queries for the gathered attention
    path, with a snapshot inside the pass into `spare_slot` (else the second slot;
    `forward.StateTap`): its first use (kernel variants for one row over a context, the
    gathers) is paid here, not by a user's cached turn."""
    t0 = time.perf_counter()
    _prefill_paths(runner, pages[:3], slots, tune_tokens, spare_slot)
    _sync(runner.device)
    t1 = time.perf_counter()
    for bs in range(1, len(slots) + 1):
        runner.step([Row([7], 20, slots[i], [pages[2]], GREEDY) for i in range(bs)])
    _sync(runner.device)
    t2 = time.perf_counter()
    runner.startup = {"warm_prefill_s": t1 - t0, "warm_decode_s": t2 - t1, "capture_s": 0.0}
    if capture and runner.device.type == "cuda":
        if speculator is not None:
            seconds = speculator.capture(pages[2], slots, max_pages_per_row)
            runner.startup["capture_s"] = seconds
        else:
            _capture(runner, pages[2], slots, max_pages_per_row, prefill_graph)
    return runner.startup


def _prefill_paths(
    runner: Runner, p: list[int], slots: list[int], tune_tokens: int, spare_slot: int | None
) -> None:
    """The prefill passes of `warm_up`, in its docstring's order, over pages `p` (3)."""
    n = len(slots)
    if tune_tokens > 0:
        table = [p[0]] * -(-tune_tokens // PAGE_SIZE)
        runner.step([Row([7] * tune_tokens, 0, slots[0], table, GREEDY)])
    rows = [Row(list(range(1, 100)), 0, slots[0], p[:2], GREEDY)]
    if n > 1:
        rows.append(Row(list(range(1, 18)), 0, slots[1], [p[2]], GREEDY))
    runner.step(rows)
    rows = [Row(list(range(1, 40)), 99, slots[0], p[:3], GREEDY)]
    rows += [Row([5], 17 + i, slots[1], [p[2]], GREEDY) for i in range(min(n - 1, 1))]
    runner.step(rows)
    for q in WARM_SHORT_PASSES:  # the MoE decode kernels' tunings past the decode batches
        runner.step([Row(list(range(1, q + 1)), 0, slots[0], p[:1], GREEDY)])
    spare = spare_slot if spare_slot is not None else (slots[1] if n > 1 else None)
    q = WARM_CACHED_TOKENS
    table = [p[0]] * -(-(PAGE_SIZE + q) // PAGE_SIZE)  # K/V of [0, 64) written above
    taps = () if spare is None else ((q - WARM_CACHED_TAIL, spare),)
    ids = [(7 * i) % 97 + 1 for i in range(q)]
    runner.step([Row(ids, PAGE_SIZE, slots[0], table, GREEDY, taps=taps)])


def _capture(
    runner: Runner,
    page: int,
    slots: list[int],
    max_pages_per_row: int,
    prefill_graph: tuple[int, int, int] | None,
) -> None:
    """Captures the decode graphs (batch 1..len(slots), on `page` and `slots`) and, with
    `prefill_graph`, the prefill graphs, into the runner and its `startup` figures."""
    # imported here: the graphs module imports `ninfer.ops.cuda`, which a CPU engine never loads
    from ninfer.engine.executor.graphs import DecodeGraphs, PrefillGraphs

    model, ops, cache, device = runner.model, runner.ops, runner.cache, runner.device
    graphs = DecodeGraphs(model, ops, cache, device, len(slots), max_pages_per_row)
    runner.startup["capture_s"] = graphs.capture(page, slots)
    runner.graphs = graphs
    if prefill_graph is None:
        return
    tokens, scratch_page, scratch_slot = prefill_graph
    prefill = PrefillGraphs(
        model, ops, cache, device, tokens, max_pages_per_row, scratch_page, scratch_slot
    )
    try:
        runner.startup["prefill_capture_s"] = prefill.capture()
        runner.prefill_graphs = prefill
    except Exception as e:  # noqa: BLE001 - e.g. an op that cannot be captured
        _sync(device)
        logger.warning("ninfer: prefill graphs unavailable (%r): prefill runs eagerly", e)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
