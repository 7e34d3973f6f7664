"""What clients send never ends in a 500 or a plain-text error; a fault that does happen is the
API's error JSON and counted as a 500; the limits refuse what could never run (issue 41,
item 1)."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import MODEL

from ninfer.server.app import create_app

USER = [{"role": "user", "content": "hi"}]
CHAT = {"model": MODEL, "messages": USER, "max_tokens": 2}
JSON = {"content-type": "application/json"}


def _openai_error(r: httpx.Response, status: int, param: str | None) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    return err["message"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",  # a RecursionError in the parser
        b'{"model": "demo", "x": ' + b"[" * 100 + b"]" * 100 + b"}",
        b'{"model": "demo", "temperature": NaN}',
        b'{"model": "demo", "temperature": 1e999}',
        b'{"model": "demo", "messages": [{"role": "user", "content": "\\udc80"}]}',
    ],
    ids=["recursion", "depth", "nan", "inf", "lone-surrogate"],
)
def test_hostile_bodies_are_400_naming_the_body(served, raw):
    for route in ("/chat/completions", "/messages"):
        r = httpx.post(served.base + route, content=raw, headers=JSON, timeout=30)
        assert r.status_code == 400, r.text
        if route == "/messages":
            assert r.json()["type"] == "error" and "body" in r.json()["error"]["message"]
        else:
            assert r.json()["error"]["param"] == "body"


def test_template_options_and_tool_choice_shapes_are_400(served):
    url = served.base + "/chat/completions"
    for kwargs in ({"messages": 1}, {"tools": []}, {"documents": 1}):
        r = httpx.post(url, json={**CHAT, "chat_template_kwargs": kwargs}, timeout=30)
        _openai_error(r, 400, "chat_template_kwargs")
    tools = [{"type": "function", "function": {"name": "f"}}]
    r = httpx.post(url, json={**CHAT, "tools": tools, "tool_choice": {"function": "f"}})
    _openai_error(r, 400, "tool_choice")
    r = httpx.post(
        served.base + "/messages", json={**CHAT, "chat_template_kwargs": {"messages": 1}}
    )
    assert r.status_code == 400 and "chat_template_kwargs" in r.json()["error"]["message"]


def test_unknown_routes_and_methods_are_api_errors(served):
    r = httpx.get(served.url + "/nope")
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = httpx.get(served.base + "/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"


def test_choices_that_cannot_fit_are_refused(served):
    room = served.llm.engine_config.memory.kv_capacity_tokens
    body = {**CHAT, "n": 16, "max_tokens": room // 16 + 1}
    r = httpx.post(served.base + "/chat/completions", json=body, timeout=30)
    assert "n x max_tokens" in _openai_error(r, 400, "max_tokens")
    body = {"model": MODEL, "prompt": "hi", "n": 16, "max_tokens": room // 16 + 1}
    r = httpx.post(served.base + "/completions", json=body, timeout=30)
    _openai_error(r, 400, "max_tokens")


def test_a_text_longer_than_any_fitting_prompt_is_refused_untokenized(served, monkeypatch):
    driver = served.app.state.driver
    calls = []
    monkeypatch.setattr(served.llm, "render_prompt", lambda p: calls.append(p))
    limit = driver._max_text_chars()
    body = {"model": MODEL, "prompt": "a" * (limit + 1), "max_tokens": 2}
    r = httpx.post(served.base + "/completions", json=body, timeout=30)
    assert "characters" in _openai_error(r, 400, "prompt")
    assert calls == []  # refused before the tokenizer saw it


def test_many_choices_with_top_logprobs_are_one_valid_json_body(served):
    body = {**CHAT, "n": 4, "max_tokens": 6, "logprobs": True, "top_logprobs": 20}
    body["messages"] = [{"role": "user", "content": "count"}]
    r = httpx.post(served.base + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 4
    for c in choices:
        entries = c["logprobs"]["content"]
        assert entries and all(len(e["top_logprobs"]) == 20 for e in entries)


def test_an_internal_fault_is_api_json_and_counted_as_500(served, serve_app):
    app = create_app(served.llm, MODEL)

    async def boom():
        raise RuntimeError("a bug")

    app.router.add_api_route("/v1/messages/boom", boom, methods=["GET"])
    url = serve_app(app)
    r = httpx.get(url + "/v1/messages/boom")
    assert r.status_code == 500
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    assert "a bug" not in r.text  # the traceback goes to the log, not to the client
    metrics = httpx.get(url + "/metrics").text
    assert 'ninfer_requests_total{route="other",status="500"} 1.0' in metrics
    assert 'status="499"' not in metrics
