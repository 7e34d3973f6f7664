"""Streams write once per batch of engine events, and the loop wakes once per burst.

The engine emits one step's events back to back; here `LLM.submit` is replaced by a script
that emits a whole reply (its deltas and the final output) in one go on the server's loop, as
one step would, so what reaches the client is exact: one loop wake-up for the burst, one chunk
(OpenAI) or one block delta per block (Anthropic) carrying every token of it, and each
protocol's grammar (role chunk, finish chunk, usage, [DONE]; message_start ... message_stop)
intact. A request whose engine thread has died ends "abort" (the loop's watchdog).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from server_helpers import MODEL

from ninfer.llm import LLM
from ninfer.request import RequestOutput, StreamDelta, Usage

REPLY = (
    "The user wants weather.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n"
    "</tool_call>"
)
PIECES = [REPLY[i : i + 5] for i in range(0, len(REPLY), 5)]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "w", "input_schema": SCHEMA}]
MESSAGES = [{"role": "user", "content": "Weather in Oslo for two days?"}]


@pytest.fixture
def burst(served, monkeypatch):
    """`submit` answers every request with REPLY, all of it in one burst on the loop."""

    def submit(prompt, params, *, on_event, stream=True):
        rid = "burst-1"
        n = len(prompt.token_ids)

        def emit() -> None:
            if stream:
                for k, piece in enumerate(PIECES):
                    on_event(StreamDelta(request_id=rid, token_ids=[100 + k], text=piece))
            on_event(
                RequestOutput(
                    request_id=rid,
                    prompt_token_ids=list(prompt.token_ids),
                    token_ids=[100 + k for k in range(len(PIECES))],
                    text=REPLY,
                    finish_reason="stop",
                    usage=Usage(prompt_tokens=n, completion_tokens=len(PIECES)),
                )
            )

        asyncio.get_running_loop().call_soon(emit)
        return rid

    monkeypatch.setattr(served.llm, "submit", submit)
    return served


def _wakeups(served) -> float:
    for line in httpx.get(served.url + "/metrics").text.splitlines():
        if line.startswith("ninfer_server_loop_wakeups_total "):
            return float(line.split()[-1])
    raise AssertionError("no ninfer_server_loop_wakeups_total in /metrics")


def _sse(served, path: str, body: dict) -> list[tuple[str | None, str]]:
    """(event name, data) of every SSE event of one streamed response."""
    events, name = [], None
    with httpx.stream("POST", served.base + path, json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, line[6:]))
                name = None
    return events


def test_openai_chat_burst_is_one_chunk(burst):
    before = _wakeups(burst)
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "tools": OPENAI_TOOLS,
        "max_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": True},  # REPLY starts in <think>
    }
    events = _sse(burst, "/chat/completions", body)
    assert _wakeups(burst) == before + 1
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(d) for _, d in events[:-1]]
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 4
    assert len({(c["id"], c["created"], c["model"]) for c in chunks}) == 1
    role, delta, finish, usage = chunks
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
         "finish_reason": None}
    ]  # fmt: skip
    (choice,) = delta["choices"]
    assert choice["token_ids"] == [100 + k for k in range(len(PIECES))]
    d = choice["delta"]
    assert d["reasoning_content"] == "The user wants weather."
    assert d["content"] == "Checking."
    (call,) = d["tool_calls"]
    assert call["index"] == 0 and call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo", "days": 2}
    assert finish["choices"] == [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(PIECES)


def test_openai_sdk_reads_the_burst(burst):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=burst.base, api_key="k", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=OPENAI_TOOLS,
        max_tokens=50,
        stream=True,
        extra_body={"chat_template_kwargs": {"enable_thinking": True}},  # REPLY starts in <think>
    )
    content, calls, finish = "", {}, None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:  # merged by index, as clients do
                entry = calls.setdefault(tc.index, ["", ""])
                entry[0] += tc.function.name or ""
                entry[1] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    assert content == "Checking."
    assert [(n, json.loads(a)) for n, a in calls.values()] == [
        ("get_weather", {"city": "Oslo", "days": 2})
    ]
    assert finish == "tool_calls"


def test_completions_burst_is_one_chunk(burst):
    before = _wakeups(burst)
    body = {"model": MODEL, "prompt": "Weather?", "max_tokens": 50, "stream": True}
    events = _sse(burst, "/completions", body)
    assert _wakeups(burst) == before + 1
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(d) for _, d in events[:-1]]
    assert [c["choices"] for c in chunks] == [
        [{"index": 0, "text": REPLY, "logprobs": None, "finish_reason": None}],
        [{"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}],
    ]


def test_anthropic_burst_is_one_delta_per_block(burst):
    before = _wakeups(burst)
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "tools": ANTHROPIC_TOOLS,
        "max_tokens": 50,
        "stream": True,
        "thinking": {"type": "enabled"},  # REPLY starts in <think>
    }
    events = _sse(burst, "/messages", body)
    assert _wakeups(burst) == before + 1
    data = [json.loads(d) for _, d in events]
    assert [name for name, _ in events] == [d["type"] for d in data]
    assert [d["type"] for d in data] == [
        "message_start",
        "content_block_start",  # thinking
        "content_block_delta",
        "content_block_delta",  # its signature
        "content_block_stop",
        "content_block_start",  # text
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # tool_use
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",  # the closing brace
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert data[2]["delta"] == {"type": "thinking_delta", "thinking": "The user wants weather."}
    assert data[6]["delta"] == {"type": "text_delta", "text": "Checking."}
    tool = data[8]["content_block"]
    assert tool["type"] == "tool_use" and tool["name"] == "get_weather"
    args = "".join(d["delta"]["partial_json"] for d in data[9:12])
    assert json.loads(args) == {"city": "Oslo", "days": 2}
    assert data[13]["delta"]["stop_reason"] == "tool_use"
    assert data[13]["usage"]["output_tokens"] == len(PIECES)


def test_a_dead_engine_ends_the_stream_abort(served, monkeypatch):
    """No answer from an engine thread that is gone: the watchdog ends the request."""
    monkeypatch.setattr(served.llm, "submit", lambda *a, **k: "silent-1")
    monkeypatch.setattr(LLM, "running", property(lambda self: False))
    body = {"model": MODEL, "prompt": "Weather?", "max_tokens": 5, "stream": True}
    events = _sse(served, "/completions", body)
    assert [json.loads(d)["choices"] for _, d in events[:-1]] == [
        [{"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}]
    ]
    assert events[-1] == (None, "[DONE]")
