"""generate() end to end without the prefix cache: outputs equal the unchunked oracle."""

from __future__ import annotations

import random

from engine_helpers import reference_greedy

from ninfer.request import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def _prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, 2500) for _ in range(n)] for n in lengths]


def test_batch_matches_unchunked_oracle(make_llm, tiny_model):
    prompts = _prompts(0, [5, 64, 130, 200, 17, 300])
    llm = make_llm(prefix_reuse=False, max_concurrency=3)
    outs = llm.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == reference_greedy(tiny_model, prompt, 12)
        assert out.finish_reason == "length"
        assert out.usage.prompt_tokens == len(prompt)
        assert out.usage.cached_tokens == 0


def test_concurrent_prefill_same_outputs(make_llm, tiny_model):
    prompts = _prompts(1, [150, 90, 260, 33])
    llm = make_llm(prefix_reuse=False, concurrent_prefill=True, max_concurrency=4)
    outs = llm.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == reference_greedy(tiny_model, prompt, 12)
