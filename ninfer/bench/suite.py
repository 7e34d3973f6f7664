"""The benchmark suite behind `ninfer bench`: builds the model once, runs the chosen parts.

The model is built here (a preset's random weights, the demo model, or a checkpoint) and every
engine is `LLM.from_model` over that one model, so the cached and cold TTFT engines and the
transformers baseline all see the very same weights without a second copy in memory. Presets
have no tokenizer of their own; they borrow the demo's (its ids are valid in any Qwen3.5
vocabulary) for the chat traces. Returns plain dicts; printing is the CLI's business.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ninfer import probe
from ninfer.bench import PARTS as PARTS  # re-exported
from ninfer.bench.model_math import ParamCounts, matmul_params_read, param_counts
from ninfer.bench.profiling import profiled
from ninfer.bench.restore import bench_restore
from ninfer.bench.resume import bench_resume
from ninfer.bench.reuse import bench_reuse
from ninfer.bench.throughput import bench_decode, bench_prefill, greedy, random_prompts
from ninfer.bench.ttft import bench_ttft, trace_sessions
from ninfer.dtypes import torch_dtype
from ninfer.probe import release_memory


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
    hf_max_prompt: int = 8192  # transformers runs only the prompt lengths up to this
    cache_prompt_tokens: int | None = None  # None: ninfer.bench.cache_index's own defaults
    cache_tree_blocks: int | None = None
    resume_new_tokens: int = 64
    resume_histories: list[int] | None = None  # None: prompt_tokens
    # decode with speculation: a controlled draft of this per-position acceptance (None: the
    # model's own MTP head)
    draft_acceptance: float | None = None
    # with quantization: prefill and decode once more on the same shape unquantized (the
    # model's dtype), printed beside (`baseline`)
    baseline: bool = True


@dataclass(slots=True)
class Loaded:
    label: str
    model: torch.nn.Module | None  # None once dropped (the unquantized baseline's turn)
    tokenizer: object
    template: object
    device: torch.device
    dtype: torch.dtype
    kv_dtype: torch.dtype

    def make_llm(self, engine: dict, **overrides):
        from ninfer.llm import LLM

        kwargs = {k: v for k, v in {**engine, **overrides}.items() if k != "model"}
        return LLM.from_model(self.model, self.tokenizer, self.template, **kwargs)


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
    memory = resolved.memory
    device, dtype = torch.device(memory.device), torch_dtype(memory.dtype)
    quantization = engine.get("quantization")
    if quantization is not None:
        label += f", {quantization} at load"
    mtp = engine.get("speculative") == "mtp"  # the draft head too
    if spec.model is not None:
        model = load_model(spec.model, dtype, device, quantization, mtp=mtp)
    else:
        seed = spec.seed if spec.preset is not None else demo_weights_seed
        model = build_random_model(
            cfg, dtype, device, seed=seed, quantization=quantization, mtp=mtp
        )
    tokenizer = Tokenizer.from_dir(tok_dir)
    template = ChatTemplate(tokenizer) if tokenizer.chat_template is not None else None
    return Loaded(label, model, tokenizer, template, device, dtype, torch_dtype(memory.kv_dtype))


def run_suite(spec: BenchSpec, log=print) -> dict:
    log("building the model...")
    loaded = load(spec)
    cfg = loaded.model.config
    counts = loaded_param_counts(loaded)
    log("measuring machine bounds...")
    machine = probe.machine_bounds(loaded.device, loaded.dtype)
    results: dict = {"meta": _meta(spec, loaded, counts.total), "bounds": machine}
    if "prefill" in spec.parts or "decode" in spec.parts:
        results.update(_throughput(spec, loaded, counts, machine, log))
        release_memory()
    if "ttft" in spec.parts:
        log(f"ttft ({spec.trace} trace, cached then cold)...")
        # Not profiled: end-to-end latency over two engine lifetimes, and a huge trace.
        sessions = trace_sessions(spec.trace, spec.seed, spec.turns, max(spec.prompt_tokens))
        results["ttft"] = bench_ttft(lambda **o: loaded.make_llm(spec.engine, **o), sessions)
    if "resume" in spec.parts:
        histories = spec.resume_histories or spec.prompt_tokens
        log(f"resume from the Host tier ({histories} history tokens; last round profiled)...")
        results["resume"] = _resume(spec, loaded, histories, machine)
    if "restore" in spec.parts:
        log("restore and tap copies...")
        part = results["restore"] = {}
        with profiled("restore", part, spec.profile_dir):
            part.update(bench_restore(cfg, loaded.device, loaded.dtype, loaded.kv_dtype,
                                      bounds=machine))  # fmt: skip
    if "cache" in spec.parts:
        log("cache bookkeeping...")
        results["cache"] = cache_bookkeeping(spec)
    if "reuse" in spec.parts:
        log("reuse on seeded traces (reused vs theoretical prefix tokens)...")
        scale = max(spec.prompt_tokens) / 2048  # traces sized by the largest prompt asked
        results["reuse"] = bench_reuse(
            lambda: loaded.make_llm(spec.engine), cfg.vocab_size, seed=spec.seed, scale=scale
        )
    quantized = spec.engine.get("quantization") is not None
    if quantized and spec.baseline and ("prefill" in spec.parts or "decode" in spec.parts):
        loaded.model = None  # one model in memory at a time (a 27B: 27 GB FP8, 54 GB bf16)
        release_memory()
        results["baseline"] = _baseline(spec, machine, log)
        _baseline_ratios(results)
    return results


def _baseline(spec: BenchSpec, machine: dict, log) -> dict:
    """prefill and decode of the same shape, weights and settings without quantization."""
    log("the same without quantization (the baseline)...")
    plain = replace(
        spec, engine={**spec.engine, "quantization": None}, profile_dir=None, compare_hf=False
    )
    loaded = load(plain)
    out = {"meta": _meta(plain, loaded, loaded_param_counts(loaded).total)}
    out.update(_throughput(plain, loaded, loaded_param_counts(loaded), machine, log))
    loaded.model = None
    release_memory()
    return out


def _baseline_ratios(results: dict) -> None:
    """Per prompt length and batch size that both ran: quantized over baseline (prefill: the
    baseline's seconds over the quantized's; decode: steady tok/s over the baseline's)."""
    base = results["baseline"]
    ours = {x["prompt_tokens"]: x for x in results.get("prefill", {}).get("rows", [])}
    for x in base.get("prefill", {}).get("rows", []):
        mine = ours.get(x["prompt_tokens"])
        x["quantized_speedup"] = x["seconds"] / mine["seconds"] if mine else None
    ours = {x["batch"]: x for x in results.get("decode", {}).get("rows", [])}
    for x in base.get("decode", {}).get("rows", []):
        mine = (ours.get(x["batch"]) or {}).get("steady_tokens_per_s")
        theirs = x.get("steady_tokens_per_s")
        x["quantized_speedup"] = mine / theirs if mine and theirs else None


def loaded_param_counts(loaded: Loaded) -> ParamCounts:
    """The model's parameter counts; a quantised model's carry the bytes it reads per weight."""
    cfg = loaded.model.config
    counts = param_counts(cfg)
    if loaded.model.quant_scheme is not None:  # the decode bound reads FP8 bytes
        from ninfer.models.quantize import weight_bytes

        per_token = weight_bytes(loaded.model).per_token
        counts = replace(counts, weight_itemsize=per_token / matmul_params_read(cfg, counts))
    return counts


def _meta(spec: BenchSpec, loaded: Loaded, params: int) -> dict:
    """What the figures were measured on: model, device, dtypes, versions, engine options."""
    return {
        "model": loaded.label,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "kv_dtype": str(loaded.kv_dtype).removeprefix("torch."),
        "params": params,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "engine": {k: v for k, v in spec.engine.items() if k != "model"},
    }


def _resume(spec: BenchSpec, loaded: Loaded, histories: list[int], machine: dict) -> dict:
    """bench_resume over `histories` on fresh engines (its last round profiled)."""
    return bench_resume(
        lambda **o: loaded.make_llm(spec.engine, **o), loaded.model.config, histories, machine,
        new=spec.resume_new_tokens, seed=spec.seed, profile_dir=spec.profile_dir,
        itemsize=loaded.dtype.itemsize,
        kv_itemsize=loaded.kv_dtype.itemsize,
    )  # fmt: skip


def _throughput(spec: BenchSpec, loaded: Loaded, counts, machine: dict, log) -> dict:
    """prefill, decode and the transformers baseline on one engine (freed on return)."""
    cfg, out = loaded.model.config, {}
    itemsize = loaded.dtype.itemsize
    kv_itemsize = loaded.kv_dtype.itemsize
    with loaded.make_llm(spec.engine) as llm:
        if "prefill" in spec.parts:
            log("prefill...")
            part = out["prefill"] = {}
            part["rows"] = bench_prefill(llm, cfg, spec.prompt_tokens, machine, seed=spec.seed)
            with profiled("prefill", part, spec.profile_dir):  # after: figures stay unprofiled
                if spec.profile_dir is not None:
                    _one_request(llm, cfg, 1, min(spec.prompt_tokens), 1, spec.seed)
        if "decode" in spec.parts:
            log("decode...")
            part = out["decode"] = {}
            part["rows"] = bench_decode(
                llm, cfg, counts, spec.prompt_tokens[0], spec.decode_tokens,
                spec.batch_sizes, machine, itemsize, kv_itemsize, seed=spec.seed,
                draft_acceptance=spec.draft_acceptance,
            )  # fmt: skip
            with profiled("decode", part, spec.profile_dir):  # a few steps, largest batch
                if spec.profile_dir is not None:
                    _one_request(llm, cfg, max(spec.batch_sizes), 64, 8, spec.seed)
        if spec.compare_hf:
            prompts = hf_prompts(spec, cfg)
            n = min(16, spec.decode_tokens)
            ours = llm.generate({"prompt_token_ids": prompts[0]}, greedy(n))[0].token_ids
    if spec.compare_hf:
        release_memory()  # the engine's pools go before transformers takes its share
        log("transformers baseline...")
        out["hf"] = compare_hf(spec, loaded, prompts, ours)
        _speedups(out)
    return out


def _one_request(llm, cfg, batch: int, prompt_tokens: int, max_tokens: int, seed: int) -> None:
    """`batch` fresh random prompts through generate: what a profile records (not timed)."""
    import random

    rng = random.Random(seed + 7)
    llm.generate(random_prompts(rng, cfg.vocab_size, batch, prompt_tokens), greedy(max_tokens))


def _speedups(out: dict) -> None:
    """ninfer over transformers per prompt length / batch size that both ran."""
    hf = out["hf"]
    ours = {x["prompt_tokens"]: x for x in out.get("prefill", {}).get("rows", [])}
    for x in hf["prefill"]:
        mine = ours.get(x["prompt_tokens"])
        x["ninfer_speedup"] = mine["tokens_per_s"] / x["tokens_per_s"] if mine else None
    # transformers' decode figure is steps after a prefill: against ninfer's steady state
    ours = {x["batch"]: x for x in out.get("decode", {}).get("rows", [])}
    for x in hf["decode"]:
        mine = (ours.get(x["batch"]) or {}).get("steady_tokens_per_s")
        x["ninfer_speedup"] = mine / x["tokens_per_s"] if mine else None


def cache_bookkeeping(spec: BenchSpec) -> dict:
    """ninfer.bench.cache_index (pure Python index hot paths) at the asked sizes; the snapshot count
    keeps its default ratio to the tree size."""
    try:
        from ninfer.bench.cache_index import run_cache_bench
    except ImportError as exc:
        return {"skipped": f"ninfer.bench.cache_index is not available ({exc})"}
    kwargs: dict = {"seed": spec.seed}
    if spec.cache_prompt_tokens is not None:
        kwargs["n_tokens"] = spec.cache_prompt_tokens
    if spec.cache_tree_blocks is not None:
        kwargs["tree_blocks"] = spec.cache_tree_blocks
        kwargs["snapshots"] = max(1, spec.cache_tree_blocks * 13 // 10_000)
    return run_cache_bench(**kwargs)


def hf_prompts(spec: BenchSpec, cfg) -> list[list[int]]:
    """The transformers baseline's prompts: one per prompt length up to hf_max_prompt."""
    import random

    rng = random.Random(spec.seed + 1)
    lengths = [t for t in spec.prompt_tokens if t <= spec.hf_max_prompt]
    lengths = lengths or [min(spec.prompt_tokens)]
    return [p["prompt_token_ids"] for t in lengths
            for p in random_prompts(rng, cfg.vocab_size, 1, t)]  # fmt: skip


def compare_hf(spec: BenchSpec, loaded: Loaded, prompts: list[list[int]], ours: list[int]) -> dict:
    """transformers on the same weights over `prompts` (hf_prompts): prefill / decode figures
    and greedy agreement with `ours`, ninfer's greedy tokens on prompts[0]. Runs after the
    engine closed: its pools would leave no room."""
    from ninfer.bench.hf import bench_hf, build_hf_model, greedy_tokens
    from ninfer.models.quantize import dense_state_dict

    cfg = loaded.model.config
    # an FP8 model's transformers twin holds the dequantised weights
    hf = build_hf_model(cfg, dense_state_dict(loaded.model, loaded.dtype), loaded.dtype,
                        loaded.device)  # fmt: skip
    try:
        out = bench_hf(hf, prompts, spec.decode_tokens, spec.batch_sizes, loaded.device)
        n = len(ours)
        theirs = greedy_tokens(hf, prompts[0], n, loaded.device)
    finally:
        del hf
        release_memory()
    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), n)
    out["greedy"] = {"tokens": n, "agreeing_prefix": agree, "ninfer": ours, "hf": theirs}
    return out
