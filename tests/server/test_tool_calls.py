"""Qwen's reasoning split and XML tool calls: whole-text parsing, and incremental parsing that
yields the same result however the text is cut into deltas."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.server.tool_calls import (
    OutputParser,
    Text,
    ToolArgs,
    ToolEnd,
    ToolStart,
    parse_text,
    tool_schemas,
)

TOOLS = tool_schemas(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "days": {"type": "integer"},
                        "opts": {"type": "object"},
                    },
                },
            },
        },
        {"type": "function", "function": {"name": "noop", "parameters": {}}},
    ]
)

CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
    '<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{"unit": "C"}\n</parameter>\n'
    "</function>\n</tool_call>"
)
REPLY = (
    "I should check.\n</think>\n\nLet me look that up.\n\n"
    + CALL
    + "\n"
    + ("<tool_call>\n<function=noop>\n</function>\n</tool_call>")
)


def _ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def _collect(events):
    """(reasoning, content, {index: (id, name, args json)})."""
    reasoning = "".join(e.text for e in events if isinstance(e, Text) and e.kind == "reasoning")
    content = "".join(e.text for e in events if isinstance(e, Text) and e.kind == "content")
    calls: dict[int, list] = {}
    for e in events:
        if isinstance(e, ToolStart):
            calls[e.index] = [e.id, e.name, ""]
        elif isinstance(e, ToolArgs):
            calls[e.index][2] += e.fragment
    return reasoning, content, {i: tuple(c) for i, c in calls.items()}


def test_whole_reply():
    reasoning, content, calls = parse_text(REPLY, True, TOOLS, _ids())
    assert reasoning == "I should check."
    assert content == "Let me look that up."
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("call_0", "get_weather", {"city": "San Francisco", "days": 3, "opts": {"unit": "C"}}),
        ("call_1", "noop", {}),
    ]


def test_streamed_arguments_are_the_json_of_the_call():
    parser = OutputParser(True, TOOLS, _ids())
    events = parser.feed(REPLY) + parser.finish()
    _, _, calls = _collect(events)
    for index, call in enumerate(parser.tool_calls):
        assert json.loads(calls[index][2]) == call.arguments
    assert sum(isinstance(e, ToolEnd) for e in events) == 2


def test_no_tools_means_no_parsing_and_no_thinking_means_content():
    reasoning, content, calls = parse_text(CALL, False, None, _ids())
    assert (reasoning, content, calls) == ("", CALL, [])


def test_cut_short_reasoning_and_call():
    assert parse_text("still thinking <", True, TOOLS, _ids())[0] == "still thinking <"
    # max_tokens inside a call: the parameters that completed make the call
    _, content, calls = parse_text(CALL[:80], False, TOOLS, _ids())
    assert content == "" and [(c.name, c.arguments) for c in calls] == [
        ("get_weather", {"city": "San Francisco"})
    ]


def test_text_that_only_looks_like_a_call_is_content():
    text = "a <tool_call>not a call</tool_call> b"
    assert parse_text(text, False, TOOLS, _ids())[1] == text


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(REPLY)), max_size=12), st.booleans())
def test_any_cut_into_deltas_gives_the_same_result(cuts, thinking):
    text = REPLY if thinking else REPLY.split("</think>\n\n", 1)[1]
    whole = OutputParser(thinking, TOOLS, _ids())
    expected = _collect(whole.feed(text) + whole.finish())
    parser = OutputParser(thinking, TOOLS, _ids())
    events = []
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    for a, b in itertools.pairwise(bounds):
        events += parser.feed(text[a:b])
    events += parser.finish()
    assert _collect(events) == expected
    assert [c.arguments for c in parser.tool_calls] == [c.arguments for c in whole.tool_calls]
