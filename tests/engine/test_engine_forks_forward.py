"""Sub-agents spawned one after another from one raw-token preamble (no boundary marks the fork):
the first one's cold prefill leaves forward-ladder snapshots at base + R*2^k (R = 512), so
the second resumes at the deepest rung at or below the fork instead of at the root, and the
later ones at the fork tap the second placed; a cold prompt prefilled in one long pass takes its
rungs inside that pass. Tiny model on the CPU; outputs equal an uncached engine's."""

from __future__ import annotations

import random

import pytest
from engine_helpers import TINY, assert_idle, rand_tokens, run
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ninfer.config import DeviceFacts, EngineOptions, resolve


@pytest.fixture
def cold(make_llm):
    return make_llm(prefix_reuse=False)


def test_r_is_512_whatever_the_chunk():
    """Rungs need not lie on the chunk grid: a long pass takes them inside itself."""

    def forward(chunk: int) -> int:
        opts = EngineOptions(prefill_chunk=chunk)
        return resolve(opts, TINY, DeviceFacts("cpu", 64 << 30, 64 << 30)).cache.cache_tap_forward

    assert {forward(c) for c in (64, 256, 384, 511, 512, 513, 2048)} == {512}


@pytest.mark.parametrize("fork", [700, 1100, 2100])
def test_a_fork_inside_one_long_cold_pass_resumes_at_a_rung_below_it(
    make_llm, cold, monkeypatch, fork
):
    """A 2600-token cold prompt prefilled in one pass leaves its rungs 512, 1024, 2048 (and
    its tail 2560) from inside that pass: a later prompt forking at `fork` resumes at the
    deepest rung at or below it, and computes what an uncached engine computes."""
    rng = random.Random(fork)
    llm = make_llm(solo_prefill_chunk=4096)
    prompt = rand_tokens(rng, 2600)
    runner, passes = llm.engine.runner, []
    launch = runner.launch
    monkeypatch.setattr(runner, "launch", lambda rows, *a: passes.append(rows) or launch(rows, *a))
    run(llm, prompt, 3)
    [tapped] = [r for rows in passes for r in rows if len(r.token_ids) > 1]  # one pass
    assert [offset for offset, _ in tapped.taps] == [512, 1024, 2048, 2560]
    forked = prompt[:fork] + rand_tokens(rng, 100)
    out = run(llm, forked, 5)
    assert out.usage.cached_tokens == 512 << max(k for k in range(3) if 512 << k <= fork)
    assert out.token_ids == run(cold, forked, 5).token_ids
    assert_idle(llm)


def test_sub_agents_over_a_raw_preamble_reuse_from_the_second_on(make_llm, cold):
    rng = random.Random(3)
    llm = make_llm()
    preamble = rand_tokens(rng, 1100)  # the first one's tail snapshot (>= 1152) lies past it
    tasks = [rand_tokens(rng, 100 + 9 * i) for i in range(4)]
    first = [run(llm, preamble + t, 5) for t in tasks]
    # the second resumes at the rung 1024 of the first's prefill; from the third on, at the
    # fork tap 1088 the second placed
    assert [o.usage.cached_tokens for o in first] == [0, 1024, 1088, 1088]
    for t, o in zip(tasks, first, strict=True):
        assert o.token_ids == run(cold, preamble + t, 5).token_ids
    assert_idle(llm)


@settings(
    max_examples=4,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    preamble=st.integers(512, 1500),
    tails=st.lists(st.integers(100, 160), min_size=3, max_size=3),
    seed=st.integers(0, 99),
)
def test_the_second_sibling_resumes_at_least_halfway_to_the_fork(make_llm, preamble, tails, seed):
    """Siblings diverging at `preamble` >= R: the second resumes at the deepest rung 512*2^k at
    or below the divergence (more than half of it), the third at its block boundary."""
    rng = random.Random(seed)
    llm = make_llm()
    shared = rand_tokens(rng, preamble)
    cached = [run(llm, shared + rand_tokens(rng, k), 3).usage.cached_tokens for k in tails]
    rung = 512 << max(k for k in range(4) if 512 << k <= preamble)
    assert cached == [0, rung, preamble - preamble % 64]
    assert 2 * cached[1] > preamble
    assert_idle(llm)
