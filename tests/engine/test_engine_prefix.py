"""Prefix-cache scenarios (spec §13.3) on the tiny model: every cached output is token-identical
to the same request on an engine with prefix_reuse=False, and each scenario resumes exactly
where the spec says. Cache and memory invariants are checked after every engine step."""

from __future__ import annotations

import queue
import random

import pytest
from engine_helpers import assert_idle, distinct_blocks, greedy, rand_tokens, run

from ninfer.cache.common import SnapshotKind
from ninfer.cache.taps import TapConfig, plan_taps
from ninfer.engine.kv import pages


@pytest.fixture
def cold(make_llm):
    return make_llm(prefix_reuse=False)


def test_multi_turn_exact_endpoint(make_llm, cold):
    rng = random.Random(1)
    llm = make_llm()
    prompt = rand_tokens(rng, 200)
    prev_len = 0
    for turn in range(3):
        out = run(llm, prompt, 80)
        assert out.token_ids == run(cold, prompt, 80).token_ids
        if turn:
            # the client echoed the previous reply: resume at its endpoint F_end = n + 80 - 1
            assert out.usage.cached_tokens == prev_len + 80 - 1
        prev_len = len(prompt)
        prompt = prompt + out.token_ids + rand_tokens(rng, 50)
    assert_idle(llm)


def test_rerendered_history_resumes_at_opener(make_llm, cold, demo_text):
    _, template = demo_text
    system = {"role": "system", "content": "You are a helpful assistant. " * 6}
    user1 = {"role": "user", "content": "Tell me about the history of Paris and its rivers. " * 4}
    conv1 = [system, user1]
    opener = template.render(conv1, enable_thinking=True).hints.opener
    llm = make_llm()
    out1 = llm.chat([conv1], greedy(80))[0]
    assert out1.token_ids == cold.chat([conv1], greedy(80))[0].token_ids
    reply = {"role": "assistant", "content": "<think>\nnoise\n</think>\n\n" + out1.text}
    conv2 = [*conv1, reply, {"role": "user", "content": "And Lyon?"}]
    out2 = llm.chat([conv2], greedy(20))[0]
    assert out2.usage.cached_tokens == opener  # thinking stripped: the opener tap serves
    assert out2.token_ids == cold.chat([conv2], greedy(20))[0].token_ids
    assert_idle(llm)


def test_edit_deep_in_history_resumes_at_ladder_tap(make_llm, cold):
    rng = random.Random(2)
    llm = make_llm(cache_tap_ladder=128, cache_tap_min_gap=64, cache_taps_per_request=8)
    prompt = rand_tokens(rng, 700)
    run(llm, prompt, 5)
    taps = [t.position for t in plan_taps(700, 0, config=TapConfig(8, 128, 64))]
    edit = 400
    edited = prompt[:edit] + [prompt[edit] + 1] + prompt[edit + 1 :]
    out = run(llm, edited, 10)
    assert out.usage.cached_tokens == max(p for p in taps if p <= edit) == 384
    assert out.token_ids == run(cold, edited, 10).token_ids
    assert_idle(llm)


def test_shared_system_block_across_8_sessions(make_llm, cold):
    rng = random.Random(3)
    llm = make_llm(max_concurrency=8)
    system = rand_tokens(rng, 300)

    def session(i):
        return {"prompt_token_ids": system + rand_tokens(rng, 40 + i), "cache_breakpoints": [300]}

    warm = session(0)
    first = run(llm, warm, 8)
    sessions = [session(i) for i in range(1, 9)]
    outs = llm.generate(sessions, greedy(8))
    assert [o.usage.cached_tokens for o in outs] == [300] * 8  # all hit the shared block
    expect = cold.generate(sessions, greedy(8))
    assert [o.token_ids for o in outs] == [o.token_ids for o in expect]
    # shared pages are stored once: one node per distinct committed block prefix
    committed = [
        (s["prompt_token_ids"] + o.token_ids)[:-1]
        for s, o in zip([warm, *sessions], [first, *outs], strict=True)
    ]
    stats = llm.cache_stats()
    assert stats.nodes == stats.nodes_device == distinct_blocks(committed)
    assert_idle(llm)


@pytest.mark.parametrize("concurrent", [False, True], ids=["serial-prefill", "concurrent-prefill"])
def test_8_identical_prompts_together(make_llm, cold, concurrent):
    rng = random.Random(4)
    llm = make_llm(max_concurrency=8, concurrent_prefill=concurrent)
    prompt = rand_tokens(rng, 300)
    outs = llm.generate([prompt] * 8, greedy(10))
    expect = run(cold, prompt, 10).token_ids
    assert all(o.token_ids == expect for o in outs)
    # serial: the next lane is admitted once the first finished prefilling, from its prompt-tail
    # tap; concurrent: the heads coalesce (§12.2) and wait for that same snapshot
    assert [o.usage.cached_tokens for o in outs] == [0] + [256] * 7
    assert llm.memory_ledger()["coalesced_waits"] == (1 if concurrent else 0)  # the FIFO head
    assert llm.cache_stats().blocks_duplicate == 0
    assert_idle(llm)


def test_coalescing_waits_for_the_divergence_snapshot(make_llm, cold):
    rng = random.Random(11)
    llm = make_llm(max_concurrency=4, concurrent_prefill=True)
    shared = rand_tokens(rng, 290)
    batch = [shared + rand_tokens(rng, 100 + i) for i in range(4)]
    outs = llm.generate(batch, greedy(6))
    assert [o.usage.cached_tokens for o in outs] == [0, 256, 256, 256]
    assert [o.token_ids for o in outs] == [o.token_ids for o in cold.generate(batch, greedy(6))]
    assert llm.memory_ledger()["coalesced_waits"] == 1  # only the head ever waits
    assert_idle(llm)


