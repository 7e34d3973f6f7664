"""Engine configuration: the user's options and the frozen, fully resolved configuration.

`EngineOptions` mirrors the `LLM(...)` keyword arguments (spec/API.md) as given. `resolve()` is a
pure function of the options, the model configuration and a few device facts: it computes every
derived value of spec §14.2 and ADAPTATION.md once, validates them, and returns the frozen
`EngineConfig` that every component reads its part from. Nothing here touches tensors; the only
impure helper, `probe_device()`, gathers the device facts that `resolve()` consumes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ninfer.costs import CPU_RATES, CUDA_NOMINAL, DeviceRates, prefill_seconds
from ninfer.forward import PAGE_SIZE
from ninfer.models.config import Qwen35Config

MIB = 1 << 20
GIB = 1 << 30
CPU_AUTO_KV_CAP_BYTES = 256 * MIB  # "auto" on the CPU: a modest pool, not the whole RAM
CUDA_RESERVE_BYTES = 4 * GIB  # kept free on CUDA for activations, workspaces and graphs
DEFAULT_HOST_CACHE_MIB = 8192
DEFAULT_PENDING_TIMEOUT_S = 60.0
DTYPES = ("bfloat16", "float16", "float32")
# Least rung of the forward tap ladder: a fork this deep or deeper, in a stretch no boundary
# marks, resumes at least halfway to it (below, a re-prefill costs about one pass anyway)
FORWARD_TAP_MIN = 512
KV_DTYPES = ("bfloat16", "float16", "float32", "fp8_e4m3")


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """The `LLM(...)` keyword arguments, unresolved (None / "auto" mean "derive it")."""

    model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    kv_dtype: str = "auto"
    max_concurrency: int = 8
    prefill_chunk: int | None = None
    # tokens per prefill pass while no lane decodes (a lone prompt: fewer, longer passes; the
    # prompt-tail snapshot is taken inside the final pass, within prefill_chunk of the end);
    # None = derived: SOLO_CHUNK_CUDA for a model whose eager pass of that size is bound by the
    # GPU (`solo_chunk_pays`) when prefill_chunk is derived too, doubled (up to SOLO_CHUNK_MAX)
    # while such a pass is estimated within SOLO_PASS_S (a request arriving meanwhile waits
    # for the pass: 9B 16384, 27B 8192), else prefill_chunk
    solo_prefill_chunk: int | None = None
    max_model_len: int | None = None
    kv_capacity: int | str = "auto"
    # > 0 builds the Host tier (pinned on CUDA; torch.empty, so untouched slabs cost no memory
    # on the CPU either); 0 = Device only. An explicit or default value is honoured as given.
    host_cache_mib: int = DEFAULT_HOST_CACHE_MIB
    device_snapshot_slots: int | None = None
    cache_taps_per_request: int | None = None
    cache_tap_ladder: int | None = None
    cache_tap_min_gap: int | None = None
    prefix_cache_file: str | None = None
    prefix_reuse: bool = True
    concurrent_prefill: bool = False
    compile: bool = True
    cuda_graphs: bool = True
    # launch the next decode step before reading this one's tokens (same outputs; the GPU does
    # not wait for the host's per-step bookkeeping)
    overlap_decode: bool = True
    # one-row prefill steps of at most this many tokens replay a captured CUDA graph (padded to
    # a 64-token bucket; needs cuda_graphs; capped at prefill_chunk, which no prefill step
    # exceeds); 0 = every prefill step runs eagerly. 2048 = the CUDA chunk: every chunk of a
    # long cold prompt replays a graph (eager 2048-token passes of a 9B are bound by the host)
    prefill_graph_tokens: int = 2048
    seed: int = 0
    # Queue timeout budget (seconds). In-flight coalescing (§12.2) lets the FIFO head wait for a
    # prefilling sibling only while twice the sibling's predicted prefill up to the shared
    # target is within half of it; 0 disables coalescing. No request is ever failed for waiting.
    pending_timeout_s: float = DEFAULT_PENDING_TIMEOUT_S
    check_invariants: bool = False  # debug: check cache + memory invariants after every step


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What `resolve()` needs to know about the machine (see `probe_device`)."""

    device: str  # "cpu" | "cuda" | "cuda:N"
    free_bytes: int  # free device memory (CPU: available RAM, informational)
    total_bytes: int
    # matmul peaks and copy rates (`ninfer.costs`); None: the CPU's or the nominal CUDA figures
    rates: DeviceRates | None = None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Every resolved engine value. Frozen; components receive the fields they need."""

    model: str | None
    device: str
    dtype: str
    kv_dtype: str
    max_concurrency: int
    prefill_chunk: int
    solo_prefill_chunk: int  # >= prefill_chunk; the budget of a step without decode rows
    max_model_len: int
    kv_pages: int  # Device KV page pool size (pages of 64 tokens, shared by all FA layers)
    kv_page_bytes: int  # one page over every full-attention layer, K + V
    state_image_bytes: int  # one state slot over every GDN layer
    host_cache_bytes: int  # requested Host tier budget (0 = Device only)
    host_tier: bool  # a Host tier is built: host_cache_bytes > 0 and prefix_reuse
    host_slabs: int  # slabs of the Host tier (0 without one): floor(budget / kv_page_bytes)
    device_snapshot_slots: int
    cache_taps_per_request: int
    cache_tap_ladder: int
    cache_tap_min_gap: int
    # R of the forward tap ladder base + R*2^k (`cache.taps`): the least multiple of
    # prefill_chunk >= FORWARD_TAP_MIN, so every rung lies on a chunk boundary (no pass split)
    cache_tap_forward: int
    prefix_cache_file: str | None
    prefix_reuse: bool
    concurrent_prefill: bool
    pending_timeout_s: float
    compile: bool
    cuda_graphs: bool
    overlap_decode: bool
    prefill_graph_tokens: int  # 0 when off (no CUDA graphs); else a multiple of 64
    seed: int
    check_invariants: bool
    # the rates every time estimate uses (`ninfer.costs`): the scheduler's pass sizing and the
    # cache's cost model (spec §6.2, §9.4)
    prefill_flops_per_s: float = CPU_RATES.prefill_flops_per_s("float32")
    h2d_bytes_per_s: float = CPU_RATES.h2d_bytes_per_s
    d2h_bytes_per_s: float = CPU_RATES.d2h_bytes_per_s
    pass_overhead_s: float = CPU_RATES.pass_overhead_s
    copy_latency_s: float = CPU_RATES.copy_latency_s
    device_rates: str = CPU_RATES.source  # where the rates come from: probe | nominal | cpu

    @property
    def state_slots(self) -> int:
        """Physical state slots: C active + D snapshot (any slot may play either role)."""
        return self.max_concurrency + self.device_snapshot_slots

    @property
    def scratch_entries(self) -> int:
        """KV pages and state slots held outside the pools, each: the prefill graphs' padding
        row writes its K/V and state there (1 with prefill graphs, else 0)."""
        return int(self.prefill_graph_tokens > 0)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_pages * PAGE_SIZE

    @property
    def max_pages_per_lane(self) -> int:
        return -(-self.max_model_len // PAGE_SIZE)

    def describe(self) -> dict:
        """Every resolved value plus the derived byte sizes, for `ninfer info` and logs."""
        d = asdict(self)
        d["state_slots"] = self.state_slots
        d["kv_capacity_tokens"] = self.kv_capacity_tokens
        d["kv_pool_bytes"] = self.kv_pages * self.kv_page_bytes
        d["state_pool_bytes"] = (self.state_slots + self.scratch_entries) * self.state_image_bytes
        return d


def probe_device(device: str) -> DeviceFacts:
    """Resolve "auto" and read free/total memory of the chosen device (impure)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: CUDA is not available on this machine")
        from ninfer.costs import rates_for

        rates = rates_for(device)  # probed once per process, before free memory is read
        free, total = torch.cuda.mem_get_info(torch.device(device))
        return DeviceFacts(device, int(free), int(total), rates)
    if device != "cpu":
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    total = _cpu_total_bytes()
    return DeviceFacts(device="cpu", free_bytes=total, total_bytes=total)


