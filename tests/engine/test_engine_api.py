"""The public API through the engine: sampling, stop rules, logprobs, streaming, bad requests."""

from __future__ import annotations

import math
import random

import pytest
from engine_helpers import assert_idle, greedy, rand_tokens, reference_greedy

from ninfer.request import EngineError, RequestOutput, SamplingParams, StreamDelta


@pytest.fixture
def llm(make_llm):
    return make_llm()


def test_single_prompt_forms(llm, tiny_model, demo_text):
    tok, _ = demo_text
    ids = tok.encode("Hello there, how are you today?")
    expect = reference_greedy(tiny_model, ids, 6)
    for form in (
        ids,
        {"prompt_token_ids": ids},
        "Hello there, how are you today?",
        {"prompt": "Hello there, how are you today?", "cache_breakpoints": [3]},
    ):
        (out,) = llm.generate(form, greedy(6))
        assert out.token_ids == expect and out.prompt_token_ids == ids
        assert out.text == tok.decode(expect, skip_special_tokens=True)
        assert out.finish_reason == "length" and out.usage.completion_tokens == 6
        assert out.metrics.ttft_s > 0 and out.metrics.queued_s >= 0
    assert_idle(llm)


def test_chat_single_and_batch(llm, demo_text):
    _, template = demo_text
    conv = [{"role": "user", "content": "Hi!"}]
    (one,) = llm.chat(conv, greedy(5), enable_thinking=False)
    assert one.prompt_token_ids == template.render(conv, enable_thinking=False).token_ids
    both = llm.chat([conv, [{"role": "user", "content": "Bye"}]], greedy(5))
    assert len(both) == 2 and all(o.finish_reason == "length" for o in both)


def test_seeded_sampling_is_reproducible(llm):
    prompt = rand_tokens(random.Random(0), 40)
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True)
    a = llm.generate([prompt], p)[0].token_ids
    b = llm.generate([prompt, prompt], [p, SamplingParams(max_tokens=12, seed=8)])
    assert a == b[0].token_ids != b[1].token_ids
    top1 = SamplingParams(max_tokens=12, temperature=0.7, top_k=1, ignore_eos=True)
    assert (
        llm.generate([prompt], top1)[0].token_ids == llm.generate([prompt], greedy(12))[0].token_ids
    )


