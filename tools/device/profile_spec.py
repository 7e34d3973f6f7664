"""Where a speculative decode step spends its time on the GPU: one lane (or `--batch`) of a
random preset with the MTP head decoding under a controlled acceptance, profiled with
torch.profiler over the steady state. Prints the kernels by total GPU time, the GPU's busy
fraction of the wall time, the host time of the speculator's phases, and writes a gzipped
Chrome trace.

    python3 tools/device/profile_spec.py --preset 9B --batch 1 --trace OUT/spec.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import random
import statistics
import time

import torch

from ninfer.bench.speculative import controlled_acceptance
from ninfer.engine import engine, speculative, stepper
from ninfer.engine.executor import spec_graphs
from ninfer.engine.kv import state
from ninfer.llm import LLM
from ninfer.models.presets import PRESETS, build_random_model
from ninfer.request import SamplingParams

HOST: dict[str, list[float]] = {}  # phase -> host seconds of each call (the engine thread's)
EVENTS: list = []  # (phase, start event, end event) per call, on CUDA
ACCEPTED: list[int] = []  # drafts accepted in each Engine.step (its calls' order)


def _timed(cls, name: str) -> None:
    """Wraps cls.name to add up its host wall time (no sync: a phase that reads results from
    the GPU includes the wait) and, on CUDA, its GPU time: from the GPU reaching the phase's
    first launch to finishing its last, idle waits for the host's launches included (CUDA
    events on the engine thread's stream; torch.profiler sees no ops of that thread)."""
    fn = getattr(cls, name)
    key = f"{cls.__name__}.{name}"

    def wrapped(*a, **k):
        t0 = time.perf_counter()
        marks = None
        if torch.cuda.is_available():
            marks = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            marks[0].record()
        try:
            return fn(*a, **k)
        finally:
            if marks is not None:
                marks[1].record()
                EVENTS.append((key, *marks))
            HOST.setdefault(key, []).append(time.perf_counter() - t0)

    setattr(cls, name, wrapped)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="9B")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--accept", type=float, default=0.7)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--trace", default="")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--draft-vocab", type=int, default=None)
    ap.add_argument("--draft-quantization", default=None, help='"fp8": the MTP layer in FP8')
    ap.add_argument("--no-profile", action="store_true", help="the unprofiled run only")
    ap.add_argument("--verify-backend", default=None,
                    help="OpChoices.verify_backend (default: the engine's)")  # fmt: skip
    ap.add_argument("--no-ahead", action="store_true",
                    help="draft after the read (Speculator.chain_ahead off)")  # fmt: skip
    ap.add_argument(
        "--read-drafts",
        action="store_true",
        help="read the drafts back before each verify (no verify fed on the device)",
    )
    args = ap.parse_args()
    if args.read_drafts:
        speculative.Speculator._fed_drafts = staticmethod(lambda rows, drafts: None)
    phases = (
        (speculative.Speculator, ("launch", "bridge", "draft", "settle_row", "_chain_fed",
                                  "_bridge_ahead", "_chain_ahead")),
        (stepper.Stepper, ("run", "settle", "_append_tokens", "_stream_deltas")),
        (engine.Engine, ("step",)),
        (spec_graphs.VerifyGraphs, ("run",)),
        (spec_graphs.HeadGraphs, ("run",)),
        (spec_graphs._RowGraphs, ("_fill",)),
        (state.KVState, ("after_advance",)),
    )  # fmt: skip
    for cls, names in phases:
        for n in names:
            _timed(cls, n)
    timed_step = engine.Engine.step

    def step(self, *a, **k):  # the drafts each step accepts, beside its times
        spec = self.speculator
        before = spec.stats.accepted if spec is not None else 0
        try:
            return timed_step(self, *a, **k)
        finally:
            ACCEPTED.append((spec.stats.accepted if spec is not None else 0) - before)

    engine.Engine.step = step
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = build_random_model(PRESETS[args.preset], dtype, args.device, seed=0, mtp=True)
    llm = LLM.from_model(
        model, device=args.device, speculative="mtp", num_speculative_tokens=args.k,
        max_concurrency=max(args.batch, 1), draft_vocab=args.draft_vocab,
        draft_quantization=args.draft_quantization,
        **({"verify_backend": args.verify_backend} if args.verify_backend else {}),
    )  # fmt: skip
    llm.engine.speculator.control = controlled_acceptance(args.accept, 0)
    llm.engine.speculator.chain_ahead = not args.no_ahead
    rng = random.Random(0)
    vocab = model.config.vocab_size

    def prompts():
        n = args.prompt_tokens
        return [[rng.randrange(vocab) for _ in range(n)] for _ in range(args.batch)]

    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    # twice: the second run meets every shape the first compiled or autotuned
    llm.generate(prompts(), params)
    llm.generate(prompts(), params)
    # first without the profiler (which slows the host): per-call host and GPU times, the
    # median of each phase, and the wall time per token
    todo = prompts()
    llm.generate(todo, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    if args.device == "cuda":
        torch.cuda.synchronize()
    HOST.clear()
    EVENTS.clear()
    ACCEPTED.clear()
    t0 = time.perf_counter()
    outs = llm.generate(todo, params)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    spec = llm.engine.speculator
    chained = spec.graphs.chain.replays if spec.graphs is not None else 0
    print(f"unprofiled: wall {wall * 1e3:.1f} ms for {tokens} tokens "
          f"({wall * 1e3 / max(tokens, 1) * args.batch:.2f} ms per token of a lane); "
          f"chains run ahead {spec.ahead_runs}, chain replays {chained}")  # fmt: skip
    _medians()
    _by_accepted()
    if args.no_profile:
        llm.close()
        return
    todo = prompts()
    # prefill outside the profile: a one-token run admits and prefills, then the timed run
    # resumes the cached prompt
    llm.generate(todo, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    acts = [torch.profiler.ProfilerActivity.CPU]
    cuda = args.device == "cuda"
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    HOST.clear()
    EVENTS.clear()
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        outs = llm.generate(todo, params)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    st = llm.engine.speculator.stats
    tokens = sum(len(o.token_ids) for o in outs)
    print(
        f"wall {wall * 1e3:.1f} ms for {tokens} tokens; verify rows {st.verify_rows}; "
        f"graph replays {llm.engine.speculator.graphs and llm.engine.speculator.graphs.replays}"
    )
    events = prof.key_averages()
    rows = sorted(events, key=lambda e: e.device_time_total, reverse=True)
    busy = sum(e.self_device_time_total for e in events) / 1e3
    print(f"GPU busy {busy:.1f} ms of {wall * 1e3:.1f} ms wall ({busy / wall / 1e3:.2f})")
    print(f"{'kernel / op':80s} {'calls':>7s} {'gpu ms':>8s} {'cpu ms':>8s}")
    for e in rows[:45]:
        print(f"{e.key[:80]:80s} {e.count:7d} {e.device_time_total / 1e3:8.2f} "
              f"{e.cpu_time_total / 1e3:8.2f}")  # fmt: skip
    _medians()
    if cuda:
        _gaps(prof, wall)
    if args.trace:
        path = args.trace[:-3] if args.trace.endswith(".gz") else args.trace
        prof.export_chrome_trace(path)
        with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
            g.write(f.read())
        print("trace", path + ".gz")
    llm.close()


def _medians() -> None:
    """Per phase: calls, total and median host ms, and (CUDA) the median GPU ms from its
    first launch to its last end."""
    gpu: dict[str, list[float]] = {}
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        for key, start, end in EVENTS:
            gpu.setdefault(key, []).append(start.elapsed_time(end))
    print(f"{'phase':34s} {'calls':>5s} {'host ms':>9s} {'median':>7s} {'max':>7s} "
          f"{'gpu median':>10s} {'gpu mean':>8s} {'gpu max':>8s}")  # fmt: skip
    for key, secs in HOST.items():
        g = gpu.get(key)
        gm = f"{statistics.median(g):10.3f} {statistics.mean(g):8.3f} {max(g):8.3f}" if g else ""
        print(f"{key:34s} {len(secs):5d} {sum(secs) * 1e3:9.2f} "
              f"{statistics.median(secs) * 1e3:7.3f} {max(secs) * 1e3:7.3f} {gm}")  # fmt: skip


def _by_accepted() -> None:
    """Engine.step's host and GPU ms by the drafts the step accepted: whether a step that
    rejects costs more than one that accepts all."""
    host = HOST.get("Engine.step", [])
    gpu = [s.elapsed_time(e) for key, s, e in EVENTS if key == "Engine.step"]
    by: dict[int, list[tuple[float, float | None]]] = {}
    for i, (h, m) in enumerate(zip(host, ACCEPTED, strict=False)):
        by.setdefault(m, []).append((h * 1e3, gpu[i] if i < len(gpu) else None))
    print(f"{'accepted':>8s} {'steps':>5s} {'host mean':>9s} {'host max':>8s} {'gpu mean':>8s}")
    for m in sorted(by):
        hs = [h for h, _ in by[m]]
        gs = [g for _, g in by[m] if g is not None]
        gm = f"{statistics.mean(gs):8.3f}" if gs else ""
        print(f"{m:8d} {len(hs):5d} {statistics.mean(hs):9.3f} {max(hs):8.3f} {gm}")


def _gaps(prof, wall: float) -> None:
    """The GPU's idle time between kernels (copies count as busy) over the profiled run: the
    total, by size, and the longest gaps with the kernels on either side."""
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    if not spans:
        return
    gaps, end, last = [], spans[0][1], spans[0][2]
    for start, stop, name in spans[1:]:
        if start > end:
            gaps.append((start - end, last, name))
        if stop > end:
            end, last = stop, name
    total = sum(g for g, _, _ in gaps) / 1e3
    span = (end - spans[0][0]) / 1e3
    print(f"GPU idle {total:.1f} ms in {len(gaps)} gaps over a {span:.1f} ms GPU span "
          f"(wall {wall * 1e3:.1f} ms)")  # fmt: skip
    for lo, hi in ((0, 20), (20, 100), (100, 500), (500, 10**9)):
        sel = [g for g, _, _ in gaps if lo <= g < hi]
        print(f"  gaps {lo:>4d}-{hi if hi < 10**9 else 'inf'} us: {len(sel):5d}, "
              f"{sum(sel) / 1e3:8.2f} ms")  # fmt: skip
    for g, before, after in sorted(gaps, reverse=True)[:12]:
        print(f"  {g / 1e3:7.2f} ms after {before[:50]} before {after[:50]}")


if __name__ == "__main__":
    main()
