"""The end of every prompt stays reusable: a client that resends its previous prompt plus new
text, without the reply as generated (a raw-completions agent that rewrites or drops the output,
a sub-agent forked after the prompt, a regeneration with an extra instruction), resumes at the
previous prompt's end, not at a tap below it. The PROMPT_END snapshot is taken after the pass
that reaches the prompt's end (no split) and survives the request's own endpoint; an echoing
client still resumes at the endpoint. Cached runs give the tokens of cold ones. Engine on the
CPU (tiny model, demo tokenizer and chat template)."""

from __future__ import annotations

import random

import pytest
from engine_helpers import assert_idle, greedy, rand_tokens, run
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ninfer.cache.common import SnapshotKind

_SETTINGS = settings(
    max_examples=6,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),  # an engine run per example
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
PROMPT_END = int(SnapshotKind.PROMPT_END)


@pytest.fixture
def cold(make_llm):
    return make_llm(prefix_reuse=False)


def snapshots(llm) -> list[tuple[int, int, bool]]:
    """(frontier, kind, superseded) of every snapshot in the index, sorted."""

    def read():
        snaps = llm.engine.kv_state.index.snapshots.by_id.values()
        return sorted((s.frontier, int(s.kind), s.superseded) for s in snaps)

    return llm.engine.call(read)


@_SETTINGS
@given(
    first=st.integers(70, 700),
    grows=st.lists(st.integers(1, 300), min_size=2, max_size=4),
    replies=st.lists(st.integers(1, 90), min_size=4, max_size=4),
    chunk=st.sampled_from([64, 128, 256]),
    seed=st.integers(0, 999),
)
def test_prompts_growing_without_the_reply_resume_at_the_previous_prompt_end(
    make_llm, first, grows, replies, chunk, seed
):
    rng = random.Random(seed)
    llm = make_llm(prefill_chunk=chunk)
    cold = make_llm(prefix_reuse=False, prefill_chunk=chunk)
    prompt = rand_tokens(rng, first)
    prev = None
    for grow, n in zip(grows + [1], replies, strict=False):
        out = run(llm, prompt, n)
        if prev is not None:
            assert out.usage.cached_tokens == len(prev), (len(prev), out.usage.cached_tokens)
        assert out.token_ids == run(cold, prompt, n).token_ids
        prev, prompt = prompt, prompt + rand_tokens(rng, grow)
    assert_idle(llm)


def test_the_prompt_end_survives_the_endpoint_and_the_echo_still_resumes_there(make_llm, cold):
    """Both clients after one request: the one that drops the reply resumes at the prompt end,
    the one that echoes it at the endpoint (the prompt end does not make the endpoint's 64-token
    rule skip it); neither snapshot is superseded by the other."""
    rng = random.Random(1)
    llm = make_llm()
    prompt = rand_tokens(rng, 300)
    out = run(llm, prompt, 40)
    snaps = snapshots(llm)
    assert (300, PROMPT_END, False) in snaps
    assert (339, int(SnapshotKind.ENDPOINT), False) in snaps
    dropped = prompt + rand_tokens(rng, 20)
    echoed = prompt + out.token_ids + rand_tokens(rng, 20)
    for p, resumed in ((dropped, 300), (echoed, 339)):
        got = run(llm, p, 6)
        assert got.usage.cached_tokens == resumed
        assert got.token_ids == run(cold, p, 6).token_ids
    assert_idle(llm)


def test_a_short_reply_keeps_both_prompt_end_and_a_far_enough_endpoint(make_llm):
    """A 10-token reply: the endpoint is under 64 tokens past the tail tap, so only the prompt
    end is new; the echoing client resumes there, 9 tokens before its endpoint would be."""
    rng = random.Random(2)
    llm = make_llm()
    prompt = rand_tokens(rng, 200)
    out = run(llm, prompt, 10)
    assert [f for f, k, _ in snapshots(llm) if k == PROMPT_END] == [200]
    echo = run(llm, prompt + out.token_ids + rand_tokens(rng, 5), 4)
    assert echo.usage.cached_tokens == 200
    assert_idle(llm)


def test_a_retry_stages_no_second_prompt_end(make_llm):
    """The same prompt again resumes below its end (a full hit is never served) and finds its
    prompt end there: no second copy is staged (no slot taken, nothing displaced)."""
    rng = random.Random(3)
    llm = make_llm()
    prompt = rand_tokens(rng, 250)
    first = run(llm, prompt, 8)
    index = llm.engine.kv_state.index
    staged, allocate = [], index.allocate_snapshot_slot

    def spy(lane, frontier, kind):
        staged.append((frontier, int(kind)))
        return allocate(lane, frontier, kind)

    index.allocate_snapshot_slot = spy
    again = run(llm, prompt, 8)
    assert again.token_ids == first.token_ids
    assert not [f for f, k in staged if k == PROMPT_END], staged
    fresh = run(llm, rand_tokens(rng, 250), 8)  # the spy sees a new prompt's end
    assert fresh.usage.cached_tokens == 0 and (250, PROMPT_END) in staged
    assert_idle(llm)


def test_a_chat_that_drops_its_replies_resumes_at_the_opener(make_llm, demo_text, cold):
    """Through the template: the next prompt diverges at the previous generation opener, which
    is tapped exactly; the prompt end, a few tokens past the opener, is not taken."""
    _, template = demo_text
    rng = random.Random(4)
    llm = make_llm()
    words = ["river", "bridge", "city", "north", "stone", "light", "market", "tower"]
    conv = [{"role": "system", "content": "You answer briefly. " * 30}]
    opener = None
    for _ in range(4):
        text = " ".join(rng.choice(words) for _ in range(rng.randrange(5, 40)))
        conv = [*conv, {"role": "user", "content": text}]
        rendered = template.render(conv, enable_thinking=False)
        out = llm.chat([conv], greedy(12), enable_thinking=False)[0]
        if opener is not None:
            assert out.usage.cached_tokens == opener
        assert out.token_ids == cold.chat([conv], greedy(12), enable_thinking=False)[0].token_ids
        opener = rendered.hints.opener
    assert not [s for s in snapshots(llm) if s[1] == PROMPT_END]
    assert_idle(llm)


def test_forks_after_a_long_cold_prompt_resume_at_its_end(make_llm, cold):
    """Sub-agents that each extend the same long prompt (sent once, cold) resume at its end."""
    rng = random.Random(5)
    llm = make_llm(prefill_chunk=256)
    preamble = rand_tokens(rng, 900)
    run(llm, preamble, 16)
    for _ in range(3):
        fork = preamble + rand_tokens(rng, rng.randrange(10, 80))
        out = run(llm, fork, 8)
        assert out.usage.cached_tokens == 900
        assert out.token_ids == run(cold, fork, 8).token_ids
    assert_idle(llm)


def test_prompt_end_snapshots_survive_a_restart(make_llm, tmp_path):
    """Saved in the prefix cache file with their kind, and resumed from after a restart."""
    rng = random.Random(6)
    path = tmp_path / "cache.ninfer"
    prompt = rand_tokens(rng, 330)
    llm = make_llm(prefix_cache_file=str(path))
    run(llm, prompt, 30)
    assert (330, PROMPT_END, False) in snapshots(llm)
    llm.close()
    again = make_llm(prefix_cache_file=str(path))
    assert (330, PROMPT_END, False) in snapshots(again)
    out = run(again, prompt + rand_tokens(rng, 12), 4)
    assert out.usage.cached_tokens == 330
    assert_idle(again)
