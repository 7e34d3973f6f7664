"""End-to-end engine figures on one GPU: decode tokens/s (CUDA-graph replay through the runner,
sampling and the per-step host work included) beside the HBM bound, prefill tokens/s and MFU,
the state-image tap copy, and a profile of one decode step.

Self-contained: each preset of `ninfer.models.presets` is built with random bf16 weights on the
GPU (one at a time, freed after), over pools sized for the run, and driven through
`ninfer.engine.executor.runner.Runner` directly (warm-up + graph capture as the engine does it).

    decode bound  = (weights read per step + KV read + GDN state read and written) / copy BW
                    weights: all matrices except an untied embedding (only bs rows read); MoE:
                    shared part + the expected distinct experts touched by bs * top_k uniform
                    picks, E * (1 - (1 - k/E)^bs), per layer
    prefill MFU   = `ninfer.bench.model_math.prefill_flops` (matmul weights but the LM head per
                    token, the LM head once, causal attention, the GDN recurrence) / t
                    / measured bf16 matmul peak

The transformers baseline is `ninfer bench --compare-hf` (same weights, same run).

Usage (device machine, repo root, PYTHONPATH with the carried wheels):
    python3 tools/device/bench_engine.py [--models 0.8B,4B,9B,27B,35B-A3B] [--batches 1,4,8]
        [--prefill 9B:8192,27B:8192] [--compile-check 0.8B] [--profile DIR]
        [--no-fuse] [--no-skinny] [--profile-prefill 9B:1024]
        [--out bench_engine.json]
(--no-fuse keeps the projections separate, --no-skinny keeps every linear on cuBLAS: to measure
what `fuse_projections` and the Triton decode GEMM gain.)
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import math
import os
import time
import traceback
from dataclasses import replace

import torch

from ninfer.bench.model_math import prefill_flops
from ninfer.engine.executor.runner import Row, Runner
from ninfer.engine.executor.warmup import warm_up
from ninfer.forward import ModelCache
from ninfer.models.presets import PRESETS, build_random_model
from ninfer.ops.choices import GATHER_MIN_ROWS, OpChoices
from ninfer.page import PAGE_SIZE
from ninfer.probe import copy_bandwidth, matmul_peak
from ninfer.request import SamplingParams
from ninfer.sampling import SampleResult

DEV = torch.device("cuda")
BF16 = torch.bfloat16
GREEDY = SamplingParams(temperature=0.0)
RESULTS: list[dict] = []
STEP_SPAN = "ninfer.step"  # the host span of a profiled step: where `device_idle` counts from


def emit(**row) -> None:
    RESULTS.append(row)
    print(json.dumps(row), flush=True)


def greedy_sampler(logits, params, generators):
    return SampleResult(logits.argmax(-1), None, len(params))


def cuda_ms(fn, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def ceilings() -> tuple[float, float]:
    """(copy bandwidth B/s counting read + write, bf16 matmul FLOP/s), measured here as
    `ninfer bench` measures them (`ninfer.probe`: best event-timed batch)."""
    bw, flops = copy_bandwidth(DEV), matmul_peak(DEV, BF16)
    emit(kind="ceiling", copy_TBps=round(bw / 1e12, 3), bf16_matmul_TFLOPs=round(flops / 1e12, 1))
    return bw, flops


def make_cache(cfg, slots: int, pages: int) -> ModelCache:
    n_gdn = len(cfg.gdn_layer_ids)
    kv = [
        torch.zeros(pages, 2, PAGE_SIZE, cfg.num_key_value_heads, cfg.head_dim, dtype=BF16,
                    device=DEV)
        for _ in cfg.full_layer_ids
    ]  # fmt: skip
    conv = torch.zeros(
        slots, n_gdn, cfg.conv_dim, cfg.linear_conv_kernel_dim - 1, dtype=BF16, device=DEV
    )
    ssm = torch.zeros(
        slots, n_gdn, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
        cfg.linear_value_head_dim, device=DEV,
    )  # fmt: skip
    return ModelCache(kv=kv, conv=conv, ssm=ssm)


def weight_bytes(model, bs: int) -> float:
    """Bytes of weights read by one decode step of bs rows."""
    cfg = model.config
    read = 0.0
    emb = model.model.embed_tokens.weight
    for name, p in model.named_parameters():
        n = p.numel() * p.element_size()
        if "experts." in name and "shared_expert" not in name:
            e, k = cfg.num_experts, cfg.num_experts_per_tok
            read += n * (1 - (1 - k / e) ** bs)
        elif p is emb and not cfg.tie_word_embeddings:
            read += bs * p.shape[1] * p.element_size()
        else:
            read += n
    return read


def state_image_bytes(cache: ModelCache) -> int:
    return (cache.ssm[0].numel() * 4) + cache.conv[0].numel() * cache.conv.element_size()


def kv_token_bytes(cfg) -> int:
    return len(cfg.full_layer_ids) * 2 * cfg.num_key_value_heads * cfg.head_dim * 2


def build(name: str, compile: bool, args, slots: int, pages: int, max_pages_row: int, tune: int):
    from ninfer.ops.cuda import CudaOps

    cfg = PRESETS[name]
    t0 = time.perf_counter()
    model = build_random_model(cfg, BF16, DEV, seed=0)
    if args.fuse:  # as the engine's warm-up (`prepare_runner`) does
        model.fuse_projections()
    cache = make_cache(cfg, slots, pages)
    # --conv-tile e.g. "16,256,4": rows, channels, warps (`conv.Tile`)
    tile = tuple(int(v) for v in args.conv_tile.split(",")) if args.conv_tile else None
    choices = OpChoices(conv_tile=tile)
    ops = CudaOps(DEV, compile=compile, skinny=args.skinny, choices=choices)
    runner = Runner(model, ops, cache, DEV, greedy_sampler)
    t1 = time.perf_counter()
    scratch = [pages - 3, pages - 2, pages - 1]
    warm = warm_up(runner, scratch, list(range(8)), True, max_pages_row, tune_tokens=tune)
    emit(kind="startup", model=name, compile=compile, conv_tile=list(ops.conv_tile),
         tune_tokens=tune,
         build_s=round(t1 - t0, 2), **{k: round(v, 2) for k, v in warm.items()})  # fmt: skip
    if args.skinny:  # which decode linears the race gave to the Triton kernel
        race = [
            [m, n, k, round(c * 1e3, 1), round(t * 1e3, 1), ops.linear.choice[(m, n, k, d)]]
            for (m, n, k, d), (c, t) in sorted(ops.linear.timings.items(), key=str)
        ]
        emit(kind="linear_race", model=name, rows_N_K_cublas_us_skinny_us_chosen=race)
    return model, cache, runner


def variant(runner, made: dict, compile: bool, args, **changes):
    """A runner over `runner`'s model and pools whose op set has `changes` made to its choices
    (an op set's choices are fixed when it is built): `runner` itself when they change nothing,
    else one eager runner per choices (no graphs; the first pass of each benchmark warms it),
    kept in `made`. For the prefill benchmarks that interleave choices."""
    from ninfer.ops.cuda import CudaOps

    choices = replace(runner.ops.choices, **changes)
    if choices == runner.ops.choices:
        return runner
    if choices not in made:
        ops = CudaOps(DEV, compile=compile, skinny=args.skinny, choices=choices)
        made[choices] = Runner(runner.model, ops, runner.cache, DEV, greedy_sampler)
    return made[choices]


def decode_rows(bs: int, ctx: int, pages_per_row: int) -> list[Row]:
    return [
        Row([11 + i], ctx, i, list(range(i * pages_per_row, (i + 1) * pages_per_row)), GREEDY)
        for i in range(bs)
    ]


def bench_decode(name, model, cache, runner, batches, ctx, steps, bw, ppr, tag="") -> None:
    """Steady decode steps through the runner, twice: each step's tokens read before the next
    launch (plain), and overlapped as the engine runs them (the next step launched first, its
    input ids fed on the device from the step in flight)."""
    cfg = model.config
    for bs in batches:
        for overlap in (False, True):
            rows = decode_rows(bs, ctx, ppr)
            dt = _decode_steps(runner, rows, steps, overlap)
            mean_ctx = ctx + 3 + steps / 2
            wb = weight_bytes(model, bs)
            kvb = bs * mean_ctx * kv_token_bytes(cfg)
            stb = bs * 2 * state_image_bytes(cache)
            bound = (wb + kvb + stb) / bw
            emit(kind="decode", model=name, bs=bs, ctx=ctx, tag=tag, overlap=overlap,
                 step_ms=round(dt * 1e3, 3), tok_s=round(bs / dt, 1),
                 bound_ms=round(bound * 1e3, 3), bound_tok_s=round(bs / bound, 1),
                 of_bound=round(bound / dt, 3),
                 GB_per_step=round((wb + kvb + stb) / 1e9, 3))  # fmt: skip


def _decode_steps(runner, rows, steps: int, overlap: bool) -> float:
    """Seconds per step over `steps` graph-replayed decode steps (after 3 warm ones)."""

    def plain():
        out = runner.step(rows)
        for r, t in zip(rows, out.tokens, strict=True):
            r.token_ids, r.ctx_len = [t], r.ctx_len + 1

    for _ in range(3):
        plain()
    replays = runner.graphs.replays
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if overlap:
        flight = runner.launch(rows)
        for _ in range(steps - 1):
            for r in rows:
                r.ctx_len += 1
            nxt = runner.launch(rows, flight.feed(list(range(len(rows)))))
            flight.result()
            flight = nxt
        flight.result()
    else:
        for _ in range(steps):
            plain()
    dt = (time.perf_counter() - t0) / steps
    assert runner.graphs.replays - replays == steps, "decode did not replay graphs"
    return dt


def bench_prefill(name, model, runner, lengths, peak) -> None:
    cfg = model.config
    for length in lengths:
        rows = [Row(list(range(5, 5 + length)), 0, 0, list(range(-(-length // PAGE_SIZE))),
                    GREEDY)]  # fmt: skip
        runner.step(rows)  # first: autotune for this length
        torch.cuda.synchronize()
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            runner.step(rows)
            times.append(time.perf_counter() - t0)
        dt = min(times)
        flops = prefill_flops(cfg, length)  # the LM head for the last token only
        emit(kind="prefill", model=name, tokens=length, s=round(dt, 4),
             tok_s=round(length / dt, 1), TFLOPs=round(flops / dt / 1e12, 1),
             mfu=round(flops / dt / peak, 3))  # fmt: skip


def chunk_rows(length: int, chunk: int) -> list[list[Row]]:
    """A cold prompt of `length` tokens as the engine feeds it with `--prefill-chunk` chunk:
    one single-row step per chunk, each continuing the one before, the last sampling."""
    tokens = list(range(5, 5 + length))
    steps = []
    for s in range(0, length, chunk):
        e = min(length, s + chunk)
        pages = list(range(-(-e // PAGE_SIZE)))
        steps.append([Row(tokens[s:e], s, 0, pages, GREEDY if e == length else None)])
    return steps


def bench_chunked(name, model, runner, length: int, chunks: list[int], peak, gather) -> None:
    """A cold prompt fed in chunks (the engine's default path for long prompts): seconds and
    MFU per chunk size, and, profiled, the device time by kernel group over all its passes.
    `gather`: "on" (later chunks' attention on the gathered path when it pays) or "off"."""
    from torch.profiler import ProfilerActivity, profile, record_function

    flops = prefill_flops(model.config, length)
    for chunk in chunks:
        steps = chunk_rows(length, chunk)

        def run(steps=steps) -> None:
            for rows in steps:
                runner.step(rows)
            torch.cuda.synchronize()

        run()
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        dt = min(times)
        activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with profile(activities=activities) as prof, record_function(STEP_SPAN):
            run()
        groups: dict[str, float] = {}
        for e in prof.key_averages():
            if e.self_device_time_total > 0 and is_kernel(e):
                g = kernel_group(e.key)
                groups[g] = groups.get(g, 0.0) + e.self_device_time_total / 1e3
        emit(kind="prefill_chunked", model=name, tokens=length, chunk=chunk, gather=gather,
             passes=len(steps),
             s=round(dt, 4), mfu=round(flops / dt / peak, 3),
             kernel_ms=round(sum(groups.values()), 2),
             group_ms={g: round(v, 2) for g, v in sorted(groups.items())},
             idle=device_idle(prof.events()))  # fmt: skip


def bench_tap(name, cache, bw) -> None:
    img = state_image_bytes(cache)

    def tap():
        cache.ssm[7].copy_(cache.ssm[6])
        cache.conv[7].copy_(cache.conv[6])

    ms = cuda_ms(tap, reps=20)
    bound = 2 * img / bw * 1e3
    emit(kind="tap", model=name, image_MiB=round(img / 2**20, 1), ms=round(ms, 4),
         bound_ms=round(bound, 4), of_bound=round(bound / ms, 3))  # fmt: skip


def profile_decode(name, runner, ppr, out_dir: str, bs: int) -> None:
    """Chrome trace of one graph-replayed decode step: host syncs inside the forward? And
    where the step's device time goes (top kernels by self device time)."""
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile, record_function

    rows = decode_rows(bs, 1024, ppr)
    runner.step(rows)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("ninfer.decode_forward"):
            logits = runner.forward(rows)
        with record_function("ninfer.sample"):
            runner.sampler(logits, [GREEDY] * bs, [None] * bs)
        torch.cuda.synchronize()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    trace = f"{out_dir}/decode_{name}_bs{bs}.json"
    prof.export_chrome_trace(trace)
    events = prof.events()
    from torch.autograd import DeviceType

    # the host side of each span (the profiler also records each on the device's timeline,
    # where it ends with the GPU's work, after the step's own closing synchronize)
    spans = {
        e.name: e.time_range
        for e in events
        if e.name.startswith("ninfer.") and e.device_type == DeviceType.CPU
    }
    sync_names = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")

    def syncs(span):
        return sorted(
            {
                e.name
                for e in events
                if (e.name in sync_names or e.name == "cudaMemcpy")
                and span.start <= e.time_range.start <= span.end
            }
        )

    d2h = sorted({e.name for e in events if "DtoH" in e.name or "Device -> P" in e.name})
    kernels = sorted(
        # record_function spans carry their children's device time: kernels only
        (
            e
            for e in prof.key_averages()
            if e.self_device_time_total > 0 and not e.key.startswith("ninfer.")
        ),
        key=lambda e: e.self_device_time_total,
        reverse=True,
    )
    device_us = sum(e.self_device_time_total for e in kernels)
    top = [[e.key[:70], round(e.self_device_time_total, 1), e.count] for e in kernels[:12]]
    emit(kind="profile", model=name, bs=bs, trace=trace,
         syncs_in_forward=syncs(spans["ninfer.decode_forward"]),
         syncs_in_sample=syncs(spans["ninfer.sample"]), d2h_copies_in_step=d2h,
         forward_cpu_us=round(spans["ninfer.decode_forward"].elapsed_us(), 1),
         device_us=round(device_us, 1), top_kernels_us=top)  # fmt: skip


def profile_prefill(name, runner, length: int, out_dir: str | None = None) -> None:
    """Where the host time of one eager prefill pass goes: wall time against kernel time, the
    number of CPU ops and kernel launches, and the top ops by self CPU time; with `out_dir`,
    the pass's Chrome trace (gzipped) too, to line the GPU's gaps up with the host's ops."""
    from torch.profiler import ProfilerActivity, profile, record_function

    rows = [Row(list(range(5, 5 + length)), 0, 0, list(range(-(-length // PAGE_SIZE))), GREEDY)]
    runner.step(rows)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    runner.step(rows)
    wall = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function(STEP_SPAN):
            runner.step(rows)
        torch.cuda.synchronize()
    trace = None
    if out_dir:
        trace = f"{out_dir}/prefill_{name}_{length}.json"
        prof.export_chrome_trace(trace)
        with open(trace, "rb") as f, gzip.open(trace + ".gz", "wb") as g:
            g.write(f.read())
        os.remove(trace)
        trace += ".gz"
    stats = prof.key_averages()
    launches = sum(e.count for e in stats if e.key in ("cudaLaunchKernel", "cuLaunchKernel"))
    launches += sum(e.count for e in stats if e.key == "cudaLaunchKernelExC")
    cpu = sorted(stats, key=lambda e: e.self_cpu_time_total, reverse=True)
    top = [[e.key[:60], round(e.self_cpu_time_total), e.count] for e in cpu[:25]]
    dev = sorted(
        (e for e in stats if e.self_device_time_total > 0 and is_kernel(e)),
        key=lambda e: e.self_device_time_total, reverse=True,
    )  # fmt: skip
    kernel_us = sum(e.self_device_time_total for e in dev)
    top_dev = [[e.key[:90], round(e.self_device_time_total), e.count] for e in dev[:40]]
    groups: dict[str, float] = {}
    for e in dev:
        g = kernel_group(e.key)
        groups[g] = groups.get(g, 0.0) + e.self_device_time_total / 1e3
    emit(kind="profile_prefill", model=name, tokens=length, trace=trace,
         wall_ms=round(wall * 1e3, 2),
         kernel_ms=round(kernel_us / 1e3, 2), cpu_ops=sum(e.count for e in stats),
         launches=launches, group_ms={g: round(v, 2) for g, v in sorted(groups.items())},
         idle=device_idle(prof.events()), top_cpu_us=top, top_device_us=top_dev)  # fmt: skip


def device_idle(events) -> dict:
    """Where the GPU waits during a profiled step: from the start of the step's host span
    (`STEP_SPAN`; else the first CPU op, which includes the profiler's own start-up) to the
    first device activity (lead), between device activities (the gaps, the largest ten with
    their offset from the first activity and the kernel that starts after each), after the last
    one (tail)."""
    from torch.autograd import DeviceType

    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if e.device_type == DeviceType.CUDA and not e.name.startswith("ninfer.")
    )  # (not the device-side copy of a span: it covers the gaps)
    cpu = [e.time_range for e in events if e.device_type == DeviceType.CPU]
    if not spans or not cpu:
        return {}
    step = [e.time_range for e in events if e.device_type == DeviceType.CPU and e.name == STEP_SPAN]
    origin = step[0].start if step else min(r.start for r in cpu)
    first, end, gaps = spans[0][0], spans[0][1], []
    for start, stop, kname in spans[1:]:
        if start > end:
            gaps.append((start - end, end - first, kname[:60]))
        end = max(end, stop)
    top = sorted(gaps, reverse=True)[:10]
    return {
        "lead_ms": round((first - origin) / 1e3, 3),
        "gaps_ms": round(sum(g for g, _, _ in gaps) / 1e3, 3),
        "tail_ms": round((max(r.end for r in cpu) - end) / 1e3, 3),
        "top_gaps_us_at_ms": [[round(g, 1), round(at / 1e3, 2), k] for g, at, k in top],
    }


KERNEL_GROUPS = (  # (group, substrings of a kernel name), first match wins
    ("attention", ("flashinfer", "PrefillWith", "BatchDecode", "FlashAttn", "fmha")),
    ("gemm", ("nvjet", "gemm", "sm90_xmma", "cutlass", "cublas")),
    ("fla_state_pass", ("fwd_kernel_h",)),
    ("fla_output", ("chunk_fwd_kernel_o",)),
    ("fla_intra", ("intra", "kkt", "solve_tril", "recompute_w_u", "wy")),
    ("fla_cumsum", ("cumsum",)),
    ("l2norm", ("l2norm",)),
    ("conv", ("_conv_",)),
    ("silu_mul", ("_silu_mul",)),
    ("write_kv", ("_write_kv",)),
    ("gather_states", ("_gather_states",)),
    ("norm_rope", ("_norm_rope",)),
    ("output_gate", ("_gate_kernel",)),
    ("compiled_glue", ("triton_",)),  # inductor's kernels (norms, gates): before "copies"
    ("copies", ("copy", "Copy", "elementwise_kernel", "index", "scatter", "gather")),
)


def is_kernel(event) -> bool:
    """A device kernel's entry (not a CPU op or span that carries its children's time: a
    `record_function` span also has a device-side copy, which must not count as a kernel)."""
    if event.key.startswith(("aten::", "ninfer.", "Torch-Compiled", "CompiledFunction")):
        return False
    kind = getattr(event, "device_type", None)
    return True if kind is None else str(kind).endswith("CUDA")


def kernel_group(name: str) -> str:
    for group, keys in KERNEL_GROUPS:
        if any(k in name for k in keys):
            return group
    return "other"


def run_model(name, compile, args, batches, prefill, bw, peak, profiled) -> bool:
    ppr = -(-(args.ctx + args.steps + 8) // PAGE_SIZE)
    longest = max(prefill.get(name, [0]) + args.profile_prefill.get(name, [0]))
    longest = max([longest] + [n for n, _ in args.chunked.get(name, [])])
    passes = prefill.get(name, []) + args.profile_prefill.get(name, [])
    passes += [c for _, chunks in args.chunked.get(name, []) for c in chunks]
    tune = args.tune_tokens if args.tune_tokens >= 0 else max(passes, default=0)
    pages = max(8 * ppr, -(-longest // PAGE_SIZE)) + 3
    max_row = max(ppr, -(-longest // PAGE_SIZE))
    tag = ("compile" if compile else "eager-dense") + ("" if args.fuse else "-unfused")
    tag += "" if args.skinny else "-cublas"
    model, cache, runner = build(name, compile, args, 8, pages, max_row, tune)
    try:
        bench_decode(name, model, cache, runner, batches, args.ctx, args.steps, bw, ppr, tag)
        if compile == args.compile:
            made: dict[OpChoices, Runner] = {}
            if name in prefill:
                bench_prefill(name, model, runner, prefill[name], peak)
            for length, chunks in args.chunked.get(name, []):
                for gather in args.gather.split(","):  # e.g. on,off,on: interleaved
                    rows = GATHER_MIN_ROWS if gather == "on" else math.inf
                    alt = variant(runner, made, compile, args, gather_min_rows=rows)
                    bench_chunked(name, model, alt, length, chunks, peak, gather)
            made.clear()
            for length in args.profile_prefill.get(name, []):
                profile_prefill(name, runner, length, args.profile)
            if name == args.tap:
                bench_tap(name, cache, bw)
            if args.profile and not profiled:
                for bs in batches:
                    profile_decode(name, runner, ppr, args.profile, bs)
                profiled = True
    finally:
        runner.graphs = None
    return profiled


def model_lengths(spec: str) -> dict[str, list[int]]:
    """'9B:1024,9B:8192,27B:8192' -> {'9B': [1024, 8192], '27B': [8192]}."""
    out: dict[str, list[int]] = {}
    for item in filter(None, spec.split(",")):
        m, n = item.split(":")
        out.setdefault(m, []).append(int(n))
    return out


def chunked_specs(spec: str) -> dict[str, list[tuple[int, list[int]]]]:
    """'9B:32768:2048/8192' -> {'9B': [(32768, [2048, 8192])]}."""
    out: dict[str, list[tuple[int, list[int]]]] = {}
    for item in filter(None, spec.split(",")):
        m, n, chunks = item.split(":")
        out.setdefault(m, []).append((int(n), [int(c) for c in chunks.split("/")]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="0.8B,4B,9B,27B,35B-A3B")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefill", default="9B:8192,27B:8192")
    ap.add_argument("--compile", action="store_true", help="torch.compile norms / RoPE")
    ap.add_argument("--compile-check", default="0.8B", help="models also run with compile")
    ap.add_argument("--no-fuse", dest="fuse", action="store_false", help="separate projections")
    ap.add_argument("--no-skinny", dest="skinny", action="store_false", help="cuBLAS only")
    ap.add_argument("--tap", default="27B")
    ap.add_argument("--profile", default=None, help="DIR: trace one decode step (first model)")
    ap.add_argument("--profile-prefill", default="", help="e.g. 9B:1024: host time of a pass")
    ap.add_argument("--chunked", default="", help="e.g. 9B:32768:2048/8192: chunked cold prompt")
    ap.add_argument("--conv-tile", default="", help="the prefill conv's Tile: rows,chans,warps")
    ap.add_argument(
        "--gather",
        default="on",
        help="--chunked attention: on,off (interleaved): the gathered path or paged",
    )
    ap.add_argument("--tune-tokens", type=int, default=-1,
                    help="first warm-up pass (autotune); -1: the longest prefill")  # fmt: skip
    ap.add_argument("--out", default="bench_engine.json")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b]  # "": no decode bench
    prefill = model_lengths(args.prefill)
    args.profile_prefill = model_lengths(args.profile_prefill)
    args.chunked = chunked_specs(args.chunked)
    if not set(args.gather.split(",")) <= {"on", "off"}:
        ap.error(f"--gather: on and off only, not {args.gather!r}")
    checks = set(filter(None, args.compile_check.split(",")))
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    bw, peak = ceilings()
    profiled = False
    for name in args.models.split(","):
        t_model = time.perf_counter()
        modes = {args.compile} | ({not args.compile} if name in checks else set())
        for compile in sorted(modes):
            try:
                profiled = run_model(name, compile, args, batches, prefill, bw, peak, profiled)
            except Exception as e:  # noqa: BLE001 - report and go on with the next preset
                traceback.print_exc()
                emit(kind="error", model=name, compile=compile, error=repr(e)[:300])
            gc.collect()
            torch.cuda.empty_cache()
        print(f"# {name} done in {time.perf_counter() - t_model:.1f} s", flush=True)
    with open(args.out, "w") as f:
        json.dump(RESULTS, f, indent=1)


if __name__ == "__main__":
    main()
