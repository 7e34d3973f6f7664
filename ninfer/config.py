"""Engine configuration: the user's options and the frozen, fully resolved configuration.

`EngineOptions` is the one declaration of every `LLM(...)` keyword argument (spec/API.md): each
field carries its `Option` metadata (help text, command-line type, accepted range or values), the
command line's flags are generated from it (`ninfer.cli.main`), and constructing it checks every
value against it. `resolve()` is a pure function of the options, the model configuration and the
device facts: it computes every derived value of design §14.2 and ADAPTATION.md once, checks what
depends on the model and the device, and returns the frozen `EngineConfig`, a record of parts
(`MemoryGeometry`, `Scheduling`, `CachePolicy`, `OpsConfig`, `Persistence`): the engine hands
each component the part(s) it reads. Nothing here touches tensors or estimates time
(`ninfer.costs` does); the only impure helper, `probe_device()`, gathers the device facts that
`resolve()` consumes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import Field, asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from ninfer.cache.host_pool import SlabGeometry, plan_slab_geometry
from ninfer.costs import CPU_RATES, CUDA_NOMINAL, DeviceRates, pass_seconds, solo_chunk_pays
from ninfer.dtypes import DTYPES, KV_DTYPES, itemsize
from ninfer.models.quant import QUANTIZATION_CHOICES as QUANTIZATIONS
from ninfer.ops.choices import FP8_DECODE, GATHER_MIN_ROWS, VERIFY_BACKENDS, OpChoices
from ninfer.page import PAGE_SIZE

if TYPE_CHECKING:  # the command line reads the options without importing torch
    from ninfer.models.config import Qwen35Config

MIB = 1 << 20
GIB = 1 << 30
CPU_AUTO_KV_CAP_BYTES = 256 * MIB  # "auto" on the CPU: a modest pool, not the whole RAM
CUDA_RESERVE_BYTES = 4 * GIB  # kept free on CUDA for activations, workspaces and graphs
SPECULATIVE = ("mtp",)  # the draft methods of `speculative`
MAX_SPECULATIVE_TOKENS = 4
DEFAULT_SPECULATIVE_TOKENS = 3
# Least rung of the forward tap ladder: a fork this deep or deeper, in a stretch no boundary
# marks, resumes at least halfway to it (below, a re-prefill costs about one pass anyway)
FORWARD_TAP_MIN = 512


@dataclass(frozen=True, slots=True)
class Option:
    """What one engine option accepts and what its command-line flag says.

    Rules: a bool option is a switch (`--no-NAME` when it defaults to True, else `--NAME`);
    an int option with a `lo`, and a float option, are checked (a bool is not a number)
    against `lo`..`hi`; an option with `auto` also takes the string "auto" (= derive it);
    `choices` lists a string option's values; None is accepted where the default is None
    (= derive it). A new option is one field here: `LLM`'s signature and checks and the
    command line's flag follow from it."""

    help: str  # the flag's help text: explains itself, cites no document outside the package
    metavar: str | None = None  # the flag's value name (None: the option's name in capitals)
    kind: type | None = None  # int | float: a number option; None: a string or a switch
    lo: float | None = None
    hi: int | None = None
    auto: bool = False
    choices: tuple[str, ...] = ()
    flag: bool = True  # False: a Python-only option (debugging), no command-line flag


