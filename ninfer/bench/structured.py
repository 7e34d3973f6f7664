"""Decode tokens/s at batch B with all lanes free, then with K of the B lanes constrained by a
JSON schema (structured outputs), same prompts and lengths; prints one JSON object with both
steady-state figures and their ratio. A benchmark, not a test.

The constrained lanes decode an array of at least 100000 objects, so their grammar constrains
every step of the window (the mask is computed on the host while the GPU runs the step). The
free lanes are greedy with EOS ignored. With --preset (random weights) the grammar sees the
demo tokenizer's vocabulary; a checkpoint (--model) gives its real per-token mask cost.

    python -m ninfer.bench.structured                              # demo model on the CPU
    python -m ninfer.bench.structured --preset 9B --device cuda    # the lead's H200 check
    python -m ninfer.bench.structured --model /path/ckpt --device cuda --batch 8 --constrained 4
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time

from ninfer.bench.suite import BenchSpec, load
from ninfer.bench.throughput import decode_window
from ninfer.cli.main import add_engine_flags, engine_kwargs
from ninfer.models.presets import PRESETS
from ninfer.request import SamplingParams, StreamDelta, StructuredOutputsParams

SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 9999},
            "name": {"type": "string", "maxLength": 16},
            "ok": {"type": "boolean"},
        },
        "required": ["id", "name", "ok"],
    },
    "minItems": 100000,
}


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=tuple(PRESETS), help="released shape, random weights")
    p.add_argument("--batch", type=int, default=8, help="lanes decoding together")
    p.add_argument("--constrained", type=int, default=4, help="of them, constrained")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=256, help="tokens per lane")
    p.add_argument("--repeat", type=int, default=3, help="runs of each (medians reported)")
    add_engine_flags(p)
    return p.parse_args(argv)


def _stream(llm, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[float]]:
    """Every lane streamed from its own thread, released together: token arrival times."""
    times: list[list[float]] = [[] for _ in prompts]
    go = threading.Barrier(len(prompts))

    def consume(i: int) -> None:
        go.wait()
        for event in llm.stream(prompts[i], params[i]):
            if isinstance(event, StreamDelta):
                times[i].extend([time.perf_counter()] * len(event.token_ids))

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def _mixes(batch: int, constrained: int, n: int) -> dict[str, list[SamplingParams]]:
    """The lanes' parameters: all free, then `constrained` of them bound by SCHEMA."""
    free = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    bound = SamplingParams(
        max_tokens=n, temperature=0.0, structured_outputs=StructuredOutputsParams(json=SCHEMA)
    )
    return {
        "all_free": [free] * batch,
        "constrained": [bound] * constrained + [free] * (batch - constrained),
    }


def _runs(llm, mixes: dict[str, list[SamplingParams]], prompts, repeat: int) -> dict:
    """Steady-state tokens/s of each mix, `repeat` runs each on fresh `prompts()`, after one
    warm-up run of each (allocations, the grammar's compile); a run with no window in which
    every lane decodes gives no figure."""
    for params in mixes.values():
        _stream(llm, prompts(), params)
    figures: dict[str, list[float]] = {name: [] for name in mixes}
    for _ in range(repeat):
        for name, params in mixes.items():
            window = decode_window(_stream(llm, prompts(), params))
            if window["step_seconds"]:
                figures[name].append(len(params) / window["step_seconds"])
    return figures


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    engine = engine_kwargs(args)
    spec = BenchSpec(parts=[], preset=args.preset, model=engine.get("model"), engine=engine)
    loaded = load(spec)
    llm = loaded.make_llm(engine, max_concurrency=max(args.batch, 1))
    rng = random.Random(engine.get("seed", 0))
    vocab = min(loaded.tokenizer.vocab_size, loaded.model.config.vocab_size)

    def prompts() -> list[list[int]]:
        return [[rng.randrange(16, vocab - 1) for _ in range(args.prompt_tokens)]] * args.batch

    mixes = _mixes(args.batch, args.constrained, args.decode_tokens)
    figures = _runs(llm, mixes, prompts, args.repeat)
    free_tps = statistics.median(figures["all_free"]) if figures["all_free"] else None
    bound_tps = statistics.median(figures["constrained"]) if figures["constrained"] else None
    print(
        json.dumps(
            {
                "model": loaded.label,
                "batch": args.batch,
                "constrained_lanes": args.constrained,
                "decode_tokens": args.decode_tokens,
                "all_free_tokens_per_s": free_tps,
                "constrained_tokens_per_s": bound_tps,
                "ratio": bound_tps / free_tps if free_tps and bound_tps else None,
                "runs": figures,
            },
            indent=1,
        )
    )
    llm.close()


if __name__ == "__main__":
    main()
