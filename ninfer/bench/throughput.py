"""Prefill and decode throughput through the public `LLM.generate`, beside their bounds.

    prefill   one request of T random tokens, max_tokens=1: tokens/s and FLOP/s achieved,
              against the matmul peak (bound seconds = prefill FLOPs / peak)
    decode    B requests decoding together: tokens/s against the memory bound
              (bound step seconds = decode step bytes / HBM bandwidth; tokens/s = B / that).
              The step time is marginal: (wall of B requests of n tokens - wall of B requests
              of n/4) / (3n/4), so prefill and the staggered admission (one prefilling lane at
              a time) cancel; e2e_tokens_per_s keeps the end-to-end figure beside it.

Prompts are random token ids, each starting with a fresh random token, so no request finds the
previous one's prefix in the cache. Warm-ups are not counted: one prefill at each prompt length
(kernels autotune per shape) and one decode request before the decode batches; prefill reports
the best of `repeats` timed calls.
"""

from __future__ import annotations

import random
import time

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
    rng = random.Random(seed)
    params = greedy(1)
    rows = []
    for tokens in prompt_tokens:
        # First at this length: kernels autotune per shape (Triton), so it is not counted.
        llm.generate(random_prompts(rng, cfg.vocab_size, 1, tokens), params)
        outs = [llm.generate(random_prompts(rng, cfg.vocab_size, 1, tokens), params)[0]
                for _ in range(repeats)]  # fmt: skip
        seconds = min(o.metrics.prefill_s or o.metrics.ttft_s for o in outs)
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
    rng = random.Random(seed)
    long, short = decode_tokens, max(2, decode_tokens // 4)
    llm.generate(random_prompts(rng, cfg.vocab_size, 1, prompt_tokens), greedy(long))
    # The copy figure is HBM traffic per second (each copied byte read and written): a decode
    # step's traffic is its bytes read (writes are negligible), so that rate is the bound.
    read_bw = bounds["copy_bytes_per_s"]
    rows = []
    for batch in batch_sizes:
        walls, outs = {}, []
        for n in (short, long):
            prompts = random_prompts(rng, cfg.vocab_size, batch, prompt_tokens)
            t0 = time.perf_counter()
            outs = llm.generate(prompts, greedy(n))
            walls[n] = time.perf_counter() - t0
        # Marginal step time: prefill and the staggered start (one prefilling lane at a time)
        # are the same in both runs and cancel; what is left is batch-wide decode steps.
        step_s = (walls[long] - walls[short]) / (long - short) if long > short else 0.0
        e2e_s = max(o.metrics.decode_s for o in outs)
        tokens = sum(len(o.token_ids) - 1 for o in outs)
        e2e_tps = tokens / e2e_s if e2e_s > 0 else 0.0
        tps = batch / step_s if step_s > 0 else e2e_tps  # (a noisy tiny run: end to end)
        context = prompt_tokens + decode_tokens // 2
        step_bytes = decode_step_bytes(cfg, counts, batch, context, itemsize, kv_itemsize)
        bound_tps = batch * read_bw / step_bytes
        rows.append({
            "batch": batch,
            "prompt_tokens": prompt_tokens,
            "decode_steps": long - short,
            "step_seconds": step_s,
            "tokens_per_s": tps,
            "e2e_decode_seconds": e2e_s,
            "e2e_tokens_per_s": e2e_tps,
            "step_bytes": step_bytes,
            "bound_tokens_per_s": bound_tps,
            "fraction_of_bound": tps / bound_tps,
            "errors": [o.error for o in outs if o.error],
        })  # fmt: skip
    return rows


def greedy(max_tokens: int):
    """Greedy sampling of exactly `max_tokens` tokens (EOS ignored): every bench's params."""
    from ninfer import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
