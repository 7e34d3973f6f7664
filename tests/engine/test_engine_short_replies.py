"""Taps near the end of a prompt survive a short reply (spec §7.4, §7.7): a finishing lane
publishes its pending taps from its own last page, the endpoint is measured against the deepest
*published* snapshot, and a tap that is dropped or skipped does not supersede the snapshot the
request resumed from. Engine on the CPU (tiny model, demo tokenizer and chat template)."""

from __future__ import annotations

import random

from engine_helpers import assert_idle, greedy, rand_tokens, run
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ninfer.cache.common import SnapshotKind

_SETTINGS = settings(
    max_examples=4,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),  # an engine run per example
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def snapshots(llm) -> list[tuple[int, int, bool]]:
    """(frontier, kind, superseded) of every snapshot in the index, sorted."""

    def read():
        snaps = llm.engine.kv_state.index.snapshots.by_id.values()
        return sorted((s.frontier, int(s.kind), s.superseded) for s in snaps)

    return llm.engine.call(read)


def _user(rng: random.Random, words: int) -> dict:
    vocab = ["river", "bridge", "city", "north", "stone", "light", "market", "tower", "garden"]
    return {"role": "user", "content": " ".join(rng.choice(vocab) for _ in range(words))}


def chat_turns(llm, template, replies: list[int], seed: int) -> list[tuple[int, int, int]]:
    """A conversation re-rendered through the template each turn, replies of the given lengths;
    per turn (prompt tokens, its generation opener, cached tokens)."""
    rng = random.Random(seed)
    conv = [{"role": "system", "content": "You answer briefly. " * 8}, _user(rng, 30)]
    out = []
    for n in replies:
        rendered = template.render(conv, enable_thinking=True)
        got = llm.chat([conv], greedy(n))[0]
        assert got.finish_reason == "length" and len(got.token_ids) == n
        out.append((len(rendered.token_ids), rendered.hints.opener, got.usage.cached_tokens))
        conv = [*conv, {"role": "assistant", "content": got.text}, _user(rng, rng.randrange(3, 12))]
    return out


@_SETTINGS
@given(replies=st.lists(st.integers(1, 80), min_size=3, max_size=5), seed=st.integers(0, 99))
def test_chat_turns_resume_at_or_beyond_the_previous_opener(make_llm, demo_text, replies, seed):
    _, template = demo_text
    llm = make_llm()
    turns = chat_turns(llm, template, replies, seed)
    for (_, opener, _), (_, _, cached) in zip(turns, turns[1:], strict=False):
        assert opener is not None and cached >= opener, turns
    assert_idle(llm)


def test_short_reply_keeps_the_opener_of_a_long_turn(make_llm, demo_text):
    """The issue's case: a turn whose opener sits inside a block the reply never fills."""
    _, template = demo_text
    llm = make_llm()
    turns = chat_turns(llm, template, [40, 12, 12, 3], seed=5)
    for (_, opener, _), (_, _, cached) in zip(turns, turns[1:], strict=False):
        assert cached >= opener, turns
    assert any(opener % 64 and (opener // 64 + 1) * 64 > n + 12 for n, opener, _ in turns[1:])
    assert_idle(llm)


@_SETTINGS
@given(replies=st.lists(st.integers(1, 80), min_size=3, max_size=6), seed=st.integers(0, 99))
def test_agent_echo_resumes_at_the_previous_endpoint(make_llm, replies, seed):
    """The client echoes every generated token: each turn resumes at F_end of the previous, or
    (§7.7: an endpoint under 64 tokens past the deepest snapshot is not published) at that
    snapshot, fewer than 64 tokens before it."""
    rng = random.Random(seed)
    llm = make_llm()
    prompt = rand_tokens(rng, rng.randrange(100, 300))
    prev_end = None
    for n in replies:
        before = snapshots(llm)
        out = run(llm, prompt, n)
        if prev_end is not None:
            cached = out.usage.cached_tokens
            published = any(f == prev_end for f, _, _ in before)
            assert cached == prev_end if published else prev_end - 64 < cached < prev_end
        prev_end = len(prompt) + n - 1  # the last sampled token is not computed
        prompt = prompt + out.token_ids + rand_tokens(rng, rng.randrange(2, 20))
    assert_idle(llm)


def test_breakpoint_near_the_end_survives_a_ten_token_reply(make_llm):
    """The issue's case: a 200-token prompt, a breakpoint at 195, a 10-token reply."""
    rng = random.Random(3)
    llm = make_llm()
    prompt = rand_tokens(rng, 200)
    out = llm.generate([{"prompt_token_ids": prompt, "cache_breakpoints": [195]}], greedy(10))[0]
    assert (195, int(SnapshotKind.BOUNDARY), False) in snapshots(llm)
    retry = run(llm, prompt[:195] + rand_tokens(rng, 30), 4)
    assert retry.usage.cached_tokens == 195
    echo = run(llm, prompt + out.token_ids + rand_tokens(rng, 5), 4)
    # the endpoint (209) is under 64 past the tap: the echo resumes at the prompt end
    assert echo.usage.cached_tokens == 200
    assert_idle(llm)


def test_a_dropped_tap_does_not_supersede_the_source(make_llm):
    """A lane that resumed from a snapshot and then lost its only tap (no page for its tail
    copy) leaves that snapshot retained and in the saved set."""
    rng = random.Random(4)
    llm = make_llm()
    prompt = rand_tokens(rng, 130)
    run(llm, prompt, 2)  # tail tap at 128, the prompt end at 130, no endpoint (under 64 past)
    tap, prompt_end = (
        (128, int(SnapshotKind.TAP), False),
        (130, int(SnapshotKind.PROMPT_END), False),
    )
    assert snapshots(llm) == [tap, prompt_end]

    def no_tail_pages():  # every later tail copy finds no page
        kv_state = llm.engine.kv_state
        kv_state.budget.headroom = lambda: 0

    llm.engine.call(no_tail_pages)
    out = llm.generate(
        [{"prompt_token_ids": prompt + rand_tokens(rng, 20), "cache_breakpoints": [140]}],
        greedy(2),
    )[0]
    assert out.usage.cached_tokens == 130
    assert prompt_end in snapshots(llm)


def test_host_tier_resume_after_the_conversation_left_the_device(make_llm, demo_text):
    """The first conversation is pushed off the Device by others, then resumed from Host at
    or beyond its opener."""
    tok, template = demo_text
    llm = make_llm(kv_capacity=1536, device_snapshot_slots=2, max_concurrency=2)
    rng = random.Random(6)
    conv = [{"role": "system", "content": "You answer briefly. " * 8}, _user(rng, 54)]
    rendered = template.render(conv, enable_thinking=True)
    opener = rendered.hints.opener  # 150 of 157: in a block the one-token reply never fills
    assert opener // 64 == (len(rendered.token_ids) + 1) // 64
    first = llm.chat([conv], greedy(1))[0]  # a one-token reply: the opener block never fills
    for k in range(4):  # other conversations fill the Device pool and the snapshot slots
        run(llm, rand_tokens(random.Random(100 + k), 700), 3)
    conv2 = [*conv, {"role": "assistant", "content": first.text}, _user(rng, 5)]
    out = llm.chat([conv2], greedy(5))[0]
    assert out.usage.cached_tokens >= opener
    assert out.usage.restored_host_bytes > 0  # it came back from the Host tier
    assert_idle(llm)
