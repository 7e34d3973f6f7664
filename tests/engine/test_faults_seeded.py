"""A sampling fault in one row must not change what its seeded neighbours draw.

The runner samples a step's rows at once; when that raises it samples them row by row so the
faulting row fails alone. A fault can strike after the batch call has already advanced some
rows' generators (here: the real sampler ran on the whole batch, then the fault), so the retry
must start each seeded generator from where it stood before the step, or the neighbours' tokens
part from a cold run's.
"""

from __future__ import annotations

import random

from engine_helpers import assert_idle, rand_tokens

from ninfer.request import SamplingParams

N = 4
MAX_TOKENS = 12
INJECTED = "injected after the batch draw"


def _params(i: int, target: int | None = None) -> SamplingParams:
    extra = 1 if i == target else 0  # the target is told apart by its max_tokens
    return SamplingParams(
        max_tokens=MAX_TOKENS + extra, temperature=1.0, seed=1000 + i, ignore_eos=True
    )


def test_a_row_that_faults_after_the_batch_draw_leaves_seeded_neighbours_as_cold(make_llm):
    rng = random.Random(7)
    prompts = [rand_tokens(rng, rng.randrange(20, 90)) for _ in range(N)]
    cold_llm = make_llm(prefix_reuse=False, host_cache_mib=0, max_concurrency=1)
    cold = [cold_llm.generate([p], _params(i))[0].token_ids for i, p in enumerate(prompts)]
    cold_llm.close()

    llm = make_llm(max_concurrency=N, prefix_reuse=False, host_cache_mib=0)
    runner = llm.engine.runner
    real = runner.sampler
    target = 1
    fired = []

    def sampler(logits, params, generators):
        out = real(logits, params, generators)  # every row's generator has drawn
        if len(params) > 1 and any(p.max_tokens == MAX_TOKENS + 1 for p in params):
            fired.append(len(params))
            raise RuntimeError(INJECTED)
        return out

    runner.sampler = sampler
    outs = llm.generate(prompts, [_params(i, target) for i in range(N)])
    runner.sampler = real
    assert fired, "the fault never struck a batch"
    for i, (out, want) in enumerate(zip(outs, cold, strict=True)):
        got = out.token_ids[:MAX_TOKENS]
        assert out.finish_reason in ("length", "error"), (i, out.finish_reason, out.error)
        assert got == want[: len(got)], f"request {i} parted from its cold seeded run"
        if i != target:
            assert out.finish_reason == "length" and len(got) == MAX_TOKENS
    assert_idle(llm)
