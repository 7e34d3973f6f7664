"""The OpenAI surface driven by the real `openai` client: chat, stream, completions, models,
multi-turn cache reuse, tools history, n > 1, metrics."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import MODEL, engine_idle

from ninfer.request import SamplingParams

openai = pytest.importorskip("openai")

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served.base, api_key="unused", max_retries=0, timeout=60)


def _long_user(n_words: int, salt: str) -> str:
    return " ".join(f"{salt}{i % 17} river stone" for i in range(n_words))


def test_models_health_metrics(served, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(served.url + "/health").json() == {"status": "ok"}
    text = httpx.get(served.url + "/metrics").text
    for name in ("ninfer_cache_lookups", "ninfer_cache_pages_total", "ninfer_ttft_seconds"):
        assert name in text


def test_chat_equals_the_engine(served, client):
    """Greedy: the server's reply is the in-process engine's reply, token for token."""
    messages = [{"role": "user", "content": "Name three rivers."}]
    resp = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, extra_body=NO_THINK
    )
    ref = served.llm.chat(
        messages, SamplingParams(max_tokens=12, temperature=0), enable_thinking=False
    )[0]
    choice = resp.choices[0]
    assert choice.message.content == ref.text
    assert choice.finish_reason == ("length" if ref.finish_reason == "length" else "stop")
    assert resp.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert resp.usage.completion_tokens == len(ref.token_ids)
    assert resp.usage.prompt_tokens_details.cached_tokens >= 0  # present, never null


def test_stream_equals_non_stream(served, client):
    messages = [{"role": "user", "content": "Count to five."}]
    kw = dict(model=MODEL, messages=messages, max_tokens=10, temperature=0, extra_body=NO_THINK)
    full = client.chat.completions.create(**kw)
    chunks = list(
        client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == [full.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens_details.cached_tokens
    assert isinstance(usage.prompt_tokens_details.cached_tokens, int)


def test_reasoning_content_when_thinking(served, client):
    """Thinking on (asked for: the demo model's default is off): the reply starts inside
    <think>, so text before any </think> is reasoning_content."""
    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    resp = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=8,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": True}},
    )
    ref = served.llm.chat(messages, SamplingParams(max_tokens=8, temperature=0))[0]
    msg = resp.choices[0].message
    reasoning, _, content = ref.text.partition("</think>")
    assert msg.reasoning_content == reasoning.rstrip("\n")
    assert msg.content == content.lstrip("\n")


def test_multi_turn_reports_cached_tokens(served, client):
    """The second turn resumes from the first turn's cached prefix."""
    first = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": _long_user(60, "mt")},
    ]
    r1 = client.chat.completions.create(
        model=MODEL, messages=first, max_tokens=6, temperature=0, extra_body=NO_THINK
    )
    assert r1.usage.prompt_tokens > 64 + 64
    second = [
        *first,
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "And then?"},
    ]
    r2 = client.chat.completions.create(
        model=MODEL, messages=second, max_tokens=6, temperature=0, extra_body=NO_THINK
    )
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= 64 and cached < r2.usage.prompt_tokens
    engine_idle(served.llm)


def test_completions_equal_the_engine(served, client):
    prompt = "The lake was cold and"
    resp = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=2
    )
    ref = served.llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0, logprobs=2))[0]
    assert resp.choices[0].text == ref.text
    assert resp.usage.completion_tokens == len(ref.token_ids)
    lp = resp.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ref.token_ids)
    assert all(len(top) <= 2 for top in lp.top_logprobs)
    streamed = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == ref.text


def test_chat_logprobs(served, client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body=NO_THINK,
    )
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob)


def test_n_siblings(served, client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Pick a colour."}],
        max_tokens=5,
        temperature=1.0,
        seed=7,
        n=3,
        extra_body=NO_THINK,
    )
    assert [c.index for c in resp.choices] == [0, 1, 2]
    # choice i samples with seed 7 + i: the engine's own reply with that seed
    for i, choice in enumerate(resp.choices):
        params = SamplingParams(max_tokens=5, temperature=1.0, seed=7 + i)
        ref = served.llm.chat(
            [{"role": "user", "content": "Pick a colour."}], params, enable_thinking=False
        )[0]
        assert choice.message.content == ref.text


def test_tool_history_with_json_string_arguments(served, client):
    """OpenAI clients send tool-call arguments as a JSON string; the template needs a mapping.
    The rendered prompt equals the template's rendering of the parsed arguments."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                },
            },
        }
    ]
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "rain, 4 C"},
    ]
    resp = client.chat.completions.create(
        model=MODEL, messages=history, tools=tools, max_tokens=4, temperature=0, extra_body=NO_THINK
    )
    parsed = [dict(m) for m in history]
    parsed[1] = {
        **history[1],
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}},
            }
        ],
    }
    rendered = served.llm.render_chat(parsed, tools=tools, enable_thinking=False)
    assert "<parameter=city>\nOslo\n</parameter>" in rendered.text
    assert resp.usage.prompt_tokens == len(rendered.prompt.token_ids)


def test_n_siblings_streamed(served, client):
    kw = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Pick a shape."}],
        max_tokens=5,
        temperature=1.0,
        seed=11,
        n=2,
        extra_body=NO_THINK,
    )
    full = client.chat.completions.create(**kw)
    texts, finishes = {0: "", 1: ""}, {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts == {c.index: c.message.content for c in full.choices}
    assert finishes == {c.index: c.finish_reason for c in full.choices}


def test_return_token_ids(served, client):
    """The extension gives the generated ids, streamed ones too, even tokens with no text."""
    messages = [{"role": "user", "content": "Token ids please."}]
    kw = dict(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    extra = {**NO_THINK, "return_token_ids": True}
    full = client.chat.completions.create(extra_body=extra, **kw)
    ref = served.llm.chat(
        messages, SamplingParams(max_tokens=6, temperature=0), enable_thinking=False
    )[0]
    assert full.choices[0].model_extra["token_ids"] == ref.token_ids
    streamed = []
    for chunk in client.chat.completions.create(stream=True, extra_body=extra, **kw):
        for c in chunk.choices:
            streamed += (c.model_extra or {}).get("token_ids") or []
    assert streamed == ref.token_ids
