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
import time

import torch

from ninfer.bench.speculative import controlled_acceptance
from ninfer.engine import speculative, stepper
from ninfer.llm import LLM
from ninfer.models.presets import PRESETS, build_random_model
from ninfer.request import SamplingParams

HOST: dict[str, list[float]] = {}  # phase -> [calls, host seconds] (the engine thread's)


def _timed(cls, name: str) -> None:
    """Wraps cls.name to add up its host wall time (no sync: a phase that reads results from
    the GPU includes the wait)."""
    fn = getattr(cls, name)
    key = f"{cls.__name__}.{name}"

    def wrapped(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc = HOST.setdefault(key, [0, 0.0])
            acc[0] += 1
            acc[1] += time.perf_counter() - t0

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
    args = ap.parse_args()
    for cls, names in ((speculative.Speculator, ("launch", "bridge", "draft", "settle_row")),
                       (stepper.Stepper, ("run", "settle"))):  # fmt: skip
        for n in names:
            _timed(cls, n)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = build_random_model(PRESETS[args.preset], dtype, args.device, seed=0, mtp=True)
    llm = LLM.from_model(
        model, device=args.device, speculative="mtp", num_speculative_tokens=args.k,
        max_concurrency=max(args.batch, 1),
    )  # fmt: skip
    llm.engine.speculator.control = controlled_acceptance(args.accept, 0)
    rng = random.Random(0)
    vocab = model.config.vocab_size

    def prompts():
        n = args.prompt_tokens
        return [[rng.randrange(vocab) for _ in range(n)] for _ in range(args.batch)]

    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts(), params)
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
    for key, (calls, seconds) in HOST.items():
        print(f"host {key:24s} calls {calls:4d} {seconds * 1e3:9.2f} ms")
    if args.trace:
        path = args.trace[:-3] if args.trace.endswith(".gz") else args.trace
        prof.export_chrome_trace(path)
        with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
            g.write(f.read())
        print("trace", path + ".gz")
    llm.close()


if __name__ == "__main__":
    main()
