"""Overlapped decode (`overlap_decode`, ninfer/engine/stepper.py): the next decode step is launched
before the previous one's tokens are read, its input ids fed on the device. The plain engine
(`overlap_decode=False`) is the oracle: same tokens, texts, finish reasons, logprobs, streams
and cache hits, on a workload with every way a lane can stop (EOS, stop token, stop string,
max_tokens, cancellation) and with later requests resuming from what the overlapped lanes
published (an endpoint that absorbed the extra decode step of a stopped lane included)."""

from __future__ import annotations

import random

import pytest
from engine_helpers import assert_idle, rand_tokens, reference_greedy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer.request import SamplingParams


def _params(rng: random.Random, stop_token: int | None) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=23, temperature=0, ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=40, temperature=0, stop_token_ids=[stop_token]),
        SamplingParams(max_tokens=70, temperature=0.9, top_p=0.9, seed=5, ignore_eos=True),
        SamplingParams(max_tokens=30, temperature=0, stop=["e"]),
        SamplingParams(max_tokens=1, temperature=0),
        SamplingParams(max_tokens=66, temperature=0),  # EOS allowed
    ]


def _workload(tiny_model):
    rng = random.Random(11)
    shared = rand_tokens(rng, 150)
    prompts = [shared + rand_tokens(rng, n) for n in (5, 40, 77, 3, 64, 20, 9)]
    # the 7th greedy token of prompt 2 stops it: a lane stops on a token mid-decode
    stop_token = reference_greedy(tiny_model, prompts[2], 7)[-1]
    return prompts, _params(rng, stop_token)


def _summary(outs):
    return [
        (o.token_ids, o.text, o.finish_reason, o.usage.completion_tokens, o.usage.cached_tokens)
        for o in outs
    ]


def _logprobs(outs):
    return [o.logprobs for o in outs]


@pytest.mark.parametrize("max_concurrency", [1, 4])
def test_overlap_gives_the_plain_engines_outputs(make_llm, tiny_model, max_concurrency):
    prompts, params = _workload(tiny_model)
    runs = {}
    for overlap in (False, True):
        llm = make_llm(overlap_decode=overlap, max_concurrency=max_concurrency)
        first = llm.generate(prompts, params)
        # second round: every prompt extended by its own output resumes from the cache
        follow = [p + o.token_ids + [17, 18, 19] for p, o in zip(prompts, first, strict=True)]
        second = llm.generate(follow, params)
        assert_idle(llm)
        runs[overlap] = (first, second, llm.engine.overlapped_steps)
    (a1, a2, plain_n), (b1, b2, over_n) = runs[False], runs[True]
    assert plain_n == 0 and over_n > 20
    assert _summary(a1) == _summary(b1) and _summary(a2) == _summary(b2)
    for x, y in zip(_logprobs(a1 + a2), _logprobs(b1 + b2), strict=True):
        assert (x is None) == (y is None)
        if x is not None:
            for rx, ry in zip(x, y, strict=True):
                assert rx.keys() == ry.keys()
                assert all(abs(rx[k] - ry[k]) < 1e-5 for k in rx)
    assert b1[2].finish_reason == "stop" and len(b1[2].token_ids) == 7
    assert sum(o.usage.cached_tokens for o in b2) > 0


def test_a_stopped_lanes_endpoint_resumes_exactly(make_llm, tiny_model):
    """The lane stopped on its 7th token ran one more step on it; the endpoint it published
    covers that token, and a request continuing the conversation resumes from it and gives
    the cold greedy tokens."""
    prompts, params = _workload(tiny_model)
    llm = make_llm(overlap_decode=True)
    (out,) = llm.generate([prompts[2]], params[2])
    assert out.finish_reason == "stop"
    history = prompts[2] + out.token_ids
    follow = history + [21, 22]
    (again,) = llm.generate([follow], SamplingParams(max_tokens=9, temperature=0, ignore_eos=True))
    assert again.usage.cached_tokens >= len(history) - 64
    assert again.token_ids == reference_greedy(tiny_model, follow, 9)
    assert_idle(llm)


def test_streams_and_cancellation_under_overlap(make_llm):
    llm = make_llm(overlap_decode=True, max_concurrency=2)
    rng = random.Random(3)
    prompt = rand_tokens(rng, 70)
    p = SamplingParams(max_tokens=25, temperature=0, ignore_eos=True)
    (plain,) = llm.generate([prompt], p)
    pieces = list(llm.stream(prompt, p))
    streamed = [t for d in pieces[:-1] for t in d.token_ids]
    assert streamed == plain.token_ids == pieces[-1].token_ids
    # cancel after a few deltas: the lane ends as "abort", the engine keeps serving
    it = llm.stream(prompt, SamplingParams(max_tokens=500, temperature=0, ignore_eos=True))
    for _ in range(4):
        next(it)
    it.close()
    (after,) = llm.generate([prompt], p)
    assert after.token_ids == plain.token_ids
    assert_idle(llm)


@st.composite
def _workloads(draw):
    """A few requests over a shared stem (cache hits), each with its own stop rules."""
    n = draw(st.integers(1, 5))
    stem = draw(st.lists(st.integers(4, 2000), min_size=0, max_size=130))
    prompts, params = [], []
    for _ in range(n):
        tail = draw(st.lists(st.integers(4, 2000), min_size=1, max_size=70))
        prompts.append(stem + tail)
        params.append(
            SamplingParams(
                max_tokens=draw(st.integers(1, 40)),
                temperature=0,
                ignore_eos=draw(st.booleans()),
                stop_token_ids=draw(st.lists(st.integers(4, 2000), max_size=40)),
            )
        )
    return prompts, params, draw(st.integers(1, 4))


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(_workloads())
def test_overlap_equals_plain_on_random_workloads(make_llm, workload):
    """Random prompts, lengths, stop tokens and concurrency: the overlapped engine gives the
    plain engine's outputs, twice over (the second round resumes from the cache), and leaves
    nothing pinned or leaked."""
    prompts, params, concurrency = workload
    outs = {}
    for overlap in (False, True):
        llm = make_llm(overlap_decode=overlap, max_concurrency=concurrency)
        first = llm.generate(prompts, params)
        second = llm.generate(prompts, params)
        assert_idle(llm)
        outs[overlap] = _summary(first) + _summary(second)
        llm.close()
    assert outs[True] == outs[False]