def _cpu_total_bytes() -> int:
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * GIB


def _itemsize(dtype: str) -> int:
    return {"bfloat16": 2, "float16": 2, "float32": 4, "fp8_e4m3": 1}[dtype]


def _check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, got {value!r}")
    return value


SOLO_CHUNK_CUDA = 8192
SOLO_CHUNK_MAX = 32768
# the longest estimated solo pass (`pass_seconds`) a derived solo chunk doubles up to. On the
# H200, one machine, the 9B's 32k prompt: 895.9 ms in passes of 8192, 886.5 in passes of
# 16384 (two, so ~0.44 s a pass), 881.8 in one pass (thirteenth session).
SOLO_PASS_S = 0.5
# An eager prefill pass's host time on the H200 machine (eighth session, profiled): Python and
# launches per layer.
HOST_S_PER_GDN_LAYER = 2.4e-3
HOST_S_PER_FULL_LAYER = 1.05e-3


def pass_seconds(model: Qwen35Config, tokens: int, flops_per_s: float | None = None) -> float:
    """A prefill pass's GPU time from the shape (`ninfer.costs.prefill_seconds`: matmuls,
    attention, GDN), at `flops_per_s` (default: the nominal CUDA device's bf16 rate). The same
    model the cache's cost model is built from (`CacheBridge`)."""
    rate = flops_per_s or CUDA_NOMINAL.prefill_flops_per_s("bfloat16")
    return prefill_seconds(model, rate, tokens)


