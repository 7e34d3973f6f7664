"""The Anthropic protocol's exact figures, through the official `anthropic` client against the
live server: `message_start` carries the request's final usage split, `stop_sequence` names the
stop string that ended a reply (streamed and plain), and `cache_control` is checked as Anthropic
checks it (at most four breakpoints, `{"type": "ephemeral"}` with a ttl of "5m" or "1h", none
on an empty or thinking block), each violation a 400 naming the field path."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import MODEL, engine_idle

from ninfer.request import RequestOutput, SamplingParams, StreamDelta, Usage

anthropic = pytest.importorskip("anthropic")

NO_THINK = {"type": "disabled"}
GREEDY = {"temperature": 0}
EPHEMERAL = {"type": "ephemeral"}
SERVER_EXAMPLES = settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def client(served):
    return anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=60)


def _words(n: int, salt: str) -> str:
    return " ".join(f"{salt}{i % 11} tide mark" for i in range(n))


def _usage(u) -> tuple[int, int, int]:
    return (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens)


def _streamed(client, **kw):
    """(message_start's usage, the final message) of a streamed request."""
    with client.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    return events[0].message.usage, final


# ---- message_start -----------------------------------------------------------------------------
def test_message_start_carries_the_final_usage_split(served, client):
    """A conversation's second turn reads the first turn's blocks from the cache and creates
    its own: message_start says so before any text, with the figures the end reports."""
    system = "Harbour log. " + _words(30, "ms")
    first = [{"role": "user", "content": _words(40, "msa")}]
    kw = dict(model=MODEL, max_tokens=4, extra_body=GREEDY, system=system, thinking=NO_THINK)
    r1 = client.messages.create(messages=first, **kw)
    second = [
        *first,
        {"role": "assistant", "content": r1.content[0].text},
        {"role": "user", "content": _words(40, "msb")},
    ]
    start, final = _streamed(client, messages=second, **kw)
    assert final.usage.cache_read_input_tokens >= 64
    assert final.usage.cache_creation_input_tokens >= 64
    assert _usage(start) == _usage(final.usage)
    assert start.output_tokens == 0
    engine_idle(served.llm)


# ---- stop_sequence -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reply(served, client) -> tuple[dict, str, list[str]]:
    """A greedy request, its reply text without stop sequences (long enough to hold some) and
    the text as it grew token by token (the same request through the Python API)."""
    kw = dict(
        model=MODEL,
        max_tokens=24,
        extra_body=GREEDY,
        thinking=NO_THINK,
        messages=[{"role": "user", "content": "Write the harbour master's note."}],
    )
    text = client.messages.create(**kw).content[0].text
    assert len(text.strip()) >= 8
    params = SamplingParams(temperature=0.0, max_tokens=24)
    out = served.llm.chat([kw["messages"]], params, enable_thinking=False)[0]
    assert out.text == text
    ids, tok = list(out.token_ids), served.llm.tokenizer
    return kw, text, [tok.decode(ids[:i]) for i in range(1, len(ids) + 1)]


def _expected_stop(grown: list[str], stops: list[str]) -> str:
    """The stop string that ends the reply: stops are looked for as each token arrives, so at
    the first token whose text holds one, the earliest of them to start (the shortest of
    those)."""
    for text in grown:
        hits = [(text.find(s), len(s), s) for s in stops if s in text]
        if hits:
            return min(hits)[2]
    raise AssertionError("no stop string in the reply")


@st.composite
def _stops_in(draw, text: str) -> list[str]:
    """One to three non-blank pieces of `text`, and maybe a string it lacks."""
    stops = []
    for _ in range(draw(st.integers(1, 3))):
        start = draw(st.integers(0, len(text) - 1))
        piece = text[start : start + draw(st.integers(1, 5))]
        if piece.strip():
            stops.append(piece)
    if not stops:
        stops.append(text.strip()[0])
    if draw(st.booleans()):
        stops.append("\x07never in the reply\x07")
    return stops


@SERVER_EXAMPLES
@given(data=st.data())
def test_stop_sequence_names_the_stop_string_that_ended_the_reply(client, reply, data):
    kw, text, grown = reply
    stops = data.draw(_stops_in(text))
    hit = _expected_stop(grown, stops)
    msg = client.messages.create(stop_sequences=stops, **kw)
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", hit)
    assert msg.content[0].text == text[: text.find(hit)]
    _, final = _streamed(client, stop_sequences=stops, **kw)
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", hit)
    assert final.content[0].text == msg.content[0].text


def test_stop_sequence_is_null_when_no_stop_string_ended_the_reply(client, reply):
    kw, text, _ = reply
    stops = ["\x07never in the reply\x07"]
    msg = client.messages.create(stop_sequences=stops, **kw)
    _, final = _streamed(client, stop_sequences=stops, **kw)
    for m in (msg, final):
        assert m.stop_sequence is None and m.stop_reason in ("max_tokens", "end_turn")
        assert m.content[0].text == text


# ---- cache_control -----------------------------------------------------------------------------
def _layout(draw) -> tuple[list, list, list, list[str]]:
    """(tools, system blocks, messages, every place a breakpoint may go, in prompt order)."""
    tools = [
        {"name": f"tool{j}", "description": "d", "input_schema": {"type": "object"}}
        for j in range(draw(st.integers(0, 2)))
    ]
    system = [{"type": "text", "text": f"rule {j}"} for j in range(draw(st.integers(0, 2)))]
    messages = []
    for i in range(draw(st.integers(1, 3))):
        role = "user" if i % 2 == 0 else "assistant"
        blocks = [{"type": "text", "text": f"turn {i} part {j}"} for j in range(1 + i % 2)]
        messages.append({"role": role, "content": blocks})
    places = [f"tools.{j}" for j in range(len(tools))]
    places += [f"system.{j}" for j in range(len(system))]
    places += [
        f"messages.{i}.content.{j}"
        for i, m in enumerate(messages)
        for j in range(len(m["content"]))
    ]
    return tools, system, messages, places


def _holder(tools, system, messages, place: str) -> dict:
    parts = place.split(".")
    if parts[0] == "tools":
        return tools[int(parts[1])]
    if parts[0] == "system":
        return system[int(parts[1])]
    return messages[int(parts[1])]["content"][int(parts[3])]


@st.composite
def _marked_requests(draw):
    """A request with breakpoints on a random set of its blocks, each with a valid ttl, the
    "1h" ones first; and the places marked, in prompt order."""
    tools, system, messages, places = _layout(draw)
    chosen = sorted(draw(st.sets(st.sampled_from(places), max_size=7)), key=places.index)
    n_long = draw(st.integers(0, len(chosen)))
    for k, place in enumerate(chosen):
        cc = dict(EPHEMERAL)
        if k < n_long:
            cc["ttl"] = "1h"
        elif draw(st.booleans()):
            cc["ttl"] = "5m"
        _holder(tools, system, messages, place)["cache_control"] = cc
    body = {"model": MODEL, "messages": messages}
    if tools:
        body["tools"] = tools
    if system:
        body["system"] = system
    return body, chosen


@SERVER_EXAMPLES
@given(case=_marked_requests())
def test_at_most_four_breakpoints_the_fifth_named(client, case):
    body, chosen = case
    if len(chosen) <= 4:
        assert client.messages.count_tokens(**body).input_tokens > 0
        return
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.count_tokens(**body)
    _assert_names(e.value, f"{chosen[4]}.cache_control")


def _assert_names(err, path: str) -> None:
    assert err.status_code == 400
    assert err.body["type"] == "error"
    assert err.body["error"]["type"] == "invalid_request_error"
    message = err.body["error"]["message"]
    assert message.startswith(path + ":"), message


def _user(*blocks) -> dict:
    return {"role": "user", "content": list(blocks)}


def _text(text: str, cc) -> dict:
    return {"type": "text", "text": text, "cache_control": cc}


BAD = {
    "ttl 2h": (
        [_user(_text("hi", {"type": "ephemeral", "ttl": "2h"}))],
        "messages.0.content.0.cache_control.ttl",
    ),
    "type": (
        [_user(_text("hi", {"type": "persistent"}))],
        "messages.0.content.0.cache_control.type",
    ),
    "no type": ([_user(_text("hi", {}))], "messages.0.content.0.cache_control.type"),
    "extra key": (
        [_user(_text("hi", {"type": "ephemeral", "scope": "global"}))],
        "messages.0.content.0.cache_control.scope",
    ),
    "not an object": ([_user(_text("hi", "ephemeral"))], "messages.0.content.0.cache_control"),
    "empty text block": (
        [_user({"type": "text", "text": "hi"}, _text("", EPHEMERAL))],
        "messages.0.content.1.cache_control",
    ),
    "thinking block": (
        [
            _user({"type": "text", "text": "hi"}),
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": "hm",
                        "signature": "",
                        "cache_control": EPHEMERAL,
                    },
                    {"type": "text", "text": "ok"},
                ],
            },
            _user({"type": "text", "text": "and?"}),
        ],
        "messages.1.content.0.cache_control",
    ),
    "1h after 5m": (
        [
            _user(_text("a", {"type": "ephemeral", "ttl": "5m"})),
            {"role": "assistant", "content": "b"},
            _user(_text("c", {"type": "ephemeral", "ttl": "1h"})),
        ],
        "messages.2.content.0.cache_control.ttl",
    ),
    "tool_result block": (
        [
            _user({"type": "text", "text": "hi"}),
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
            },
            _user(
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [_text("out", {"type": "ephemeral", "ttl": "1d"})],
                }
            ),
        ],
        "messages.2.content.0.content.0.cache_control.ttl",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_cache_control_is_a_400_naming_its_path(served, client, case):
    messages, path = BAD[case]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model=MODEL, max_tokens=2, messages=messages, thinking=NO_THINK, extra_body=GREEDY
        )
    _assert_names(e.value, path)


