"""Tool calls in the output, as the real clients see them. The demo model's replies are noise,
so here the engine's reply is scripted (the driver's `run` replaced): the routes, the parser
and the wire formats are the real ones."""

from __future__ import annotations

import json

import pytest
from server_helpers import MODEL

from ninfer.request import RequestOutput, StreamDelta, Usage

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

REPLY = (
    "The user wants weather.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n"
    "</tool_call>"
)
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "w", "input_schema": SCHEMA}]


@pytest.fixture
def scripted(served, monkeypatch):
    """The engine 'replies' REPLY in small deltas (7 characters each)."""
    return _script(served, monkeypatch, REPLY)


def _script(served, monkeypatch, reply: str):
    async def run(rendered, params, stream):
        pieces = [reply[i : i + 7] for i in range(0, len(reply), 7)]
        if stream:
            for k, piece in enumerate(pieces):
                yield [StreamDelta(request_id="x", token_ids=[k], text=piece)]
        n = len(rendered.prompt.token_ids)
        yield [
            RequestOutput(
                request_id="x",
                prompt_token_ids=list(rendered.prompt.token_ids),
                token_ids=list(range(len(pieces))),
                text=reply,
                finish_reason="stop",
                usage=Usage(prompt_tokens=n, completion_tokens=len(pieces)),
            )
        ]

    monkeypatch.setattr(served.app.state.driver, "run", run)
    return served


def _ask():
    return [{"role": "user", "content": "Weather in Oslo for two days?"}]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_tool_calls(scripted, stream):
    client = openai.OpenAI(base_url=scripted.base, api_key="k", max_retries=0)
    think = {"chat_template_kwargs": {"enable_thinking": True}}  # the script starts in <think>
    kw = dict(model=MODEL, messages=_ask(), tools=OPENAI_TOOLS, max_tokens=50, extra_body=think)
    if not stream:
        choice = client.chat.completions.create(**kw).choices[0]
        msg = choice.message
        calls = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls]
        reasoning, content = msg.reasoning_content, msg.content
    else:
        calls_by_index: dict[int, list] = {}
        reasoning = content = ""
        finish = None
        for chunk in client.chat.completions.create(stream=True, **kw):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                entry = calls_by_index.setdefault(tc.index, ["", "", ""])
                entry[0] = tc.id or entry[0]
                entry[1] = (tc.function.name or "") or entry[1]
                entry[2] += tc.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        calls = [(i, n, json.loads(a)) for i, n, a in calls_by_index.values()]
        choice = type("C", (), {"finish_reason": finish})
    assert reasoning == "The user wants weather."
    assert content == "Checking."
    assert [(n, a) for _, n, a in calls] == [("get_weather", {"city": "Oslo", "days": 2})]
    assert calls[0][0].startswith("call_")
    assert choice.finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_tool_use(scripted, stream):
    client = anthropic.Anthropic(base_url=scripted.url, api_key="k", max_retries=0)
    think = {"type": "enabled"}  # the script starts in <think>
    kw = dict(model=MODEL, messages=_ask(), tools=ANTHROPIC_TOOLS, max_tokens=50, thinking=think)
    if stream:
        with client.messages.stream(**kw) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(**kw)
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
    assert msg.content[0].thinking == "The user wants weather."
    assert msg.content[1].text == "Checking."
    use = msg.content[2]
    assert use.name == "get_weather" and use.input == {"city": "Oslo", "days": 2}
    assert use.id.startswith("toolu_")
    assert msg.stop_reason == "tool_use"


TWO_CALLS = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
    "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nBergen\n</parameter>\n"
    "</function>\n</tool_call>"
)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_calls_off_keeps_the_first_call(served, monkeypatch, stream, parallel):
    """`parallel_tool_calls: false` (Anthropic `disable_parallel_tool_use`) with tool_choice
    auto: a reply that makes two calls shows the first one only, as the APIs never make more."""
    _script(served, monkeypatch, TWO_CALLS)
    expected = ["Oslo", "Bergen"] if parallel else ["Oslo"]
    client = openai.OpenAI(base_url=served.base, api_key="k", max_retries=0)
    kw = dict(model=MODEL, messages=_ask(), tools=OPENAI_TOOLS, max_tokens=50)
    if not stream:
        msg = client.chat.completions.create(parallel_tool_calls=parallel, **kw).choices[0].message
        cities = [json.loads(c.function.arguments)["city"] for c in msg.tool_calls]
    else:
        args: dict[int, str] = {}
        for chunk in client.chat.completions.create(
            stream=True, parallel_tool_calls=parallel, **kw
        ):
            for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
        cities = [json.loads(a)["city"] for a in args.values()]
    assert cities == expected
    a = anthropic.Anthropic(base_url=served.url, api_key="k", max_retries=0)
    choice = {"type": "auto", "disable_parallel_tool_use": not parallel}
    kw = dict(model=MODEL, messages=_ask(), tools=ANTHROPIC_TOOLS, max_tokens=50)
    if stream:
        with a.messages.stream(tool_choice=choice, **kw) as s:
            msg = s.get_final_message()
    else:
        msg = a.messages.create(tool_choice=choice, **kw)
    assert [b.input["city"] for b in msg.content if b.type == "tool_use"] == expected
    assert msg.stop_reason == "tool_use"
