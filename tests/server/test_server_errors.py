"""Every client mistake is a 4xx with the API's error JSON naming the field; the engine lives on.
And the API key: 401 without it, through with Bearer or x-api-key."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import BODY_LIMIT, MODEL

from ninfer.server.app import create_app

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

USER = [{"role": "user", "content": "hi"}]
BAD_ARGS = [
    {"role": "user", "content": "weather?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "w", "arguments": "{city: Oslo"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c", "content": "rain"},
]


def chat(**fields):
    return {"model": MODEL, "messages": USER, "max_tokens": 4, **fields}


CHAT_CASES = [
    ("missing model", {"messages": USER}, "model"),
    ("prompt too long", chat(messages=[{"role": "user", "content": "word " * 3000}]), "messages"),
    ("temperature", chat(temperature=-1), "temperature"),
    ("temperature nan", chat(temperature="nan"), "temperature"),
    ("top_p", chat(top_p=1.5), "top_p"),
    ("top_k", chat(top_k=-5), "top_k"),
    ("min_p", chat(min_p=2), "min_p"),
    ("max_tokens", chat(max_tokens=0), "max_tokens"),
    ("max_completion_tokens", chat(max_completion_tokens=-3), "max_completion_tokens"),
    ("n", chat(n=0), "n"),
    ("stop", chat(stop=[""]), "stop"),
    ("seed", chat(seed="abc"), "seed"),
    ("top_logprobs", chat(logprobs=True, top_logprobs=50), "top_logprobs"),
    ("penalty", chat(presence_penalty=1.0), "presence_penalty"),
    ("messages not a list", chat(messages="hi"), "messages"),
    ("no messages", chat(messages=[]), "messages"),
    ("bad role", chat(messages=[{"role": "robot", "content": "x"}]), "messages[0]"),
    ("message not an object", chat(messages=["hi"]), "messages[0]"),
    (
        "image part",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "messages[0].content[0]",
    ),
    (
        "tool arguments JSON",
        chat(messages=BAD_ARGS),
        "messages[1].tool_calls[0].function.arguments",
    ),
    ("template rejects", chat(messages=[{"role": "system", "content": "s"}]), "messages"),
    ("tool_choice", chat(tools=[], tool_choice="sometimes"), "tool_choice"),
]


@pytest.mark.parametrize("name,body,param", CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_chat_client_mistakes(served, name, body, param):
    r = httpx.post(served.base + "/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert err["message"]


COMPLETION_CASES = [
    ("token outside the vocabulary", {"prompt": [5, 10**7]}, "prompt"),
    ("empty prompt", {"prompt": ""}, "prompt"),
    (
        "breakpoint out of range",
        {"prompt": [5, 6, 7], "cache_breakpoints": [9]},
        "cache_breakpoints",
    ),
    ("logprobs", {"prompt": "x", "logprobs": 99}, "logprobs"),
]


@pytest.mark.parametrize("name,body,param", COMPLETION_CASES, ids=[c[0] for c in COMPLETION_CASES])
def test_completion_client_mistakes(served, name, body, param):
    r = httpx.post(served.base + "/completions", json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_body_not_json_and_over_the_limit(served):
    json_type = {"content-type": "application/json"}
    r = httpx.post(served.base + "/chat/completions", content=b"{nope", headers=json_type)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * (BODY_LIMIT + 10)}]}
    r = httpx.post(served.base + "/chat/completions", json=big, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["param"] == "body"


ANTHROPIC_CASES = [
    ("missing max_tokens", {"messages": USER}, "max_tokens"),
    ("system role", {"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "role"),
    (
        "image block",
        {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
        "messages[0].content[0]",
    ),
    ("thinking type", {"max_tokens": 4, "messages": USER, "thinking": {"type": "x"}}, "thinking"),
    ("temperature", {"max_tokens": 4, "messages": USER, "temperature": 5}, "temperature"),
]


@pytest.mark.parametrize("name,body,needle", ANTHROPIC_CASES, ids=[c[0] for c in ANTHROPIC_CASES])
def test_anthropic_client_mistakes(served, name, body, needle):
    r = httpx.post(served.base + "/messages", json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == 400, r.text
    data = r.json()
    assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
    assert needle in data["error"]["message"]


def test_the_sdks_raise_bad_request_and_the_engine_lives_on(served):
    oai = openai.OpenAI(base_url=served.base, api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, top_p=5)
    ant = anthropic.Anthropic(base_url=served.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.BadRequestError):
        ant.messages.create(model=MODEL, messages=USER, max_tokens=2, extra_body={"top_p": 5})
    ok = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
    assert ok.usage.completion_tokens >= 1
    metrics = httpx.get(served.url + "/metrics").text
    assert 'status="500"' not in metrics and 'status="400"' in metrics


def test_api_key(served, serve_app):
    url = serve_app(create_app(served.llm, MODEL, api_key="sekret"))
    assert httpx.post(url + "/v1/chat/completions", json=chat()).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    r = httpx.post(url + "/v1/chat/completions", json=chat(), headers=wrong)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(url + "/v1/messages", json=chat(), headers={"x-api-key": "nope"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0).models.list()
    good = openai.OpenAI(base_url=url + "/v1", api_key="sekret", max_retries=0)
    assert good.chat.completions.create(model=MODEL, messages=USER, max_tokens=2).choices
    ant = anthropic.Anthropic(base_url=url, api_key="sekret", max_retries=0)
    assert ant.messages.create(model=MODEL, messages=USER, max_tokens=2).content
    assert httpx.get(url + "/health").status_code == 200  # health needs no key
