"""The wire conversions for a model with a vision tower: OpenAI `image_url` / `input_image`
parts (data URLs; `detail` ignored) and Anthropic `image` blocks (base64, in a tool_result too)
become decoded image parts in place; files and remote URLs are never read; every failure is an
ApiError naming the part."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from ninfer.server import anthropic_api as anth
from ninfer.server import openai_api as oai
from ninfer.server.errors import ApiError

_RGB = np.arange(4 * 3 * 3, dtype=np.uint8).reshape(3, 4, 3) * 7


def _png() -> bytes:
    out = io.BytesIO()
    Image.fromarray(_RGB).save(out, "PNG")
    return out.getvalue()


B64 = base64.b64encode(_png()).decode()
URL = "data:image/png;base64," + B64


def _decoded(part: dict) -> None:
    assert part["type"] == "image" and np.array_equal(np.asarray(part["image"]), _RGB)


def test_openai_image_parts_are_decoded_in_place():
    content = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": URL, "detail": "low"}},
        {"type": "input_image", "image_url": URL, "cache_control": {"type": "ephemeral"}},
    ]
    (msg,) = oai.convert_messages([{"role": "user", "content": content}], supports_images=True)
    text, first, second = msg["content"]
    assert text == {"type": "text", "text": "a"}
    _decoded(first)
    _decoded(second)
    assert set(first) == {"type", "image"} and second["cache_control"] == {"type": "ephemeral"}


OPENAI_BAD = [
    ("a file path", {"type": "image_url", "image_url": {"url": "/etc/passwd"}}, "data: URL"),
    ("a file URL", {"type": "image_url", "image_url": {"url": "file:///etc/hosts"}}, "data: URL"),
    ("http", {"type": "image_url", "image_url": {"url": "http://127.0.0.1/a.png"}}, "not fetched"),
    ("not base64", {"type": "image_url", "image_url": {"url": "data:image/png;base64,%%"}}, "64"),
    (
        "not an image",
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        "format",
    ),  # noqa: E501
    ("no url", {"type": "image_url", "image_url": {}}, "cannot read an image from a NoneType"),
    ("file_id", {"type": "input_image", "file_id": "file-1"}, "file_id"),
    ("audio", {"type": "input_audio", "input_audio": {}}, "audio input is not supported"),
]


@pytest.mark.parametrize("name,part,needle", OPENAI_BAD, ids=[c[0] for c in OPENAI_BAD])
def test_openai_image_failures_name_the_part(name, part, needle):
    messages = [{"role": "user", "content": [{"type": "text", "text": "x"}, part]}]
    with pytest.raises(ApiError) as e:
        oai.convert_messages(messages, supports_images=True)
    assert e.value.param == "messages[0].content[1]" and e.value.status == 400
    assert e.value.message.startswith("messages[0].content[1]: ") and needle in e.value.message


def _request(content, **fields) -> anth.MessagesRequest:
    messages = [{"role": "user", "content": content}]
    return anth.MessagesRequest(model="m", max_tokens=4, messages=messages, **fields)


def test_anthropic_image_blocks_are_decoded_in_place():
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}
    req = _request([{"type": "text", "text": "a"}, block], system="s")
    system, user = anth.convert_messages(req, supports_images=True)
    assert system["role"] == "system" and user["content"][0] == {"type": "text", "text": "a"}
    _decoded(user["content"][1])


def test_anthropic_tool_result_images_stay_in_the_tool_message():
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}
    call = {"type": "tool_use", "id": "t", "name": "s", "input": {}}
    messages = [
        {"role": "user", "content": "shot"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "is_error": True,
             "content": [{"type": "text", "text": "partly"}, image]},
        ]},
    ]  # fmt: skip
    req = anth.MessagesRequest(model="m", max_tokens=4, messages=messages)
    tool = anth.convert_messages(req, supports_images=True)[-1]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "t"
    error, text, picture = tool["content"]
    assert error == {"type": "text", "text": "Error: "} and text["text"] == "partly"
    _decoded(picture)


ANTHROPIC_BAD = [
    ("url source", {"type": "url", "url": "https://x.y/a.png"}, "not fetched"),
    ("file source", {"type": "file", "file_id": "f"}, "'file' is not supported"),
    ("media type", {"type": "base64", "media_type": "text/plain", "data": B64}, "media_type"),
    ("bad data", {"type": "base64", "media_type": "image/png", "data": "AAAA"}, "format"),
]


@pytest.mark.parametrize("name,source,needle", ANTHROPIC_BAD, ids=[c[0] for c in ANTHROPIC_BAD])
def test_anthropic_image_failures_name_the_block(name, source, needle):
    req = _request([{"type": "text", "text": "x"}, {"type": "image", "source": source}])
    with pytest.raises(ApiError) as e:
        anth.convert_messages(req, supports_images=True)
    assert e.value.param == "messages[0].content[1]" and needle in e.value.message