def test_breakpoints_count_across_tools_system_and_messages(served, client):
    """Two on tools, one on the system, one on a message: four, accepted; one more on the
    top level (automatic caching) is the fifth, named; the server keeps serving."""
    tools = [
        {"name": f"t{j}", "input_schema": {"type": "object"}, "cache_control": EPHEMERAL}
        for j in range(2)
    ]
    system = [_text("Be brief.", EPHEMERAL)]
    messages = [_user(_text("hello", {"type": "ephemeral", "ttl": "5m"}))]
    kw = dict(model=MODEL, max_tokens=2, tools=tools, system=system, messages=messages)
    ok = client.messages.create(thinking=NO_THINK, extra_body=GREEDY, **kw)
    assert ok.usage.output_tokens >= 1
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(thinking=NO_THINK, extra_body=GREEDY, cache_control=EPHEMERAL, **kw)
    _assert_names(e.value, "cache_control")
    engine_idle(served.llm)


# ---- a stream that ends before a token ---------------------------------------------------------
def _scripted(served, monkeypatch, final: RequestOutput, deltas=()) -> None:
    async def run(rendered, params, stream):
        for d in deltas:
            yield [d]
        final.prompt_token_ids = list(rendered.prompt.token_ids)
        yield [final]

    monkeypatch.setattr(served.app.state.driver, "run", run)