def test_stop_token_ids_and_stop_strings(llm, demo_text):
    tok, _ = demo_text
    prompt = rand_tokens(random.Random(1), 30)
    full = llm.generate([prompt], greedy(20))[0]
    stop_id = full.token_ids[5]
    first = full.token_ids.index(stop_id)
    out = llm.generate(
        [prompt], SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[stop_id])
    )[0]
    assert out.finish_reason == "stop" and out.token_ids == full.token_ids[: first + 1]
    text = full.text
    needle = text[len(text) // 2 : len(text) // 2 + 3]
    cut = text.index(needle)
    out = llm.generate([prompt], SamplingParams(max_tokens=20, temperature=0, stop=[needle]))[0]
    assert out.finish_reason == "stop" and out.text == text[:cut]
    assert needle not in out.text


def test_logprobs(llm):
    prompt = rand_tokens(random.Random(2), 20)
    out = llm.generate([prompt], SamplingParams(max_tokens=5, temperature=0, logprobs=3))[0]
    assert len(out.logprobs) == 5
    for chosen, row in zip(out.token_ids, out.logprobs, strict=True):
        assert chosen in row and 3 <= len(row) <= 4
        assert all(v <= 0 for v in row.values())
        assert row[chosen] == max(row.values())  # greedy picks the most likely token
        assert math.isfinite(sum(row.values()))
    assert llm.generate([prompt], greedy(2))[0].logprobs is None


def test_stream_deltas_then_final(llm):
    prompt = rand_tokens(random.Random(3), 50)
    events = list(llm.stream(prompt, greedy(8)))
    *deltas, final = events
    assert isinstance(final, RequestOutput) and all(isinstance(d, StreamDelta) for d in deltas)
    assert [t for d in deltas for t in d.token_ids] == final.token_ids
    assert "".join(d.text for d in deltas) == final.text
    assert final.token_ids == llm.generate([prompt], greedy(8))[0].token_ids


def test_bad_single_requests_raise_naming_the_field(make_llm):
    llm = make_llm(max_model_len=256)
    cases = [
        ("", "prompt"),
        ({"prompt_token_ids": []}, "prompt"),
        ([5, 99999], "prompt_token_ids"),
        ([5, -1], "prompt_token_ids"),
        (list(range(4, 304)), "max_model_len"),
        ({"prompt_token_ids": [5, 6], "cache_breakpoints": [9]}, "cache_breakpoints"),
    ]
    for prompt, field in cases:
        with pytest.raises(ValueError, match=field):
            llm.generate(prompt, greedy(4))
    with pytest.raises(ValueError, match="max_tokens"):
        llm.generate([5, 6, 7], SamplingParams(max_tokens=0))
    with pytest.raises(ValueError, match="prompt"):
        list(llm.stream("", greedy(3)))
    assert llm.generate([5, 6, 7], greedy(3))[0].finish_reason == "length"  # still serving


def test_bad_request_inside_a_batch_is_an_error_output(llm):
    good = rand_tokens(random.Random(4), 30)
    outs = llm.generate([good, [5, 999999], good], greedy(4))
    assert [o.finish_reason for o in outs] == ["length", "error", "length"]
    assert "prompt_token_ids" in outs[1].error and outs[1].token_ids == []
    assert outs[0].token_ids == outs[2].token_ids
    params = [greedy(4), SamplingParams(max_tokens=0), greedy(4)]
    outs = llm.generate([good, good, good], params)
    assert [o.finish_reason for o in outs] == ["length", "error", "length"]
    assert "max_tokens" in outs[1].error
    assert_idle(llm)


def test_max_model_len_ends_generation(make_llm):
    llm = make_llm(max_model_len=128)
    out = llm.generate([rand_tokens(random.Random(5), 120)], greedy(50))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 8


def test_close_and_context_manager(make_llm):
    with make_llm() as llm:
        assert llm.generate([[5, 6, 7]], greedy(2))[0].finish_reason == "length"
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate([[5, 6, 7]], greedy(2))
    with pytest.raises(RuntimeError, match="closed"):
        llm.cache_stats()
    with pytest.raises(RuntimeError, match="closed"):
        llm.memory_ledger()
    # the pools, graphs and model are dropped with the loop, so their memory can be reused
    assert llm.engine.kv_state is None and llm.engine.runner is None


def test_engine_failure_answers_everyone(make_llm):
    llm = make_llm()

    def boom(engine):
        raise RuntimeError("injected fault")

    llm.engine.on_step = boom
    outs = llm.generate([[5, 6, 7], [8, 9]], greedy(2))
    assert [o.finish_reason for o in outs] == ["error", "error"]
    assert "injected fault" in outs[0].error
    with pytest.raises(EngineError, match="injected fault"):  # not ValueError: not its fault
        llm.generate([5, 6, 7], greedy(2))
    llm.engine.on_step = None  # the fault was contained: the engine still serves
    assert llm.generate([[5, 6, 7]], greedy(2))[0].finish_reason == "length"
    assert_idle(llm)


def test_ledger_and_config(llm):
    ledger = llm.memory_ledger()
    cfg = llm.engine_config
    assert ledger["kv_pages"] == cfg.memory.kv_pages == 256
    # with a Host tier (the fixture's 16 MiB): D = C + 1, 8 taps (spec §14.2)
    assert ledger["state_slots_active"] == 4 and ledger["state_slots_snapshot"] == 5
    assert ledger["host_tier"] is True and ledger["host_bytes"] == 16 << 20
    info = cfg.describe()
    assert info["device_snapshot_slots"] == 5 and info["cache_taps_per_request"] == 8


def test_a_blocked_head_with_no_lane_is_retried_without_spinning(make_llm):
    """The FIFO head blocked while nothing runs (as when its pages are still Filling): the loop
    retries it every BLOCKED_RETRY_S, not thousands of times, and serves it once unblocked."""
    import time

    from engine_helpers import rand_tokens, run

    from ninfer.engine.engine import BLOCKED_RETRY_S
    from ninfer.engine.kv.admitter import Verdict

    llm = make_llm(check_invariants=False)  # a spinning loop's steps are then fast
    engine = llm.engine
    real = engine.kv_state.try_admit
    hold_s = 0.2
    until = time.perf_counter() + hold_s

    def gate(job, lanes):
        return Verdict() if time.perf_counter() < until else real(job, lanes)

    engine.kv_state.try_admit = gate
    before = engine.steps
    out = run(llm, rand_tokens(__import__("random").Random(5), 40), 3)
    assert out.error is None and len(out.token_ids) == 3
    assert engine.steps - before < 2 * hold_s / BLOCKED_RETRY_S  # spinning: tens of thousands


def test_the_engine_builds_a_submitted_prompts_block_keys(make_llm):
    """`Engine.submit` hashes the prompt's blocks (the facade hands it the token ids alone), so
    a job submitted to the engine directly is served from the cache like any other."""
    import queue

    from ninfer.cache.keys import prepare_prompt
    from ninfer.engine.request import PromptHints, Request

    llm = make_llm()
    prompt = rand_tokens(random.Random(11), 200)
    first = llm.generate([prompt], greedy(4))[0]
    job = Request("direct", prompt, greedy(4).validated(), PromptHints(), queue.Queue())
    llm.engine.submit(job)
    assert job.blocks is not None and job.blocks.hashes == prepare_prompt(prompt).hashes
    while not isinstance(out := llm.engine.next_event(job), RequestOutput):
        pass
    assert out.token_ids == first.token_ids and out.usage.cached_tokens >= 128
    off = make_llm(prefix_reuse=False, host_cache_mib=0)
    job = Request("direct", prompt, greedy(4).validated(), PromptHints(), queue.Queue())
    off.engine.submit(job)
    assert job.blocks is None and off.engine.next_event(job).token_ids == first.token_ids
    assert_idle(llm)
