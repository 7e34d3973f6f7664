"""Prefill and decode throughput through the public `LLM.generate`, beside their bounds.

    prefill   one request of T random tokens, max_tokens=1: tokens/s and FLOP/s achieved,
              against the matmul peak (bound seconds = prefill FLOPs / peak)
    decode    B requests decoding together: tokens/s against the memory bound
              (bound step seconds = decode step bytes / read bandwidth; tokens/s = B / that)

Prompts are random token ids, each starting with a fresh random token, so no request finds the
previous one's prefix in the cache. The first call of each benchmark is a warm-up (compilation,
graph capture, allocator) and is not counted.
"""

from __future__ import annotations

import random

from ninfer.bench.model_math import ParamCounts, decode_step_bytes, prefill_flops
from ninfer.models.config import Qwen35Config

FIRST_ID = 16  # stay clear of the special tokens at the bottom of every vocabulary


def random_prompts(rng: random.Random, vocab: int, n: int, tokens: int) -> list[dict]:
    return [
        {"prompt_token_ids": [rng.randrange(FIRST_ID, vocab) for _ in range(tokens)]}
        for _ in range(n)
    ]


def bench_prefill(
    llm, cfg: Qwen35Config, counts: ParamCounts, prompt_tokens: list[int], bounds: dict,
    repeats: int = 2, seed: int = 0,
) -> list[dict]:  # fmt: skip
    from ninfer import SamplingParams

    rng = random.Random(seed)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate(random_prompts(rng, cfg.vocab_size, 1, min(prompt_tokens)), params)
    rows = []
    for tokens in prompt_tokens:
        outs = [llm.generate(random_prompts(rng, cfg.vocab_size, 1, tokens), params)[0]
                for _ in range(repeats)]  # fmt: skip
        seconds = sorted(o.metrics.prefill_s or o.metrics.ttft_s for o in outs)[len(outs) // 2]
        flops = prefill_flops(cfg, counts, tokens)
        bound_s = flops / bounds["matmul_flops_per_s"]
        rows.append({
            "prompt_tokens": tokens,
            "seconds": seconds,
            "ttft_s": min(o.metrics.ttft_s for o in outs),
            "tokens_per_s": tokens / seconds,
            "flops": flops,
            "flops_per_s": flops / seconds,
            "bound_seconds": bound_s,
            "fraction_of_bound": bound_s / seconds,
        })  # fmt: skip
    return rows


def bench_decode(
    llm, cfg: Qwen35Config, counts: ParamCounts, prompt_tokens: int, decode_tokens: int,
    batch_sizes: list[int], bounds: dict, itemsize: int, kv_itemsize: int, seed: int = 0,
) -> list[dict]:  # fmt: skip
    from ninfer import SamplingParams

    rng = random.Random(seed)
    params = SamplingParams(max_tokens=decode_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(random_prompts(rng, cfg.vocab_size, 1, prompt_tokens), params)
    read_bw = bounds["copy_bytes_per_s"] / 2  # the copy figure counts each byte read + written
    rows = []
    for batch in batch_sizes:
        outs = llm.generate(random_prompts(rng, cfg.vocab_size, batch, prompt_tokens), params)
        steps = max(len(o.token_ids) for o in outs) - 1  # the first token comes from prefill
        seconds = max(o.metrics.decode_s for o in outs)
        tokens = sum(len(o.token_ids) - 1 for o in outs)
        context = prompt_tokens + decode_tokens // 2
        step_bytes = decode_step_bytes(cfg, counts, batch, context, itemsize, kv_itemsize)
        bound_tps = batch * read_bw / step_bytes
        tps = tokens / seconds if seconds > 0 else 0.0
        rows.append({
            "batch": batch,
            "prompt_tokens": prompt_tokens,
            "decode_steps": steps,
            "seconds": seconds,
            "tokens_per_s": tps,
            "step_bytes": step_bytes,
            "bound_tokens_per_s": bound_tps,
            "fraction_of_bound": tps / bound_tps,
            "errors": [o.error for o in outs if o.error],
        })  # fmt: skip
    return rows