def _sse_events(served, body: dict) -> list[tuple[str, dict]]:
    with httpx.Client(base_url=served.url, timeout=30) as http:
        r = http.post("/v1/messages", json={**body, "stream": True}, headers={"x-api-key": "k"})
    assert r.status_code == 200
    events = []
    for chunk in r.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines() if ": " in line)
        if "event" in lines:
            events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_a_stream_that_fails_before_a_token_opens_with_message_start(served, monkeypatch):
    usage = Usage(prompt_tokens=9, cached_tokens=0)
    out = RequestOutput("x", [], finish_reason="error", error="engine error: boom", usage=usage)
    _scripted(served, monkeypatch, out)
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    events = _sse_events(served, body)
    assert [name for name, _ in events] == ["message_start", "error"]
    assert events[0][1]["message"]["usage"]["input_tokens"] == 9
    assert events[1][1]["error"]["type"] == "api_error"


def test_the_first_deltas_usage_opens_the_stream(served, monkeypatch):
    """message_start takes the first delta's usage (not the prompt's bare size); a stream whose
    reply is empty is still a well-formed message for the client."""
    first = Usage(prompt_tokens=200, cached_tokens=128, cache_creation_tokens=64)
    delta = StreamDelta("x", [5], "", usage=first)
    end = Usage(prompt_tokens=200, completion_tokens=1, cached_tokens=128, cache_creation_tokens=64)
    out = RequestOutput("x", [], token_ids=[5], finish_reason="stop", usage=end)
    _scripted(served, monkeypatch, out, [delta])
    client = anthropic.Anthropic(base_url=served.url, api_key="k", max_retries=0, timeout=30)
    start, final = _streamed(
        client, model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )
    assert _usage(start) == _usage(final.usage) == (8, 128, 64)
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == ""