def solo_chunk_pays(model: Qwen35Config, tokens: int, flops_per_s: float | None = None) -> bool:
    """Whether an eager pass of `tokens` tokens keeps the GPU busy: its matmul time (2 x the
    active projection and MLP parameters per token, estimated from the shape) is at least
    twice the host's time to launch it. Passes above `prefill_graph_tokens` run eagerly, so a
    small model's long pass would wait on the host: the 9B and 27B pay at 8192 tokens, the 4B
    (~0.7x) and the 35B-A3B (3B active) do not."""
    gpu_s = pass_seconds(model, tokens, flops_per_s)
    n_full = len(model.full_layer_ids)
    host_s = HOST_S_PER_GDN_LAYER * (model.num_hidden_layers - n_full)
    host_s += HOST_S_PER_FULL_LAYER * n_full
    return gpu_s >= 2 * host_s


def _solo_chunk(
    opts: EngineOptions, model: Qwen35Config, chunk: int, on_cuda: bool, max_len: int,
    rate: float,
) -> int:  # fmt: skip
    if opts.solo_prefill_chunk is not None:
        return _check_int("solo_prefill_chunk", opts.solo_prefill_chunk, chunk)
    pays = solo_chunk_pays(model, SOLO_CHUNK_CUDA, rate)
    if not (on_cuda and opts.prefill_chunk is None and pays):
        return chunk
    solo = max(chunk, SOLO_CHUNK_CUDA)
    while solo < max_len and 2 * solo <= SOLO_CHUNK_MAX:
        if pass_seconds(model, 2 * solo, rate) > SOLO_PASS_S:
            break
        solo *= 2
    return solo


def resolve_dtypes(opts: EngineOptions, on_cuda: bool) -> tuple[str, str]:
    """(dtype, kv_dtype) names: "auto" is bfloat16 on CUDA, float32 on the CPU."""
    dtype = opts.dtype
    if dtype == "auto":
        dtype = "bfloat16" if on_cuda else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {DTYPES}, got {opts.dtype!r}")
    kv_dtype = dtype if opts.kv_dtype == "auto" else opts.kv_dtype
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be 'auto' or one of {KV_DTYPES}, got {opts.kv_dtype!r}")
    if kv_dtype == "fp8_e4m3" and not on_cuda:
        raise ValueError("kv_dtype='fp8_e4m3' needs a CUDA device (device resolved to 'cpu')")
    return dtype, kv_dtype