def _opt(default: object, help: str, **option: object) -> Field:
    return field(default=default, metadata={"option": Option(help, **option)})


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """The `LLM(...)` keyword arguments, unresolved (None / "auto" mean "derive it").

    Constructing one checks each value against its `Option` (ValueError naming the field);
    checks that need the model or the device are `resolve()`'s."""

    model: str | None = _opt(
        None, "Hugging Face-format Qwen3.5 checkpoint folder (default: the embedded demo "
        "model, random weights)", metavar="PATH")  # fmt: skip
    # "auto", "cpu" or "cuda[:N]": checked by `probe_device`, which resolves it
    device: str = _opt("auto", '"auto" (default: CUDA if present), "cuda", "cuda:N" or "cpu"')
    dtype: str = _opt(
        "auto", 'weights and activations: "auto" (bfloat16 on CUDA, float32 on the CPU), '
        '"bfloat16", "float16" or "float32"', auto=True, choices=DTYPES)  # fmt: skip
    kv_dtype: str = _opt(
        "auto", 'KV cache: "auto" (= --dtype), "bfloat16", "float16", "float32" or "fp8_e4m3"',
        auto=True, choices=KV_DTYPES)  # fmt: skip
    # None: the checkpoint's own weights (dense, or FP8 per its quantization_config); "fp8":
    # a dense checkpoint's linears quantised at load (`ninfer.models.quant.on_the_fly`)
    quantization: str | None = _opt(
        None, 'weights: "fp8" quantises a bf16 checkpoint\'s linear layers to FP8 at load '
        "(default: as the checkpoint is)", choices=QUANTIZATIONS)  # fmt: skip
    max_concurrency: int = _opt(
        8, "requests decoded together, 1..8 (default 8)", metavar="N", kind=int, lo=1, hi=8
    )
    prefill_chunk: int | None = _opt(
        None, "tokens per prefill pass while other requests decode (default: derived from the "
        "model and device)", metavar="TOKENS", kind=int, lo=16)  # fmt: skip
    # Tokens per prefill pass while no lane decodes (a lone prompt: fewer, longer passes; the
    # prompt-tail snapshot is taken inside the final pass, within prefill_chunk of the end).
    # Derived (`_solo_chunk`): SOLO_CHUNK_CUDA for a model whose eager pass of that size is bound
    # by the GPU (`ninfer.costs.solo_chunk_pays`) when prefill_chunk is derived too, doubled (up
    # to SOLO_CHUNK_MAX) while such a pass is estimated within SOLO_PASS_S (a request arriving
    # meanwhile waits for the pass), else prefill_chunk. At least prefill_chunk (`resolve`).
    solo_prefill_chunk: int | None = _opt(
        None, "tokens per prefill pass while no request decodes (default: derived)",
        metavar="TOKENS", kind=int, lo=16)  # fmt: skip
    # at most the model's max_position_embeddings (`resolve`)
    max_model_len: int | None = _opt(
        None, "longest prompt + reply (default: the model's)", metavar="TOKENS", kind=int, lo=2
    )
    kv_capacity: int | str = _opt(
        "auto", 'KV pool size in tokens, or "auto" (default: what free memory allows)',
        metavar="TOKENS", kind=int, lo=PAGE_SIZE, auto=True)  # fmt: skip
    # > 0 builds the Host tier (pinned on CUDA; torch.empty, so untouched slabs cost no memory
    # on the CPU either); 0 = Device only. An explicit or default value is honoured as given.
    host_cache_mib: int = _opt(
        8192, "Host (CPU memory) tier of the prefix cache in MiB; 0: Device tier only "
        "(default 8192)", metavar="MIB", kind=int, lo=0)  # fmt: skip
    encoder_cache_mib: int = _opt(
        256, "Device memory for the vision tower's outputs, kept by image across requests, in "
        "MiB (default 256)", metavar="MIB", kind=int, lo=0)  # fmt: skip
    device_snapshot_slots: int | None = _opt(
        None, "recurrent-state snapshots kept on the Device (default: derived)", metavar="N",
        kind=int, lo=1)  # fmt: skip
    cache_taps_per_request: int | None = _opt(
        None, "most mid-prompt snapshots a request takes (default: derived)", metavar="N",
        kind=int, lo=0)  # fmt: skip
    cache_tap_ladder: int | None = _opt(
        None, "spacing of the ladder of mid-prompt snapshots in a long prompt (default: "
        "derived)", metavar="TOKENS", kind=int, lo=PAGE_SIZE)  # fmt: skip
    cache_tap_min_gap: int | None = _opt(
        None, "least distance between two snapshots of a prompt (default: derived)",
        metavar="TOKENS", kind=int, lo=PAGE_SIZE)  # fmt: skip
    prefix_cache_file: str | None = _opt(
        None, "keep the Host tier across runs in this file: saved at exit, loaded at start",
        metavar="PATH")  # fmt: skip
    prefix_reuse: bool = _opt(True, "turn the prefix cache off (every prompt is computed in full)")
    concurrent_prefill: bool = _opt(
        False, "admit a request while another is still prefilling (default: one prefill at "
        "a time)")  # fmt: skip
    compile: bool = _opt(True, "do not torch.compile the model (faster start, slower steps)")
    cuda_graphs: bool = _opt(True, "run every step eagerly, without captured CUDA graphs")
    # launch the next decode step before reading this one's tokens (same outputs; the GPU does
    # not wait for the host's per-step bookkeeping)
    overlap_decode: bool = _opt(True, "read each decode step's tokens before launching the next")
    # One-row prefill steps of at most this many tokens replay a captured CUDA graph (padded to
    # a 64-token bucket; needs cuda_graphs; capped at prefill_chunk, which no prefill step
    # exceeds); 0 = every prefill step runs eagerly. The default is the CUDA chunk, so every
    # chunk of a long cold prompt replays a graph: eager passes of that size are bound by the
    # host's launches on the models served (docs/results-h200.md).
    prefill_graph_tokens: int = _opt(
        2048, "prefill passes up to TOKENS replay a CUDA graph; 0: eager (default 2048)",
        metavar="TOKENS", kind=int, lo=0)  # fmt: skip
    seed: int = _opt(0, "seed of the sampling RNG (default 0)", kind=int)
    # The draft proposes K tokens per decode step; one target pass verifies them, and the
    # output is the target's (greedy: the same tokens; sampled: the same distribution).
    speculative: str | None = _opt(
        None, 'speculative decoding: "mtp" drafts with the checkpoint\'s own MTP head (default: '
        "off)", choices=SPECULATIVE)  # fmt: skip
    num_speculative_tokens: int | None = _opt(
        None, f"draft tokens per decode step with --speculative, 1..{MAX_SPECULATIVE_TOKENS} "
        f"(default {DEFAULT_SPECULATIVE_TOKENS})", metavar="K", kind=int, lo=1,
        hi=MAX_SPECULATIVE_TOKENS)  # fmt: skip
    # The draft head scores only the first N token ids and the tokenizer's added tokens (its
    # LM head is the target's, and reading all of it is most of a draft step); the target
    # scores every token, so the output is unchanged: a token outside the draft's vocabulary
    # is only never proposed. None: the whole vocabulary.
    draft_vocab: int | None = _opt(
        None, "with --speculative: the draft head proposes only the first N token ids and "
        "the tokenizer's added tokens (a faster draft; default: every token)", metavar="N",
        kind=int, lo=1)  # fmt: skip
    # The draft's own weights in FP8: the MTP layer's projections (attention, MLP or experts)
    # quantised at load as the FP8 releases store them (fine-grained, 128 x 128; `mtp.fc`, the
    # norms and routers stay as loaded), so a draft pass reads the layer in half the bytes. The
    # target is untouched, so the output is unchanged; only the drafts, and with them the
    # acceptance, may differ. None: the head as loaded.
    draft_quantization: str | None = _opt(
        None, 'with --speculative: "fp8" quantises the MTP draft layer\'s projections to FP8 '
        "at load (a faster draft; the target stays as loaded; default: as loaded)",
        choices=QUANTIZATIONS)  # fmt: skip
    # Queue timeout budget (seconds). In-flight coalescing (§12.2) lets the FIFO head wait for a
    # prefilling sibling only while twice the sibling's predicted prefill up to the shared
    # target is within half of it; 0 disables coalescing. No request is ever failed for waiting.
    pending_timeout_s: float = _opt(
        60.0, "how long a queued request may wait for another one prefilling the same prefix; "
        "0: never wait (default 60)", metavar="S", kind=float, lo=0)  # fmt: skip
    check_invariants: bool = _opt(
        False, "check the cache and memory invariants after every step (debugging)", flag=False
    )
    # The CUDA op set's choices (`ninfer.ops.choices.OpChoices`; the reference ops have one
    # path per op and ignore them): experiments and tests set them, no command-line flag.
    gather_min_rows: float = _opt(
        GATHER_MIN_ROWS, "query rows per KV head from which a prefill pass over a cached "
        "context gathers its K/V (0: always, inf: never)", kind=float, lo=0,
        flag=False)  # fmt: skip
    conv_tile: tuple[int, int, int] | None = _opt(
        None, "the prefill conv's launch shape (rows, channels, warps), powers of two (default: "
        "the kernel's)", flag=False)  # fmt: skip
    verify_backend: str = _opt(
        "fa2", "FlashInfer's backend for the speculative verify step's attention: \"fa2\" "
        "(default: splits long contexts over CTAs), \"fa3\" or \"auto\"",
        choices=VERIFY_BACKENDS, flag=False)  # fmt: skip
    fp8_decode: str = _opt(
        "w8a16", "the FP8 decode GEMV's activations on 128x128-block weights: \"w8a16\" "
        "(default: bf16), \"w8a8\" (quantised per token per 128 columns, as prefill does) or "
        "\"fastest\" (per shape, whichever is faster)", choices=FP8_DECODE)  # fmt: skip

    def __post_init__(self) -> None:
        for f, option in option_fields():
            _check_option(f.name, getattr(self, f.name), f.default, option)
        op_choices(self)  # checks what no `Option` rule says (conv_tile's shape)


