"""Hostile requests through the public API (hypothesis): every SamplingParams field and every
request form takes arbitrary JSON-like values. Each request either completes or fails alone
with an error naming the bad field; its neighbours in the batch complete with their own tokens;
the engine never dies."""

from __future__ import annotations

import random

import pytest
from engine_helpers import assert_idle, greedy, rand_tokens
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer.request import SamplingParams

FIELDS = {
    "max_tokens": st.integers(1, 4),
    "temperature": st.sampled_from([0.0, 0.7, 1.0]),
    "top_p": st.sampled_from([1.0, 0.9]),
    "top_k": st.sampled_from([-1, 5]),
    "min_p": st.sampled_from([0.0, 0.1]),
    "seed": st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    "stop": st.one_of(st.none(), st.just(["zz"])),
    "stop_token_ids": st.one_of(st.none(), st.just([7])),
    "ignore_eos": st.booleans(),
    "logprobs": st.one_of(st.none(), st.integers(0, 20)),
}

HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63, 2**64, -(2**63), 10**400, -1, 0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-45, 5e-324, 1e308, -0.0, 1e-6]),
    st.text(max_size=8),
    st.sampled_from(["\ud800", "7", "", "1.0"]),
    st.lists(st.one_of(st.integers(-5, 3000), st.text(max_size=3), st.none()), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@st.composite
def params_kwargs(draw):
    """Valid values for every field, then hostile values in a few of them; returns
    (kwargs, names of the fields given hostile values)."""
    kwargs = {name: draw(s) for name, s in FIELDS.items()}
    bad = draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=2, unique=True))
    for name in bad:
        kwargs[name] = draw(HOSTILE)
    return kwargs, bad


GOOD = rand_tokens(random.Random(11), 20)

PROMPTS = st.one_of(
    st.just(GOOD),
    st.just("hello there"),
    st.just({"prompt": "hi"}),
    HOSTILE,
    st.fixed_dictionaries({"prompt": HOSTILE}),
    st.fixed_dictionaries({"prompt_token_ids": HOSTILE}),
    st.fixed_dictionaries({"prompt_token_ids": st.just(GOOD), "cache_breakpoints": HOSTILE}),
)

FIELD_NAMES = ("prompt", "prompt_token_ids", "cache_breakpoints", "sampling_params", "messages")


def _ok_or_named(out, bad: list[str]) -> None:
    if out.finish_reason == "error":
        assert out.error, "an error output without a message"
        named = [f for f in (*bad, *FIELD_NAMES, "kv_capacity") if f in out.error]
        assert named, f"the error names no field: {out.error!r}"
        assert not out.error.startswith("engine error"), out.error  # a bad request, no fault
    else:
        assert out.finish_reason in ("stop", "length"), (out.finish_reason, out.error)


@pytest.fixture
def fuzz_llm(make_llm):
    return make_llm(max_model_len=256, max_concurrency=4)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=params_kwargs(), prompt=PROMPTS)
def test_hostile_fields_fail_alone_and_name_the_field(fuzz_llm, case, prompt):
    llm = fuzz_llm
    kwargs, bad = case
    params = SamplingParams(**kwargs)
    want = llm.generate([GOOD], greedy(3))[0].token_ids
    outs = llm.generate([GOOD, prompt, GOOD], [greedy(3), params, greedy(3)])
    assert [o.token_ids for o in (outs[0], outs[2])] == [want, want]  # neighbours unharmed
    _ok_or_named(outs[1], bad)
    if not bad and outs[1].finish_reason == "error":  # valid params: only the prompt was bad
        assert any(f in outs[1].error for f in FIELD_NAMES)
    # the same request alone: a ValueError naming the field, or an output
    try:
        single = llm.generate(prompt, params)
    except ValueError as e:
        assert any(f in str(e) for f in (*bad, *FIELD_NAMES, "kv_capacity")), str(e)
    else:
        for out in single:
            _ok_or_named(out, bad)
    assert not llm.engine.stopped


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(content=HOSTILE, role=st.one_of(st.just("user"), HOSTILE), extra=HOSTILE)
def test_hostile_chat_messages_fail_alone(fuzz_llm, content, role, extra):
    llm = fuzz_llm
    good = [{"role": "user", "content": "hi"}]
    bad = [{"role": role, "content": content}, extra]
    outs = llm.chat([good, bad, [{"role": role, "content": content}], good], greedy(2))
    assert outs[0].token_ids == outs[3].token_ids and outs[0].finish_reason == "length"
    for out in outs[1:3]:
        if out.finish_reason == "error":
            assert "messages" in out.error, out.error
    assert not llm.engine.stopped


def test_mutating_params_after_submission_has_no_effect(make_llm):
    llm = make_llm()
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    stream = llm.stream(GOOD, params)
    next(stream)
    params.max_tokens = 2  # a valid value: would cut the request short if read by reference
    params.temperature = float("nan")  # an invalid one: would kill the engine
    *_, final = list(stream)
    assert final.finish_reason == "length" and len(final.token_ids) == 40
    assert_idle(llm)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(seed=2**64), "seed"),
        (dict(seed=1.5, temperature=1.0), "seed"),
        (dict(seed="7"), "seed"),
        (dict(seed=[1]), "seed"),
        (dict(seed=-1), "seed"),
        (dict(logprobs=True), "logprobs"),
        (dict(logprobs=10**9), "logprobs"),
        (dict(max_tokens=True), "max_tokens"),
        (dict(top_k=True), "top_k"),
        (dict(temperature=10**400), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature="1"), "temperature"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(min_p=-0.5), "min_p"),
        (dict(stop=5), "stop"),
        (dict(stop=["ok", "\ud800"]), "stop"),
        (dict(stop_token_ids=7), "stop_token_ids"),
        (dict(stop_token_ids=[True]), "stop_token_ids"),
        (dict(ignore_eos="yes"), "ignore_eos"),
    ],
)
def test_each_bad_field_is_a_value_error_naming_it(make_llm, kwargs, field):
    llm = make_llm()
    with pytest.raises(ValueError, match=field):
        llm.generate(GOOD, SamplingParams(**kwargs))
    out = llm.generate([GOOD, GOOD], [SamplingParams(**kwargs), greedy(2)])
    assert out[0].finish_reason == "error" and field in out[0].error
    assert out[1].finish_reason == "length"


def test_a_tiny_temperature_is_greedy(make_llm):
    llm = make_llm()
    want = llm.generate([GOOD], greedy(6))[0].token_ids
    for t in (1e-45, 5e-324, 1e-6):
        params = SamplingParams(max_tokens=6, temperature=t, ignore_eos=True)
        assert llm.generate([GOOD], params)[0].token_ids == want


def test_lone_surrogates_in_a_prompt_are_a_value_error(make_llm):
    llm = make_llm()
    with pytest.raises(ValueError, match="prompt"):
        llm.generate("bad \ud800 text", greedy(2))
    out = llm.chat([[{"role": "user", "content": "x\udfff"}]], greedy(2))[0]
    assert out.finish_reason == "error" and "messages" in out.error
