"""The Anthropic Messages surface driven by the real `anthropic` client: messages, streaming
events, cache usage, cache_control breakpoints, tool_use / tool_result history."""

from __future__ import annotations

import pytest
from server_helpers import MODEL, engine_idle

from ninfer.request import SamplingParams
from ninfer.server import anthropic_api

anthropic = pytest.importorskip("anthropic")

NO_THINK = {"type": "disabled"}
GREEDY = {"temperature": 0}  # (the SDK no longer has a temperature argument)


def _client(url: str):
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def client(served):
    return _client(served.url)


def _words(n: int, salt: str) -> str:
    return " ".join(f"{salt}{i % 13} field note" for i in range(n))


def test_message_equals_the_engine(served, client):
    messages = [{"role": "user", "content": "Describe a harbour."}]
    msg = client.messages.create(
        model=MODEL, max_tokens=10, extra_body=GREEDY, messages=messages, thinking=NO_THINK
    )
    ref = served.llm.chat(
        messages, SamplingParams(max_tokens=10, temperature=0), enable_thinking=False
    )[0]
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == ref.text
    assert msg.stop_reason == ("max_tokens" if ref.finish_reason == "length" else "end_turn")
    u = msg.usage
    assert u.output_tokens == len(ref.token_ids)
    total = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    assert total == len(ref.prompt_token_ids)


def test_stream_events_and_final_message(served, client):
    kw = dict(
        model=MODEL,
        max_tokens=10,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Describe a harbour at night."}],
        thinking=NO_THINK,
    )
    full = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert final.content[0].text == full.content[0].text
    assert final.stop_reason == full.stop_reason
    assert final.usage.output_tokens == full.usage.output_tokens


def test_thinking_blocks(served, client):
    msg = client.messages.create(
        model=MODEL,
        max_tokens=6,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Think first."}],
        thinking={"type": "enabled"},
    )
    ref = served.llm.chat(
        [{"role": "user", "content": "Think first."}],
        SamplingParams(max_tokens=6, temperature=0),
    )[0]
    reasoning = ref.text.partition("</think>")[0].rstrip("\n")
    assert msg.content[0].type == "thinking" and msg.content[0].thinking == reasoning


def test_multi_turn_cache_read_and_creation(served, client):
    system = "You are a ship's log. " + _words(40, "sys")
    first = [{"role": "user", "content": _words(50, "turn")}]
    r1 = client.messages.create(
        model=MODEL,
        max_tokens=5,
        extra_body=GREEDY,
        system=system,
        messages=first,
        thinking=NO_THINK,
    )
    assert r1.usage.cache_creation_input_tokens >= 64  # new blocks were cached
    second = [
        *first,
        {"role": "assistant", "content": r1.content[0].text},
        {"role": "user", "content": "Next entry."},
    ]
    r2 = client.messages.create(
        model=MODEL,
        max_tokens=5,
        extra_body=GREEDY,
        system=system,
        messages=second,
        thinking=NO_THINK,
    )
    assert r2.usage.cache_read_input_tokens >= 64
    engine_idle(served.llm)


def _breakpoint_case(served, client, marked: bool, salt: str):
    """Request A: [system, user U1, assistant, user]; request B diverges right after U1's
    turn. Returns (B's cache_read_input_tokens, U1's turn end, the system turn end)."""
    u1 = {"type": "text", "text": _words(45, salt)}
    if marked:
        u1["cache_control"] = {"type": "ephemeral"}
    system = "Log keeper. " + _words(20, salt + "s")

    def convo(reply: str, question: str):
        return [
            {"role": "user", "content": [u1]},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": question},
        ]

    kw = dict(model=MODEL, max_tokens=3, extra_body=GREEDY, system=system, thinking=NO_THINK)
    client.messages.create(messages=convo("Noted one.", "What next?"), **kw)
    b = client.messages.create(messages=convo("Other reply entirely.", "Then?"), **kw)
    req = anthropic_api.MessagesRequest(
        model=MODEL, max_tokens=3, system=system, messages=convo("x", "y"), thinking=NO_THINK
    )
    msgs = anthropic_api.convert_messages(req)
    rendered = served.llm.render_chat(
        [
            {**m, "cache_control": {"type": "ephemeral"}} if i == 1 else m
            for i, m in enumerate(msgs)
        ],
        enable_thinking=False,
    )
    return (
        b.usage.cache_read_input_tokens,
        rendered.prompt.hints.explicit[0],
        rendered.prompt.hints.structural[0],
    )


def test_cache_control_places_a_snapshot_a_later_request_resumes_from(fresh_served):
    """Its own server: the unmarked case resumes from the deepest of the system turn's end, a
    Boundary snapshot its request's later taps supersede while no other conversation shares it
    (spec §9.3), and the forward-ladder rungs (512 * 2^k, taken inside the pass) below U1's
    end. A
    Host tier the earlier tests have filled evicts superseded snapshots first, so on the session
    server that resume point is gone once enough tests have run before this one."""
    served, client = fresh_served, _client(fresh_served.url)
    read, u1_end, system_end = _breakpoint_case(served, client, True, "bp")
    assert u1_end % 64 != 0  # a position only an exact tap reaches
    assert read == u1_end
    # the same conversation without the breakpoint resumes from the system turn's end or a
    # rung below U1's end, not at it
    read, u1_end, system_end = _breakpoint_case(served, client, False, "nb")
    rungs = [512 << k for k in range(8) if 512 << k <= u1_end]
    assert read == max([system_end, *rungs]) < u1_end
    engine_idle(served.llm)
    stats = served.llm.cache_stats()
    # the claim is made for a Host tier with room: nothing was evicted from it
    assert stats.host_superseded_evicted == stats.host_gdsf_evicted == 0


def test_tool_use_and_tool_result_history_render_as_openai_history(served, client):
    tool = {
        "name": "get_weather",
        "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    msgs = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"}],
        },
    ]
    msg = client.messages.create(
        model=MODEL, max_tokens=4, extra_body=GREEDY, tools=[tool], messages=msgs, thinking=NO_THINK
    )
    openai_form = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "rain"},
    ]
    fn = {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": tool["input_schema"],
    }
    rendered = served.llm.render_chat(
        openai_form, tools=[{"type": "function", "function": fn}], enable_thinking=False
    )
    assert "<tool_response>\nrain\n</tool_response>" in rendered.text
    u = msg.usage
    total = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    assert total == len(rendered.prompt.token_ids)


def test_count_tokens(served, client):
    messages = [{"role": "user", "content": "Count me."}]
    counted = client.messages.count_tokens(model=MODEL, messages=messages, thinking=NO_THINK)
    ref = served.llm.render_chat(messages, enable_thinking=False)
    assert counted.input_tokens == len(ref.prompt.token_ids)
