"""CPU: the cache package's calls and time per 1024-token request on the engine thread.

Profiles the engine thread (cProfile around `Engine._loop`) while the demo model answers 30
requests of 1024 random tokens with one generated token each, and prints the cache package's
calls and own time per request (the profiler inflates every call: compare runs, not absolutes).

    PYTHONPATH=<checkout> python results/h200-2026-12-02c/index_overhead.py
"""

from __future__ import annotations

import cProfile
import pstats
import random

from ninfer import LLM, SamplingParams
from ninfer.engine import engine as engine_module

REQUESTS = 30
PROMPT_TOKENS = 1024


def main() -> None:
    profile = cProfile.Profile()
    loop = engine_module.Engine._loop

    def profiled_loop(self) -> None:
        profile.enable()
        try:
            loop(self)
        finally:
            profile.disable()

    engine_module.Engine._loop = profiled_loop
    rng = random.Random(0)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    with LLM() as llm:
        for _ in range(REQUESTS):
            ids = [rng.randrange(10, 1000) for _ in range(PROMPT_TOKENS)]
            llm.generate([{"prompt_token_ids": ids}], params)
    stats = pstats.Stats(profile).stats  # {(file, line, name): (cc, calls, tottime, cumtime, _)}
    cache = [v for k, v in stats.items() if "/ninfer/cache/" in k[0]]
    kv = [v for k, v in stats.items() if "/ninfer/engine/kv/" in k[0]]
    calls = sum(v[1] for v in cache) / REQUESTS
    cache_ms = sum(v[2] for v in cache) / REQUESTS * 1e3
    kv_ms = sum(v[2] for v in kv) / REQUESTS * 1e3
    print(f"per request: cache {cache_ms:.3f} ms in {calls:.0f} calls; engine/kv {kv_ms:.3f} ms")


if __name__ == "__main__":
    main()
