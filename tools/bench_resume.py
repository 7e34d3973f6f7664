"""Time to first token of a resumed conversation turn against the same turn cold.

A conversation of `--context` tokens gets a reply, then a next turn (the whole history echoed,
plus `--new` tokens) is sent twice: to the engine that served the first turn (it resumes at the
previous turn's endpoint snapshot) and to an engine with prefix_reuse=False (it prefills
everything). Prints one JSON object with both TTFTs and their ratio. A benchmark, not a test.

    python tools/bench_resume.py                       # demo model on the CPU
    python tools/bench_resume.py --model /path/ckpt --device cuda --context 32000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from ninfer import LLM, SamplingParams
from ninfer.cli.main import add_engine_flags, engine_kwargs


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=4000, help="history tokens before the turn")
    p.add_argument("--new", type=int, default=48, help="new tokens of the resumed turn")
    p.add_argument("--reply", type=int, default=16, help="tokens generated per turn")
    p.add_argument("--repeat", type=int, default=3, help="turns measured (median reported)")
    add_engine_flags(p)  # `ninfer`'s engine flags; --seed also seeds the random prompts
    return p.parse_args()


def main() -> None:
    args = _args()
    engine = engine_kwargs(args)
    common = {
        "max_concurrency": 1,
        "host_cache_mib": 0,
        "max_model_len": args.context + (args.new + args.reply) * (args.repeat + 1) + 64,
        **engine,  # flags given win
    }
    warm = LLM(**common)
    cold = LLM(**{**common, "prefix_reuse": False})
    vocab = min(warm.tokenizer.vocab_size, 2**31)
    rng = random.Random(engine.get("seed", 0))

    def tokens(n: int) -> list[int]:
        return [rng.randrange(16, vocab - 1) for _ in range(n)]

    params = SamplingParams(max_tokens=args.reply, temperature=0, ignore_eos=True)
    cold.generate([tokens(64)], params)  # warm-up of both engines (allocations, first passes)
    prompt = tokens(args.context)
    out = warm.generate([prompt], params)[0]
    resumed, recomputed, cached = [], [], []
    for _ in range(args.repeat):
        prompt = prompt + out.token_ids + tokens(args.new)
        out = warm.generate([prompt], params)[0]
        ref = cold.generate([prompt], params)[0]
        assert out.token_ids == ref.token_ids, "resumed and cold outputs differ"
        resumed.append(out.metrics.ttft_s)
        recomputed.append(ref.metrics.ttft_s)
        cached.append(out.usage.cached_tokens)
    ttft_resumed, ttft_cold = statistics.median(resumed), statistics.median(recomputed)
    result = {
        "device": warm.engine_config.memory.device,
        "model": engine.get("model") or "demo",
        "prefill_chunk": warm.engine_config.scheduling.prefill_chunk,
        "prompt_tokens_last_turn": len(prompt),
        "cached_tokens": cached,
        "ttft_resumed_s": round(ttft_resumed, 4),
        "ttft_cold_s": round(ttft_cold, 4),
        "speedup": round(ttft_cold / ttft_resumed, 1),
    }
    print(json.dumps(result, indent=2))
    warm.close()
    cold.close()


if __name__ == "__main__":
    main()