def op_choices(opts: EngineOptions) -> OpChoices:
    """The op set's choices among `opts` (ValueError naming a field they rule out)."""
    return OpChoices(
        gather_min_rows=opts.gather_min_rows,
        conv_tile=opts.conv_tile,
        verify_backend=opts.verify_backend,
        fp8_decode=opts.fp8_decode,
    )


def option_fields() -> Iterator[tuple[Field, Option]]:
    """Every engine option with its metadata, in declaration order (the flags' order)."""
    for f in fields(EngineOptions):
        yield f, f.metadata["option"]


def _check_option(name: str, value: object, default: object, option: Option) -> None:
    """ValueError naming `name` when `value` is outside what `option` accepts."""
    if value is None and default is None:
        return
    if option.auto and value == "auto":
        return
    if option.choices:
        if value not in option.choices:
            what = "'auto' or one of" if option.auto else "one of"
            raise ValueError(f"{name} must be {what} {option.choices}, got {value!r}")
    elif option.kind is int and option.lo is not None:
        _check_int(name, value, int(option.lo), option.hi)
    elif option.kind is float:
        lo = option.lo or 0
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not value >= lo:  # (NaN fails too)
            raise ValueError(f"{name} must be a number >= {lo:g}, got {value!r}")


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What `resolve()` needs to know about the machine (see `probe_device`)."""

    device: str  # "cpu" | "cuda" | "cuda:N"
    free_bytes: int  # free device memory (CPU: available RAM, informational)
    total_bytes: int
    # matmul peaks and copy rates (`ninfer.costs`); None: the CPU's or the nominal CUDA figures
    rates: DeviceRates | None = None


@dataclass(frozen=True, slots=True)
class MemoryGeometry:
    """What the pools are built of: the device, the dtypes, and the size of every Device and
    Host entry (the KV state's pools, the warm-up's borrowed entries, the file's fingerprint)."""

    device: str
    dtype: str
    kv_dtype: str
    max_concurrency: int  # lanes: the active state slots, the most requests decoded together
    max_model_len: int
    kv_pages: int  # Device KV page pool size (pages of 64 tokens, shared by all FA layers)
    kv_page_bytes: int  # one page over every KV layer (`kv_layers`), K + V
    state_image_bytes: int  # one state slot over every GDN layer
    device_snapshot_slots: int
    # KV pages and state slots held outside the pools, each: the prefill graphs' padding row
    # writes its K/V and state there (1 with prefill graphs, else 0)
    scratch_entries: int
    # full-attention layers with an entry in every KV page: the model's, plus the MTP head's
    kv_layers: int
    # state slots after the pool's and the scratch entries: the verify pass's per-token
    # snapshots (num_speculative_tokens per lane; 0 without speculation)
    speculative_slots: int
    host_cache_bytes: int  # requested Host tier budget (0 = Device only)
    host_tier: bool  # a Host tier is built: host_cache_bytes > 0 and prefix_reuse
    # the Host tier's one slab geometry (None without one): the index's slab pool, the pinned
    # slabs, copy planning and the prefix cache file all take this object
    host_geometry: SlabGeometry | None

    @property
    def state_slots(self) -> int:
        """Physical state slots: C active + D snapshot (any slot may play either role)."""
        return self.max_concurrency + self.device_snapshot_slots

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_pages * PAGE_SIZE

    @property
    def max_pages_per_lane(self) -> int:
        return -(-self.max_model_len // PAGE_SIZE)


@dataclass(frozen=True, slots=True)
class Scheduling:
    """What the loop reads: step budgets, admission, the sampling seed, per-step checks."""

    prefill_chunk: int
    solo_prefill_chunk: int  # >= prefill_chunk; the budget of a step without decode rows
    concurrent_prefill: bool
    overlap_decode: bool
    seed: int
    check_invariants: bool
    encoder_cache_bytes: int = 256 << 20  # the vision tower's outputs kept by image digest


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """The prefix cache's policy: on or off, the taps a prompt takes, how long a request waits
    for a sibling's prefix, and the rates its cost model prices with (design §6.2, §9.4)."""

    prefix_reuse: bool
    cache_taps_per_request: int
    cache_tap_ladder: int
    cache_tap_min_gap: int
    # R of the forward tap ladder base + R*2^k (`cache.taps`): FORWARD_TAP_MIN. A long pass
    # takes its rungs inside itself (`scheduler.InPass`), so they need not lie on the chunk grid
    cache_tap_forward: int
    pending_timeout_s: float
    # the rates every time estimate uses (`ninfer.costs`)
    prefill_flops_per_s: float
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    pass_overhead_s: float
    copy_latency_s: float
    device_rates: str  # where the rates come from: probe | nominal | cpu


@dataclass(frozen=True, slots=True)
class OpsConfig:
    """How the model runs: the op set's build and choices, compilation, captured graphs."""

    compile: bool
    cuda_graphs: bool
    prefill_graph_tokens: int  # 0 when off (no CUDA graphs); else a multiple of 64
    op_choices: OpChoices  # handed to the op set when it is built (`select_ops`)


@dataclass(frozen=True, slots=True)
class Speculation:
    """Speculative decoding: the draft method (None: off) and the draft tokens per step."""

    speculative: str | None = None  # the draft method
    num_speculative_tokens: int = 0  # 0 when off
    draft_vocab: int | None = None  # the draft's first token ids (None: all)
    draft_quantization: str | None = None  # the draft layer quantised at load ("fp8")


@dataclass(frozen=True, slots=True)
class Persistence:
    """Where the Host tier is kept across runs (None: nowhere)."""

    prefix_cache_file: str | None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Every resolved engine value, in parts. Frozen; the engine (the composition root) hands
    each component the part(s) it reads, never the whole record."""

    model: str | None  # the checkpoint folder (None: the demo model)
    quantization: str | None  # quantised at load ("fp8"), or None: as the checkpoint is
    memory: MemoryGeometry
    scheduling: Scheduling
    cache: CachePolicy
    ops: OpsConfig
    persistence: Persistence
    speculation: Speculation = Speculation()

    def describe(self) -> dict:
        """Every resolved value, flat, plus the derived byte sizes, for `ninfer info` and
        logs."""
        m = self.memory
        d = {"model": self.model, "quantization": self.quantization}
        parts = (m, self.scheduling, self.cache, self.ops, self.persistence, self.speculation)
        for part in parts:
            d.update({f.name: getattr(part, f.name) for f in fields(part)})
        d["op_choices"] = asdict(self.ops.op_choices)
        del d["host_geometry"]  # the byte sizes say it (the ledger counts the slabs)
        del d["scratch_entries"]  # the pool bytes count them
        d["state_slots"] = m.state_slots
        d["kv_capacity_tokens"] = m.kv_capacity_tokens
        d["kv_pool_bytes"] = m.kv_pages * m.kv_page_bytes
        extra = m.scratch_entries + m.speculative_slots
        d["state_pool_bytes"] = (m.state_slots + extra) * m.state_image_bytes
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


def _check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, got {value!r}")
    return value


SOLO_CHUNK_CUDA = 8192
SOLO_CHUNK_MAX = 32768
# The longest estimated solo pass (`ninfer.costs.pass_seconds`) a derived solo chunk doubles up
# to: a request arriving meanwhile waits for the pass (docs/results-h200.md, "The 9B's solo
# chunk").
SOLO_PASS_S = 0.5


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
    kv_dtype = dtype if opts.kv_dtype == "auto" else opts.kv_dtype
    if kv_dtype == "fp8_e4m3" and not on_cuda:
        raise ValueError("kv_dtype='fp8_e4m3' needs a CUDA device (device resolved to 'cpu')")
    return dtype, kv_dtype


def _resolve_pages(
    opts: EngineOptions, facts: DeviceFacts, page_bytes: int, state_bytes: int, c: int,
    len_cfg: int, slots: str,
) -> int:  # fmt: skip
    """Device KV pages: an explicit token cap, or "auto" (free memory becomes block cache).
    `state_bytes`: the recurrent-state slots', which `slots` itemises for the error."""
    if opts.kv_capacity != "auto":
        return opts.kv_capacity // PAGE_SIZE
    if facts.device.startswith("cuda"):
        reserve = max(CUDA_RESERVE_BYTES, facts.total_bytes // 10)
        budget = facts.free_bytes - reserve - state_bytes
    else:
        # CPU: room for every lane at full length plus as much again as cache, kept modest.
        want = (c + 1) * len_cfg * (page_bytes // PAGE_SIZE)
        budget = min(want, CPU_AUTO_KV_CAP_BYTES, facts.free_bytes // 4)
    pages = budget // page_bytes
    if pages < 2:
        gb = lambda n: f"{n / 1e9:.2f} GB"  # noqa: E731
        left = (
            f"{gb(facts.free_bytes)} free, less {gb(reserve)} kept for activations and "
            f"graphs and {gb(state_bytes)} of recurrent-state slots ({slots}), leaves "
            f"{gb(max(budget, 0))}"
            if facts.device.startswith("cuda")
            else f"{gb(facts.free_bytes)} free"
        )
        raise ValueError(
            f"kv_capacity='auto': not enough free memory on {facts.device} for KV pages: "
            f"{left}, less than 2 pages of {page_bytes} B. Pass kv_capacity=<tokens> (sized "
            "by hand: nothing is kept back), or lower max_concurrency or "
            "num_speculative_tokens (fewer state slots)"
        )
    return int(pages)


def _host_geometry(
    host_mib: int, kv_layers: int, page_bytes: int, state_bytes: int
) -> SlabGeometry | None:
    """The geometry of a `host_mib` Host tier (None for 0), by the cache's rule
    (`plan_slab_geometry`): a nonzero budget smaller than one snapshot (image slabs + tail)
    plus one block raises ValueError naming host_cache_mib. Allocates nothing."""
    if not host_mib:
        return None
    return plan_slab_geometry(host_mib, kv_layers, page_bytes // kv_layers, state_bytes)


def resolve_speculation(opts: EngineOptions) -> Speculation:
    """The draft method, K (default DEFAULT_SPECULATIVE_TOKENS), the draft's vocabulary and its
    quantisation; ValueError naming num_speculative_tokens, draft_vocab or draft_quantization
    when given without `speculative`. A draft_vocab at or past the model's vocabulary means
    all of it."""
    if opts.speculative is None:
        for name in ("num_speculative_tokens", "draft_vocab", "draft_quantization"):
            if getattr(opts, name) is not None:
                raise ValueError(f"{name} needs speculative='mtp'")
        return Speculation()
    k = opts.num_speculative_tokens
    k = DEFAULT_SPECULATIVE_TOKENS if k is None else k
    return Speculation(opts.speculative, k, opts.draft_vocab, opts.draft_quantization)


def check_fit(opts: EngineOptions, model: Qwen35Config, on_cuda: bool) -> None:
    """The rules between the options and the model's shape that need no memory measurement:
    ValueError naming the field. `resolve` applies them; `LLM` applies them before it loads the
    weights too, so that a value the checkpoint rules out fails before a long load."""
    if not model.full_layer_ids:  # KV pages, blocks and Host slabs are cut per attention layer
        raise ValueError(
            "layer_types: the model has no full_attention layer; ninfer runs Qwen3.5 hybrids of "
            "Gated DeltaNet and full-attention layers"
        )
    if opts.max_model_len is not None:
        _check_int("max_model_len", opts.max_model_len, 2, model.max_position_embeddings)
        if opts.kv_capacity != "auto" and opts.kv_capacity < opts.max_model_len:
            _kv_short(opts.kv_capacity // PAGE_SIZE, opts.max_model_len)
    if opts.prefix_cache_file is not None and not opts.host_cache_mib:
        raise ValueError("prefix_cache_file needs a Host tier (host_cache_mib > 0)")


def _kv_short(pages: int, max_model_len: int) -> None:
    raise ValueError(
        f"kv_capacity holds {pages * PAGE_SIZE} tokens, less than max_model_len="
        f"{max_model_len}: one max-length request must fit"
    )


def _tap_settings(opts: EngineOptions, host_tier: bool, chunk: int) -> dict:
    """The `cache_tap*` fields of `CachePolicy`: the options, or their defaults (more taps
    with a Host tier to keep them; the ladder and gap scale with the prefill chunk)."""
    taps = opts.cache_taps_per_request
    ladder, gap = opts.cache_tap_ladder, opts.cache_tap_min_gap
    return {
        "cache_taps_per_request": (8 if host_tier else 2) if taps is None else taps,
        "cache_tap_ladder": max(4096, 2 * chunk) if ladder is None else ladder,
        "cache_tap_min_gap": max(1024, chunk) if gap is None else gap,
        "cache_tap_forward": FORWARD_TAP_MIN,
    }


def _memory(
    opts: EngineOptions,
    model: Qwen35Config,
    facts: DeviceFacts,
    dtypes: tuple[str, str],
    len_cfg: int,
    scratch: int,
    spec: Speculation,
) -> MemoryGeometry:
    """resolve's memory geometry: page and image sizes, the Host tier, snapshot slots and the
    KV pages (`scratch`: 1 when prefill graphs need a scratch state entry; `spec`: the MTP
    head's K/V entry in every page, the verify passes' scratch state slots)."""
    dtype, kv_dtype, c = *dtypes, opts.max_concurrency
    n_fa = len(model.full_layer_ids)
    kv_layers = n_fa + (spec.speculative == "mtp")  # the MTP head's attention layer has its own K/V
    page_bytes = model.kv_bytes_per_token(itemsize(kv_dtype)) // n_fa * kv_layers * PAGE_SIZE
    state_bytes = model.state_image_bytes(itemsize(dtype))
    host_mib = opts.host_cache_mib
    host_bytes = host_mib * MIB
    host_tier = bool(host_bytes) and bool(opts.prefix_reuse)
    host_geometry = (
        _host_geometry(host_mib, kv_layers, page_bytes, state_bytes) if host_tier else None
    )
    slots = opts.device_snapshot_slots
    slots = (c + 1 if host_tier else c + 2) if slots is None else slots
    spec_slots = c * spec.num_speculative_tokens
    states = state_bytes * (c + slots + scratch + spec_slots)
    itemised = f"{c} lanes, {slots} snapshots, {scratch} scratch, {spec_slots} speculative"
    pages = _resolve_pages(opts, facts, page_bytes, states, c, len_cfg, itemised)
    max_len = min(len_cfg, pages * PAGE_SIZE)
    if opts.max_model_len is not None and max_len < opts.max_model_len:
        _kv_short(pages, opts.max_model_len)  # "auto" KV: the memory left after the weights
    return MemoryGeometry(
        device=facts.device,
        dtype=dtype,
        kv_dtype=kv_dtype,
        max_concurrency=c,
        max_model_len=max_len,
        kv_pages=pages,
        kv_page_bytes=page_bytes,
        state_image_bytes=state_bytes,
        device_snapshot_slots=slots,
        scratch_entries=scratch,
        kv_layers=kv_layers,
        speculative_slots=spec_slots,
        host_cache_bytes=host_bytes,
        host_tier=host_tier,
        host_geometry=host_geometry,
    )


def resolve(
    opts: EngineOptions,
    model: Qwen35Config,
    facts: DeviceFacts,
    dtypes: tuple[str, str] | None = None,
) -> EngineConfig:
    """Compute every derived value (design §14.2, ADAPTATION.md defaults) once. Pure; raises
    ValueError naming the offending field where the model or the device rules a value out
    (`EngineOptions` has checked each value on its own). `dtypes`: what `resolve_dtypes` gave
    a caller that needed them before (`LLM` builds the weights before measuring free memory);
    None resolves them here."""
    on_cuda = facts.device.startswith("cuda")
    check_fit(opts, model, on_cuda)
    dtype, kv_dtype = dtypes or resolve_dtypes(opts, on_cuda)
    chunk = opts.prefill_chunk if opts.prefill_chunk is not None else (2048 if on_cuda else 256)
    len_cfg = opts.max_model_len or model.max_position_embeddings
    rates = facts.rates or (CUDA_NOMINAL if on_cuda else CPU_RATES)
    rate = rates.prefill_flops_per_s(dtype)
    solo = _solo_chunk(opts, model, chunk, on_cuda, len_cfg, rate)
    spec = resolve_speculation(opts)
    # speculation replays its own graphs (`engine.speculative`), one step at a time: no
    # prefill graphs, no step run ahead
    graphs = bool(opts.cuda_graphs) and on_cuda
    graph_tokens = min(opts.prefill_graph_tokens, chunk)
    graph_tokens = -(-graph_tokens // PAGE_SIZE) * PAGE_SIZE if graphs else 0
    graph_tokens = graph_tokens if spec.speculative is None else 0
    scratch = int(graph_tokens > 0)
    memory = _memory(opts, model, facts, (dtype, kv_dtype), len_cfg, scratch, spec)
    host_tier = memory.host_tier
    scheduling = Scheduling(
        prefill_chunk=chunk,
        solo_prefill_chunk=solo,
        concurrent_prefill=bool(opts.concurrent_prefill),
        overlap_decode=bool(opts.overlap_decode) and spec.speculative is None,
        seed=int(opts.seed),
        check_invariants=bool(opts.check_invariants),
        encoder_cache_bytes=int(opts.encoder_cache_mib) << 20,
    )
    cache = CachePolicy(
        prefix_reuse=bool(opts.prefix_reuse),
        **_tap_settings(opts, host_tier, chunk),
        pending_timeout_s=float(opts.pending_timeout_s),
        **_rate_fields(rates, rate),
    )
    ops = OpsConfig(
        compile=bool(opts.compile) and on_cuda,
        cuda_graphs=graphs,
        prefill_graph_tokens=graph_tokens,
        op_choices=op_choices(opts),
    )
    persistence = Persistence(prefix_cache_file=opts.prefix_cache_file)
    return EngineConfig(
        opts.model, opts.quantization, memory, scheduling, cache, ops, persistence, spec
    )


def _rate_fields(rates: DeviceRates, prefill_rate: float) -> dict:
    """The `CachePolicy` fields every time estimate reads (`ninfer.costs`)."""
    return {
        "prefill_flops_per_s": prefill_rate,
        "h2d_bytes_per_s": rates.h2d_bytes_per_s,
        "d2h_bytes_per_s": rates.d2h_bytes_per_s,
        "pass_overhead_s": rates.pass_overhead_s,
        "copy_latency_s": rates.copy_latency_s,
        "device_rates": rates.source,
    }
