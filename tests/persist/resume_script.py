"""Run by test_persist_restart.py in a fresh process: one turn of a conversation on the demo
model with a `prefix_cache_file`, printing one JSON line (tokens and usage).

    python resume_script.py FILE first    # turn 1: prompt P, saved at close
    python resume_script.py FILE second   # turn 2: P + reply + more, resumed from the file
    python resume_script.py FILE cold     # turn 2 with prefix_reuse=False (the oracle)
"""

from __future__ import annotations

import json
import random
import sys

from ninfer import LLM, SamplingParams


def prompts() -> tuple[list[int], list[int]]:
    rng = random.Random(7)
    first = [rng.randrange(4, 2500) for _ in range(300)]
    more = [rng.randrange(4, 2500) for _ in range(50)]
    return first, more


def main() -> None:
    path, mode = sys.argv[1], sys.argv[2]
    first, more = prompts()
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    common = dict(device="cpu", max_concurrency=2, kv_capacity=8192, prefill_chunk=128)
    if mode == "cold":
        llm = LLM(prefix_reuse=False, host_cache_mib=0, **common)
    else:
        llm = LLM(host_cache_mib=16, prefix_cache_file=path, **common)
    with llm:
        if mode == "first":
            prompt = first
        else:
            reply = json.loads(sys.stdin.read())["token_ids"]
            prompt = first + reply + more
        out = llm.generate({"prompt_token_ids": prompt}, params)[0]
        stats = llm.cache_stats()
    u = out.usage
    print(
        json.dumps(
            {
                "token_ids": out.token_ids,
                "cached_tokens": u.cached_tokens,
                "restored_host_bytes": u.restored_host_bytes,
                "hits_host": stats.hits_host,
            }
        )
    )


if __name__ == "__main__":
    main()
