"""A client that goes away cancels its request at once; the cache stays consistent and keeps
what the request computed."""

from __future__ import annotations

import time

import httpx
import pytest
from server_helpers import MODEL, engine_idle

LONG = 1500  # tokens the requests would generate if nobody cancelled them (tens of seconds)


def _finished(served, reason: str) -> float:
    for line in httpx.get(served.url + "/metrics").text.splitlines():
        if line.startswith(f'ninfer_request_finish_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


def _body(text: str, stream: bool) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": LONG,
        "ignore_eos": True,  # OpenAI routes; /messages has none: its greedy reply runs long
        "temperature": 0,
        "stream": stream,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def test_stream_disconnect_cancels_at_once(served):
    engine_idle(served.llm)
    aborted = _finished(served, "abort")
    text = " ".join(f"tide{i % 11} gull" for i in range(60))
    t0 = time.monotonic()
    with httpx.stream("POST", served.base + "/chat/completions", json=_body(text, True)) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 4:
                break  # leaving the block closes the connection mid-stream
    engine_idle(served.llm, timeout_s=10)
    assert time.monotonic() - t0 < 15
    assert _finished(served, "abort") == aborted + 1
    # the cancelled request's prompt stays cached: the same prompt resumes from it
    body = {**_body(text, False), "max_tokens": 2}
    usage = httpx.post(served.base + "/chat/completions", json=body, timeout=60).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 64
    engine_idle(served.llm)


@pytest.mark.parametrize("route", ["/chat/completions", "/messages"])
def test_non_stream_disconnect_cancels(served, route):
    engine_idle(served.llm)
    aborted = _finished(served, "abort")
    body = _body("walk the shore " * 20, False)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(served.base + route, json=body, timeout=httpx.Timeout(30, read=1.5))
    engine_idle(served.llm, timeout_s=10)
    assert _finished(served, "abort") == aborted + 1
