"""The benchmark suite behind `ninfer bench`: builds the model once, runs the chosen parts.

The model is built here (a preset's random weights, the demo model, or a checkpoint) and every
engine is `LLM.from_model` over that one model, so the cached and cold TTFT engines and the
transformers baseline all see the very same weights without a second copy in memory. Presets
have no tokenizer of their own; they borrow the demo's (its ids are valid in any Qwen3.5
vocabulary) for the chat traces. Returns plain dicts; printing is the CLI's business.
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ninfer.bench import PARTS as PARTS  # re-exported
from ninfer.bench import bounds as bounds_mod
from ninfer.bench.bounds import release_memory
from ninfer.bench.model_math import param_counts
from ninfer.bench.restore import bench_restore
from ninfer.bench.throughput import bench_decode, bench_prefill, random_prompts
from ninfer.bench.ttft import bench_ttft, trace_sessions


@dataclass(slots=True)
class BenchSpec:
    parts: list[str]
    preset: str | None = None
    model: str | None = None  # checkpoint folder; None with no preset = the demo model
    prompt_tokens: list[int] = field(default_factory=lambda: [512, 2048])
    decode_tokens: int = 64
    batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 8])
    turns: int = 4
    trace: str = "chat"
    seed: int = 0
    engine: dict = field(default_factory=dict)  # LLM keyword arguments (minus model)
    profile_dir: Path | None = None
    compare_hf: bool = False
    cache_prompt_tokens: int | None = None  # None: ninfer.cache.bench's own defaults
    cache_tree_blocks: int | None = None


@dataclass(slots=True)
class Loaded:
    label: str
    model: torch.nn.Module
    tokenizer: object
    template: object
    device: torch.device
    dtype: torch.dtype
    kv_dtype: torch.dtype

    def make_llm(self, engine: dict, **overrides):
        from ninfer.llm import LLM

        kwargs = {k: v for k, v in {**engine, **overrides}.items() if k != "model"}
        return LLM.from_model(self.model, self.tokenizer, self.template, **kwargs)


def torch_dtype(name: str) -> torch.dtype:
    return torch.float8_e4m3fn if name == "fp8_e4m3" else getattr(torch, name)


def load(spec: BenchSpec) -> Loaded:
    from ninfer.chat_template import ChatTemplate
    from ninfer.config import EngineOptions, probe_device, resolve
    from ninfer.demo import DEMO_DIR, demo_config, demo_weights_seed
    from ninfer.models.config import Qwen35Config
    from ninfer.models.presets import PRESETS, build_random_model
    from ninfer.models.weights import load_model
    from ninfer.tokenizer import Tokenizer

    if spec.preset is not None:
        cfg, tok_dir, label = PRESETS[spec.preset], DEMO_DIR, f"preset {spec.preset} (random)"
    elif spec.model is not None:
        cfg, tok_dir, label = Qwen35Config.from_file(spec.model), Path(spec.model), spec.model
    else:
        cfg, tok_dir, label = demo_config(), DEMO_DIR, "demo model (random)"
    engine = {k: v for k, v in spec.engine.items() if k != "model"}
    resolved = resolve(EngineOptions(**engine), cfg, probe_device(engine.get("device", "auto")))
    device, dtype = torch.device(resolved.device), torch_dtype(resolved.dtype)
    if spec.model is not None:
        model = load_model(spec.model, dtype, device)
    else:
        seed = spec.seed if spec.preset is not None else demo_weights_seed
        model = build_random_model(cfg, dtype, device, seed=seed)
    tokenizer = Tokenizer.from_dir(tok_dir)
    template = ChatTemplate(tokenizer) if tokenizer.chat_template is not None else None
    return Loaded(label, model, tokenizer, template, device, dtype, torch_dtype(resolved.kv_dtype))


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


def run_suite(spec: BenchSpec, log=print) -> dict:
    log("building the model...")
    loaded = load(spec)
    cfg = loaded.model.config
    counts = param_counts(cfg)
    log("measuring machine bounds...")
    machine = bounds_mod.machine_bounds(loaded.device, loaded.dtype)
    results: dict = {
        "meta": {
            "model": loaded.label,
            "device": str(loaded.device),
            "dtype": str(loaded.dtype).removeprefix("torch."),
            "kv_dtype": str(loaded.kv_dtype).removeprefix("torch."),
            "params": counts.total,
            "torch": torch.__version__,
            "machine": platform.machine(),
            "engine": {k: v for k, v in spec.engine.items() if k != "model"},
        },
        "bounds": machine,
    }
    if "prefill" in spec.parts or "decode" in spec.parts:
        results.update(_throughput(spec, loaded, counts, machine, log))
        release_memory()
    if "ttft" in spec.parts:
        log(f"ttft ({spec.trace} trace, cached then cold)...")
        # Not profiled: end-to-end latency over two engine lifetimes, and a huge trace.
        sessions = trace_sessions(spec.trace, spec.seed, spec.turns, max(spec.prompt_tokens))
        results["ttft"] = bench_ttft(lambda **o: loaded.make_llm(spec.engine, **o), sessions)
    if "restore" in spec.parts:
        log("restore and tap copies...")
        part = results["restore"] = {}
        with profiled("restore", part, spec.profile_dir):
            part.update(bench_restore(cfg, loaded.device, loaded.dtype, loaded.kv_dtype,
                                      bounds=machine))  # fmt: skip
    if "cache" in spec.parts:
        log("cache bookkeeping...")
        results["cache"] = cache_bookkeeping(spec)
    return results


def _throughput(spec: BenchSpec, loaded: Loaded, counts, machine: dict, log) -> dict:
    """prefill, decode and the transformers baseline on one engine (freed on return)."""
    cfg, out = loaded.model.config, {}
    itemsize = torch.empty((), dtype=loaded.dtype).element_size()
    kv_itemsize = torch.empty((), dtype=loaded.kv_dtype).element_size()
    with loaded.make_llm(spec.engine) as llm:
        if "prefill" in spec.parts:
            log("prefill...")
            part = out["prefill"] = {}
            with profiled("prefill", part, spec.profile_dir):
                part["rows"] = bench_prefill(
                    llm, cfg, counts, spec.prompt_tokens, machine, seed=spec.seed
                )
        if "decode" in spec.parts:
            log("decode...")
            part = out["decode"] = {}
            with profiled("decode", part, spec.profile_dir):
                part["rows"] = bench_decode(
                    llm, cfg, counts, spec.prompt_tokens[0], spec.decode_tokens,
                    spec.batch_sizes, machine, itemsize, kv_itemsize, seed=spec.seed,
                )  # fmt: skip
        if spec.compare_hf:
            log("transformers baseline...")
            out["hf"] = compare_hf(spec, loaded, llm)
    return out


def cache_bookkeeping(spec: BenchSpec) -> dict:
    """ninfer.cache.bench (pure Python index hot paths) at the asked sizes; the snapshot count
    keeps its default ratio to the tree size."""
    try:
        from ninfer.cache.bench import run_cache_bench
    except ImportError as exc:
        return {"skipped": f"ninfer.cache.bench is not available ({exc})"}
    kwargs: dict = {"seed": spec.seed}
    if spec.cache_prompt_tokens is not None:
        kwargs["n_tokens"] = spec.cache_prompt_tokens
    if spec.cache_tree_blocks is not None:
        kwargs["tree_blocks"] = spec.cache_tree_blocks
        kwargs["snapshots"] = max(1, spec.cache_tree_blocks * 13 // 10_000)
    return run_cache_bench(**kwargs)


def compare_hf(spec: BenchSpec, loaded: Loaded, llm) -> dict:
    """transformers on the same weights: prefill / decode figures and greedy agreement."""
    import random

    from ninfer import SamplingParams
    from ninfer.bench.hf import bench_hf, build_hf_model, greedy_tokens

    cfg = loaded.model.config
    hf = build_hf_model(cfg, loaded.model.state_dict(), loaded.dtype, loaded.device)
    rng = random.Random(spec.seed + 1)
    prompts = [p["prompt_token_ids"] for t in spec.prompt_tokens
               for p in random_prompts(rng, cfg.vocab_size, 1, t)]  # fmt: skip
    out = bench_hf(hf, prompts, spec.decode_tokens, spec.batch_sizes, loaded.device)
    n = min(16, spec.decode_tokens)
    ours = llm.generate(
        {"prompt_token_ids": prompts[0]},
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
    )[0].token_ids
    theirs = greedy_tokens(hf, prompts[0], n, loaded.device)
    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), n)
    out["greedy"] = {"tokens": n, "agreeing_prefix": agree, "ninfer": ours, "hf": theirs}
    return out
