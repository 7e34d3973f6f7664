"""A lone prompt's longer passes (`solo_prefill_chunk`): the same tokens as `prefill_chunk`
passes, fewer steps, the prompt-tail snapshot still within `prefill_chunk` of the end, and
decode rows keep the short budget."""

from __future__ import annotations

import random

from ninfer.request import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _prompt(seed: int, n: int) -> dict:
    rng = random.Random(seed)
    return {"prompt_token_ids": [rng.randrange(16, 2000) for _ in range(n)]}


def test_solo_passes_give_the_same_tokens_in_fewer_steps(make_llm):
    prompt = _prompt(1, 700)
    runs = {}
    for solo in (64, 256):
        llm = make_llm(prefill_chunk=64, solo_prefill_chunk=solo)
        engine = llm._engine
        before = engine.steps
        out = llm.generate([prompt], GREEDY)[0]
        steps = engine.steps - before
        retry = llm.generate([prompt], GREEDY)[0]
        runs[solo] = (out.token_ids, steps, retry)
    (base, base_steps, base_retry), (solo, solo_steps, solo_retry) = runs[64], runs[256]
    assert solo == base  # fp32: the pass boundaries do not change the greedy tokens
    # 700 tokens: 11 passes of 64 against 256 + 256 + 128 + 60 (the tail's cut), then decode
    assert solo_steps < base_steps - 6, (solo_steps, base_steps)
    for retry in (base_retry, solo_retry):
        assert retry.token_ids == base
        assert 700 - 64 <= retry.usage.cached_tokens < 700  # the tail snapshot


def test_decoding_lanes_keep_the_short_budget(make_llm):
    """With a lane decoding, a long prompt's chunks are prefill_chunk tokens."""
    llm = make_llm(prefill_chunk=64, solo_prefill_chunk=512, max_concurrency=2)
    engine = llm._engine
    sizes: list[list[int]] = []
    run = engine._run

    def spy(rows):
        sizes.append([r.end - r.start for r in rows])
        return run(rows)

    engine._run = spy
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    short, long_ = _prompt(2, 300), _prompt(3, 600)
    outs = llm.generate([short, long_], params)
    assert all(len(o.token_ids) == 40 for o in outs)
    mixed = [s for s in sizes if len(s) > 1]  # steps with decode rows and a prefill chunk
    assert mixed and all(max(s) <= 64 for s in mixed), sizes
    assert sizes[0] == [256], sizes  # the lone first prompt: ceil64(300 - 64), then 44
