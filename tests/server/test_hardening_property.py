"""Whatever a client sends, the answer is a 2xx or a 4xx in the API's own error JSON (never a
500, never a plain-text error), and the server serves a normal request afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import MODEL

USER = [{"role": "user", "content": "hi"}]
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens"]
VALID = {
    "/v1/chat/completions": {"model": MODEL, "messages": USER, "max_tokens": 2},
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 2},
    "/v1/messages": {"model": MODEL, "messages": USER, "max_tokens": 2},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": USER},
}
FIELDS = [
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "n", "stream",
    "stream_options", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
    "stop_sequences", "logprobs", "top_logprobs", "tools", "tool_choice", "system", "thinking",
    "chat_template_kwargs", "echo", "cache_breakpoints", "return_token_ids", "ignore_eos",
    "role", "content", "type", "text", "function", "name", "arguments", "cache_control",
    "tool_call_id", "tool_calls", "input", "tool_use_id", "reasoning_content", "id",
]  # fmt: skip
# Every length-like field is small or not a number, so a valid request finishes at once.
LENGTHS = {"max_tokens", "max_completion_tokens"}

text = st.text(max_size=12) | st.sampled_from(["", "\udc80", "<|im_start|>", "user", "demo"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | text, inner, max_size=4)
    ),
    max_leaves=12,
)
small_length = st.integers(-2, 3) | st.sampled_from([None, "4", 2.5, [], True])
roles = st.sampled_from(["user", "assistant", "system", "tool", "developer", "robot"])
messages = st.lists(
    st.fixed_dictionaries({"role": roles, "content": text | values}, optional={"x": values})
    | st.dictionaries(st.sampled_from(FIELDS), values, max_size=3),
    min_size=1,
    max_size=3,
)
tools = st.lists(
    st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.dictionaries(st.sampled_from(FIELDS), values)}
    )
    | st.dictionaries(st.sampled_from(["name", "input_schema", "description"]), values),
    max_size=2,
)
SHAPED = {
    "messages": messages,
    "tools": tools,
    "tool_choice": values | st.fixed_dictionaries({"function": values}),
    "chat_template_kwargs": st.dictionaries(st.sampled_from(FIELDS) | text, values, max_size=3),
    "prompt": text | st.lists(st.integers(-5, 3000), max_size=5),
}


@st.composite
def json_bodies(draw, route: str) -> bytes:
    body = dict(VALID[route])
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        strategy = small_length if key in LENGTHS else SHAPED.get(key, values)
        body[key] = draw(strategy if key not in SHAPED or draw(st.booleans()) else values)
    if draw(st.booleans()):
        body.pop(draw(st.sampled_from(sorted(body))))
    return json.dumps(body).encode()


raw_bodies = st.binary(max_size=64) | st.sampled_from(
    [b"", b"[]", b"null", b'{"a": NaN}', b"[" * 3000, b'{"x": ' + b"[" * 500 + b"]" * 500 + b"}"]
)
content_types = st.sampled_from(
    ["application/json", "application/json; charset=utf-8", "text/plain", "", None, "a/b+json"]
)
hosts = st.sampled_from([None, "127.0.0.1", "localhost", "evil.example", "[::1]:1", "x:y:z"])
origins = st.sampled_from([None, None, "https://evil.example", "null"])


@st.composite
def requests(draw) -> dict:
    route = draw(st.sampled_from(ROUTES + ["/v1/models", "/health", "/metrics", "/nope"]))
    method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "OPTIONS", "PUT"]))
    body = draw(json_bodies(route) if route in VALID and draw(st.booleans()) else raw_bodies)
    headers = {}
    for name, strategy in (("content-type", content_types), ("host", hosts), ("origin", origins)):
        value = draw(strategy)
        if value is not None:
            headers[name] = value
    return {"method": method, "route": route, "content": body, "headers": headers}


def _api_shaped(route: str, data) -> bool:
    if route.startswith("/v1/messages"):
        err = data.get("error") if data.get("type") == "error" else None
        return isinstance(err, dict) and {"type", "message"} <= set(err)
    err = data.get("error")
    return isinstance(err, dict) and {"message", "type", "param"} <= set(err)


def _normal_request_works(url: str) -> None:
    r = httpx.post(url + "/v1/chat/completions", json=VALID["/v1/chat/completions"], timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.fixture(scope="module")
def client(served):
    with httpx.Client(base_url=served.url, timeout=60) as c:
        yield c


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(req=requests())
def test_every_answer_is_2xx_or_an_api_error(served, client, req):
    r = client.request(req["method"], req["route"], content=req["content"], headers=req["headers"])
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert r.headers["content-type"].startswith("application/json"), r.text[:300]
        assert _api_shaped(req["route"], r.json()), r.text[:300]


def test_the_server_serves_after_the_property(served, client):
    """Runs after the property (file order): the engine lives on, nothing was a 500."""
    _normal_request_works(served.url)
    assert 'status="500"' not in client.get("/metrics").text
