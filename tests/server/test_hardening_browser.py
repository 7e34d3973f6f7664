"""A web page cannot use the server (issue 41, item 5): no "simple" request (a non-JSON
content type) reaches an API route, a DNS-rebinding host name is refused, and no CORS answer is
given unless --allowed-origins names the page's origin."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import MODEL

from ninfer.server.app import create_app

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BODY = b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}]}'


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages/count_tokens"])
def test_a_simple_request_is_415_naming_content_type(served, route, content_type):
    headers = {} if content_type is None else {"content-type": content_type}
    r = httpx.post(served.url + route, content=BODY, headers=headers)
    assert r.status_code == 415, r.text
    if route.startswith("/v1/messages"):
        assert "Content-Type" in r.json()["error"]["message"]
    else:
        assert r.json()["error"]["param"] == "Content-Type"


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/x+json"])
def test_json_types_with_parameters_are_served(served, content_type):
    r = httpx.post(
        served.url + "/v1/messages/count_tokens",
        content=BODY,
        headers={"content-type": content_type},
    )
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


@pytest.mark.parametrize("path", ["/health", "/metrics", "/v1/models"])
def test_a_rebinding_host_name_is_refused(served, path):
    r = httpx.get(served.url + path, headers={"host": "attacker.example:8000"})
    assert r.status_code == 403 and r.json()["error"]["param"] == "Host"
    for host in ("localhost:1", "127.0.0.1", "[::1]:8000", "10.1.2.3"):
        assert httpx.get(served.url + path, headers={"host": host}).status_code == 200


def test_no_cors_and_foreign_origins_refused(served):
    r = httpx.get(served.url + "/v1/models")
    assert r.status_code == 200
    assert not any(k.startswith("access-control-") for k in r.headers)
    evil = {"origin": "https://evil.example"}
    r = httpx.post(served.base + "/chat/completions", json=CHAT, headers=evil)
    assert r.status_code == 403 and r.json()["error"]["param"] == "Origin"
    r = httpx.options(served.base + "/chat/completions", headers=evil)
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers


def test_allowed_origins_and_hosts(served, serve_app):
    app = create_app(
        served.llm, MODEL, allowed_hosts=["box.lan"], allowed_origins=["http://ui.example"]
    )
    url = serve_app(app)
    ui = {"origin": "http://ui.example"}
    asks = {"access-control-request-method": "POST", "access-control-request-headers": "x"}
    r = httpx.options(url + "/v1/chat/completions", headers={**ui, **asks})
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "http://ui.example"
    assert "POST" in r.headers["access-control-allow-methods"]
    r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers=ui)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://ui.example"
    assert httpx.get(url + "/health", headers={"host": "box.lan:8000"}).status_code == 200
    assert httpx.get(url + "/health", headers={"host": "other.lan"}).status_code == 403


def test_with_an_api_key_any_host_is_accepted(served, serve_app):
    url = serve_app(create_app(served.llm, MODEL, api_key="k", host="0.0.0.0"))
    assert httpx.get(url + "/health", headers={"host": "gpu-box:8000"}).status_code == 200
    r = httpx.get(url + "/v1/models", headers={"host": "gpu-box"})
    assert r.status_code == 401
