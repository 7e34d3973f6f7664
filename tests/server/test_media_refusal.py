"""Issue 40 on the wire: without a vision tower every media part (OpenAI chat and responses
parts, Anthropic image and document blocks, inside a tool_result too) is a 400 in its API's
error shape naming the part; the engine answers the next request."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import MODEL, engine_idle

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="  # noqa: E501
B64 = {"type": "base64", "media_type": "image/png", "data": PNG.split(",", 1)[1]}
ASK = {"type": "text", "text": "What is this?"}

OPENAI_PARTS = [
    ("image_url", {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}}, "image"),
    ("image_url http", {"type": "image_url", "image_url": {"url": "https://x.y/a.png"}}, "image"),
    ("input_image", {"type": "input_image", "image_url": PNG}, "image"),
    ("input_audio", {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}, "audio"),
    ("file", {"type": "file", "file": {"file_data": "", "filename": "a.pdf"}}, "file"),
    ("video_url", {"type": "video_url", "video_url": {"url": "a.mp4"}}, "video"),
]


def _openai(part: dict, position: int) -> dict:
    content = [ASK, part] if position else [part, ASK]
    messages = [
        {"role": "system", "content": "You see."},
        {"role": "user", "content": content},
    ]
    return {"model": MODEL, "messages": messages, "max_tokens": 4}


def _answers(served) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    r = httpx.post(served.base + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    engine_idle(served.llm)


@pytest.mark.parametrize("name,part,kind", OPENAI_PARTS, ids=[p[0] for p in OPENAI_PARTS])
@pytest.mark.parametrize("position", [0, 1])
def test_openai_media_part_is_a_400_naming_it(served, name, part, kind, position):
    r = httpx.post(served.base + "/chat/completions", json=_openai(part, position), timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    where = f"messages[1].content[{position}]"
    assert err["type"] == "invalid_request_error" and err["param"] == where
    assert err["message"].startswith(f"{where}: {kind} input ")
    if kind in ("image", "video"):
        assert "vision tower (this model has none)" in err["message"]
    _answers(served)


def test_openai_streamed_request_is_refused_before_the_stream(served):
    body = {**_openai(OPENAI_PARTS[0][1], 0), "stream": True}
    r = httpx.post(served.base + "/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[1].content[0]"
    _answers(served)


ANTHROPIC_CASES = [
    ("image base64", [{"type": "image", "source": B64}, ASK], "messages[0].content[0]", "image"),
    (
        "image url",
        [ASK, {"type": "image", "source": {"type": "url", "url": "https://x.y/a.png"}}],
        "messages[0].content[1]",
        "image",
    ),
    (
        "document",
        [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}],
        "messages[0].content[0]",
        "document",
    ),
]


@pytest.mark.parametrize(
    "name,content,where,kind", ANTHROPIC_CASES, ids=[c[0] for c in ANTHROPIC_CASES]
)
def test_anthropic_media_block_is_a_400_naming_it(served, name, content, where, kind):
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    for route in ("/messages", "/messages/count_tokens"):
        r = httpx.post(served.base + route, json=body, timeout=30)
        assert r.status_code == 400, r.text
        data = r.json()
        assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
        assert data["error"]["message"].startswith(f"{where}: {kind} input ")
    _answers(served)


def test_anthropic_image_in_a_tool_result_is_refused_naming_it(served):
    messages = [
        {"role": "user", "content": "Take a screenshot."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "here"}, {"type": "image", "source": B64},
                ]},
            ],
        },
    ]  # fmt: skip
    tools = [{"name": "shot", "input_schema": {"type": "object", "properties": {}}}]
    body = {"model": MODEL, "max_tokens": 4, "messages": messages, "tools": tools}
    r = httpx.post(served.base + "/messages", json=body, timeout=30)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("messages[2].content[0].content[1]: image input needs a checkpoint")
    _answers(served)