def _resolve_pages(
    opts: EngineOptions, facts: DeviceFacts, page_bytes: int, state_bytes: int, c: int, len_cfg: int
) -> int:
    """Device KV pages: an explicit token cap, or "auto" (free memory becomes block cache)."""
    if opts.kv_capacity != "auto":
        tokens = _check_int("kv_capacity", opts.kv_capacity, PAGE_SIZE)
        return tokens // PAGE_SIZE
    if facts.device.startswith("cuda"):
        budget = facts.free_bytes - max(CUDA_RESERVE_BYTES, facts.total_bytes // 10) - state_bytes
    else:
        # CPU: room for every lane at full length plus as much again as cache, kept modest.
        want = (c + 1) * len_cfg * (page_bytes // PAGE_SIZE)
        budget = min(want, CPU_AUTO_KV_CAP_BYTES, facts.free_bytes // 4)
    pages = budget // page_bytes
    if pages < 2:
        raise ValueError(
            f"kv_capacity='auto': not enough free memory on {facts.device} for KV pages "
            f"({facts.free_bytes} B free); pass kv_capacity=<tokens>"
        )
    return int(pages)


def _host_slabs(host_mib: int, model: Qwen35Config, page_bytes: int, state_bytes: int) -> int:
    """Slabs of a `host_mib` Host tier (0 for 0), by the memory layer's own rule
    (`plan_slab_geometry`): a nonzero budget smaller than one snapshot (image slabs + tail)
    plus one block raises ValueError naming host_cache_mib. Allocates nothing."""
    from ninfer.memory.host_slabs import plan_slab_geometry

    n_fa = len(model.full_layer_ids)
    if not host_mib or not n_fa:
        return 0
    geometry = plan_slab_geometry(host_mib, n_fa, page_bytes // n_fa, state_bytes)
    return geometry.num_slabs


def resolve(opts: EngineOptions, model: Qwen35Config, facts: DeviceFacts) -> EngineConfig:
    """Compute every derived value (spec §14.2, ADAPTATION.md defaults). Pure; raises ValueError
    naming the offending field."""
    on_cuda = facts.device.startswith("cuda")
    c = _check_int("max_concurrency", opts.max_concurrency, 1, 8)
    dtype, kv_dtype = resolve_dtypes(opts, on_cuda)
    chunk = opts.prefill_chunk if opts.prefill_chunk is not None else (2048 if on_cuda else 256)
    chunk = _check_int("prefill_chunk", chunk, 16)
    max_len = opts.max_model_len or model.max_position_embeddings
    rates = facts.rates or (CUDA_NOMINAL if on_cuda else CPU_RATES)
    rate = rates.prefill_flops_per_s(dtype)
    solo = _solo_chunk(opts, model, chunk, on_cuda, max_len, rate)
    host_mib = _check_int("host_cache_mib", opts.host_cache_mib, 0)
    page_bytes = model.kv_bytes_per_token(_itemsize(kv_dtype)) * PAGE_SIZE
    state_bytes = model.state_image_bytes(_itemsize(dtype))
    host_bytes = host_mib * MIB
    host_tier = bool(host_bytes) and bool(opts.prefix_reuse)
    host_slabs = _host_slabs(host_mib, model, page_bytes, state_bytes) if host_tier else 0
    timeout = opts.pending_timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise ValueError(f"pending_timeout_s must be a number >= 0, got {timeout!r}")
    slots = opts.device_snapshot_slots
    slots = (c + 1 if host_tier else c + 2) if slots is None else slots
    slots = _check_int("device_snapshot_slots", slots, 1)
    taps = opts.cache_taps_per_request
    taps = (8 if host_tier else 2) if taps is None else taps
    taps = _check_int("cache_taps_per_request", taps, 0)
    ladder = opts.cache_tap_ladder if opts.cache_tap_ladder is not None else max(4096, 2 * chunk)
    ladder = _check_int("cache_tap_ladder", ladder, PAGE_SIZE)
    gap = opts.cache_tap_min_gap if opts.cache_tap_min_gap is not None else max(1024, chunk)
    gap = _check_int("cache_tap_min_gap", gap, PAGE_SIZE)
    forward = -(-FORWARD_TAP_MIN // chunk) * chunk
    len_cfg = model.max_position_embeddings
    if opts.max_model_len is not None:
        _check_int("max_model_len", opts.max_model_len, 2, len_cfg)
        len_cfg = opts.max_model_len
    graph_tokens = _check_int("prefill_graph_tokens", opts.prefill_graph_tokens, 0)
    graphs = bool(opts.cuda_graphs) and on_cuda
    graph_tokens = min(graph_tokens, chunk)
    graph_tokens = -(-graph_tokens // PAGE_SIZE) * PAGE_SIZE if graphs else 0
    scratch = int(graph_tokens > 0)
    states = state_bytes * (c + slots + scratch)
    pages = _resolve_pages(opts, facts, page_bytes, states, c, len_cfg)
    max_len = min(len_cfg, pages * PAGE_SIZE)
    if opts.max_model_len is not None and max_len < opts.max_model_len:
        raise ValueError(
            f"kv_capacity holds {pages * PAGE_SIZE} tokens, less than max_model_len="
            f"{opts.max_model_len}: one max-length request must fit"
        )
    if opts.prefix_cache_file is not None and not host_bytes:
        raise ValueError("prefix_cache_file needs a Host tier (host_cache_mib > 0)")
    return EngineConfig(
        model=opts.model,
        device=facts.device,
        dtype=dtype,
        kv_dtype=kv_dtype,
        max_concurrency=c,
        prefill_chunk=chunk,
        solo_prefill_chunk=solo,
        max_model_len=max_len,
        kv_pages=pages,
        kv_page_bytes=page_bytes,
        state_image_bytes=state_bytes,
        host_cache_bytes=host_bytes,
        host_tier=host_tier,
        host_slabs=host_slabs,
        device_snapshot_slots=slots,
        cache_taps_per_request=taps,
        cache_tap_ladder=ladder,
        cache_tap_min_gap=gap,
        cache_tap_forward=forward,
        prefix_cache_file=opts.prefix_cache_file,
        prefix_reuse=bool(opts.prefix_reuse),
        concurrent_prefill=bool(opts.concurrent_prefill),
        pending_timeout_s=float(timeout),
        compile=bool(opts.compile) and on_cuda,
        cuda_graphs=graphs,
        overlap_decode=bool(opts.overlap_decode),
        prefill_graph_tokens=graph_tokens,
        seed=int(opts.seed),
        check_invariants=bool(opts.check_invariants),
        prefill_flops_per_s=rate,
        h2d_bytes_per_s=rates.h2d_bytes_per_s,
        d2h_bytes_per_s=rates.d2h_bytes_per_s,
        pass_overhead_s=rates.pass_overhead_s,
        copy_latency_s=rates.copy_latency_s,
        device_rates=rates.source,
    )