def test_retry_of_long_prompt_uses_prompt_tail_tap(make_llm, cold):
    rng = random.Random(5)
    llm = make_llm()
    prompt = rand_tokens(rng, 500)
    first = run(llm, prompt, 6)
    again = run(llm, prompt, 6)
    assert first.usage.cached_tokens == 0
    assert again.usage.cached_tokens == 448  # floor_page(n - 1): the start of the final chunk
    assert again.usage.cached_prefix_tokens == 448
    assert first.token_ids == again.token_ids == run(cold, prompt, 6).token_ids
    assert_idle(llm)


def test_cancel_mid_prefill_publishes_and_next_request_reuses(make_llm, cold):
    rng = random.Random(6)
    llm = make_llm(max_concurrency=1)
    prompt = rand_tokens(rng, 640)
    engine = llm.engine

    def cancel_at_320(eng):  # the one request's lane (max_concurrency=1)
        for lane in eng.lanes:
            if lane.computed >= 320:
                llm.cancel(lane.request.request_id)

    finals: queue.Queue = queue.Queue()
    engine.on_step = cancel_at_320
    llm.submit(llm.render_prompt(prompt), greedy(5), on_event=finals.put, stream=False)
    out = finals.get(timeout=60)
    engine.on_step = None
    assert out.finish_reason == "abort" and out.token_ids == []
    stats = llm.cache_stats()
    assert stats.nodes == 5 and stats.snapshots == 1  # blocks 0..4 and the endpoint at 320
    assert_idle(llm)
    again = run(llm, prompt, 5)
    assert again.usage.cached_tokens == 320
    assert again.token_ids == run(cold, prompt, 5).token_ids


def test_stream_close_cancels_and_leaks_no_pin(make_llm, cold):
    rng = random.Random(7)
    llm = make_llm()
    prompt = rand_tokens(rng, 150)
    it = llm.stream(prompt, greedy(100))
    got = [next(it).token_ids[0] for _ in range(70)]
    it.close()  # returns once the abort is settled
    assert_idle(llm)
    expect = run(cold, prompt, 100).token_ids
    assert got == expect[:70]
    # the aborted lane (it may have run ahead of the reader) published its endpoint
    index = llm.engine.kv_state.index
    ends = [s.frontier for s in index.snapshots.by_id.values() if s.kind == SnapshotKind.ENDPOINT]
    assert len(ends) == 1 and 150 + 70 - 1 <= ends[0] < 150 + 100
    echoed = prompt + expect[: ends[0] - 150 + 1]
    again = run(llm, echoed, 10)
    assert again.usage.cached_tokens == ends[0]
    assert again.token_ids == run(cold, echoed, 10).token_ids
    assert_idle(llm)


def test_pressure_active_growth_evicts_cache(make_llm):
    rng = random.Random(8)
    llm = make_llm(kv_capacity=16 * 64, max_concurrency=2, host_cache_mib=0)  # unbacked
    roomy = make_llm(kv_capacity=200 * 64, max_concurrency=2, prefix_reuse=False)
    for _ in range(3):
        run(llm, rand_tokens(rng, 200), 10)
    # 3 blocks each, and the tail page of a prompt-end snapshot (200 tokens: 8 past the tap at
    # 192) where one kept its slot
    assert 9 < llm.cache_stats().device_cached_pages <= 12
    prompt = rand_tokens(rng, 100)
    # entitled to 10 pages (100 + 512 tokens), grows to 11 (700 tokens) by evicting cache
    out = run(llm, prompt, 600)
    assert out.finish_reason == "length" and len(out.token_ids) == 600
    assert out.token_ids == run(roomy, prompt, 600).token_ids
    stats = llm.cache_stats()
    assert stats.device_evicted_unbacked > 0 and stats.subtree_deletions > 0
    assert_idle(llm)


def test_suspension_when_pool_cannot_extend(make_llm, monkeypatch):
    monkeypatch.setattr(pages, "OUTPUT_WINDOW", 64)  # admissions reserve 64 output tokens
    rng = random.Random(9)
    llm = make_llm(kv_capacity=6 * 64, max_concurrency=2, host_cache_mib=0)  # unbacked
    roomy = make_llm(kv_capacity=200 * 64, max_concurrency=2, prefix_reuse=False)
    prompts_ = [rand_tokens(rng, 100), rand_tokens(rng, 100)]
    outs = llm.generate(prompts_, greedy(250))
    expect = roomy.generate(prompts_, greedy(250))
    # Both lanes draw their 3-page entitlement (100 + 64 tokens) from the 6-page pool. The
    # lane that first needs a 4th page is suspended through its endpoint snapshot; its
    # release lets the other one grow to the end, then it resumes from the snapshot and ends
    # at max_tokens too, with the tokens of an uninterrupted run.
    assert [o.finish_reason for o in outs] == ["length", "length"]
    assert [o.token_ids for o in outs] == [e.token_ids for e in expect]
    assert [o.metrics.suspensions for o in outs] == [1, 0]
    assert llm.cache_stats().suspensions == 1
    assert llm.cache_stats().device_evicted_unbacked > 0
    assert_idle(llm)


def test_disabled_cache_makes_no_nodes_or_snapshots(make_llm):
    rng = random.Random(10)
    llm = make_llm(prefix_reuse=False)
    prompt = rand_tokens(rng, 200)
    for _ in range(2):
        out = run(llm, prompt, 70)
        assert out.usage.cached_tokens == 0 and out.usage.cached_prefix_tokens == 0
        prompt = prompt + out.token_ids
    stats = llm.cache_stats()
    assert stats.nodes == stats.snapshots == stats.lookups == 0
    assert llm.memory_ledger()["kv_pages_cached"] == 0
    assert_idle(llm)
