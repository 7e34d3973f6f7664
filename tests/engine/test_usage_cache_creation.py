"""usage.cache_creation_tokens: prompt tokens a request prefilled into blocks it newly inserted
into the prefix cache (Anthropic's cache_creation_input_tokens)."""

from __future__ import annotations

import random

from engine_helpers import greedy, rand_tokens

from ninfer.page import PAGE_SIZE


def test_first_request_creates_its_full_prompt_blocks_a_repeat_creates_none(make_llm):
    llm = make_llm()
    rng = random.Random(3)
    prompt = rand_tokens(rng, 3 * PAGE_SIZE + 17)
    first = llm.generate([prompt], greedy(4))[0].usage
    assert (first.cached_tokens, first.cache_creation_tokens) == (0, 3 * PAGE_SIZE)
    again = llm.generate([prompt], greedy(4))[0].usage
    assert again.cached_tokens > 0 and again.cache_creation_tokens == 0
    # a longer prompt over the same prefix creates only its own new full blocks
    longer = prompt + rand_tokens(rng, 2 * PAGE_SIZE)
    grown = llm.generate([longer], greedy(4))[0].usage
    assert grown.cache_creation_tokens == (len(longer) // PAGE_SIZE - 3) * PAGE_SIZE


def test_disabled_cache_creates_nothing(make_llm):
    llm = make_llm(prefix_reuse=False)
    out = llm.generate([rand_tokens(random.Random(4), 200)], greedy(2))[0]
    assert out.usage.cache_creation_tokens == 0
