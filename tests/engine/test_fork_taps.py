"""Forks arriving one after another (sub-agents over one preamble, forks of a conversation): an
admission whose cached block prefix runs 64+ tokens past its resume frontier places an exact
Boundary tap at that block boundary, so the next sibling resumes there. Tiny model on the CPU;
outputs equal an uncached engine's."""

from __future__ import annotations

import random

import pytest
from engine_helpers import assert_idle, rand_tokens, run
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ninfer.cache.common import SnapshotKind


@pytest.fixture
def cold(make_llm):
    return make_llm(prefix_reuse=False)


def boundaries(llm) -> list[int]:
    def read():
        snaps = llm.engine.kv_state.index.snapshots.by_id.values()
        return sorted(s.frontier for s in snaps if s.kind == SnapshotKind.BOUNDARY)

    return llm.engine.call(read)


def test_sub_agents_after_the_first_fork_resume_at_the_fork(make_llm, cold):
    rng = random.Random(1)
    llm = make_llm()
    preamble = rand_tokens(rng, 300)  # raw tokens: no structural boundary
    tasks = [rand_tokens(rng, 40 + 7 * i) for i in range(4)]
    outs = [run(llm, preamble + t, 6) for t in tasks]
    # the first has nothing to resume from; the second proves the fork (256 cached blocks)
    # and places a Boundary tap at 256; every later sibling resumes there
    assert [o.usage.cached_tokens for o in outs] == [0, 0, 256, 256]
    assert [o.usage.cached_prefix_tokens for o in outs][1:] == [256, 256, 256]
    assert 256 in boundaries(llm)
    for t, o in zip(tasks, outs, strict=True):
        assert o.token_ids == run(cold, preamble + t, 6).token_ids
    assert_idle(llm)


def test_no_fork_tap_within_64_tokens_of_the_resume_point(make_llm):
    rng = random.Random(2)
    llm = make_llm()
    prompt = rand_tokens(rng, 200)
    run(llm, prompt, 4)  # the tail tap at 192
    out = run(llm, prompt[:199] + rand_tokens(rng, 30), 4)
    assert out.usage.cached_tokens == 192 and out.usage.cached_prefix_tokens == 192
    assert boundaries(llm) == []


@settings(
    max_examples=4,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    preamble=st.integers(130, 400),
    forks=st.lists(st.integers(64, 120), min_size=3, max_size=4),  # tails past the fork block
    seed=st.integers(0, 99),
)
def test_every_fork_after_the_second_resumes_at_the_shared_blocks(make_llm, preamble, forks, seed):
    """Siblings diverging at `preamble`: from the third on, each resumes at the deepest block
    boundary at or below the divergence (the fork tap of the second)."""
    rng = random.Random(seed)
    llm = make_llm()
    shared = rand_tokens(rng, preamble)
    cached = [run(llm, shared + rand_tokens(rng, k), 3).usage.cached_tokens for k in forks]
    fork = preamble - preamble % 64
    assert all(c == fork for c in cached[2:]), (fork, cached)
    assert_idle(llm)
