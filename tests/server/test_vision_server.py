"""Images through the server over a checkpoint with a vision tower (the tiny random one, fp32,
CPU): an OpenAI `image_url` data URL and an Anthropic base64 image are answered; a broken, a
too large or an unsupported image fails alone with a 400 naming its part, and the engine
serves on."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image
from server_helpers import MODEL, engine_idle

from ninfer.llm import LLM
from ninfer.server.app import create_app
from tests.vision.media_helpers import png_header
from tests.vision.vl_checkpoint import build_vl_checkpoint

ASK = {"type": "text", "text": "What is this?"}


def _png(width: int = 30, height: int = 20) -> bytes:
    rgb = np.random.default_rng(width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, "PNG")
    return out.getvalue()


def _url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def vl_served(tmp_path_factory, serve_app):
    folder = tmp_path_factory.mktemp("vl_server")
    build_vl_checkpoint(folder)
    llm = LLM(str(folder), device="cpu", dtype="float32", max_concurrency=2, host_cache_mib=0)
    yield serve_app(create_app(llm, MODEL)) + "/v1", llm
    llm.close()


def _openai(url: str) -> dict:
    part = {"type": "image_url", "image_url": {"url": url}}
    return {"model": MODEL, "messages": [{"role": "user", "content": [ASK, part]}],
            "max_tokens": 3}  # fmt: skip


def _anthropic(data: bytes, media_type: str = "image/png") -> dict:
    source = {"type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode()}
    content = [{"type": "image", "source": source}, ASK]
    return {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": content}]}


BAD = [
    ("broken", b"\x89PNG\r\n\x1a\n broken", "image/png"),
    ("too large", png_header(60_000, 60_000), "image/png"),
    ("unsupported", b"GIF87a not really", "image/tiff"),
]


def test_openai_image_is_answered_and_bad_ones_fail_alone(vl_served):
    base, llm = vl_served
    r = httpx.post(base + "/chat/completions", json=_openai(_url(_png())), timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    for _name, data, media_type in BAD:
        r = httpx.post(base + "/chat/completions", json=_openai(_url(data, media_type)))
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "messages[0].content[1]"
        assert err["message"].startswith("messages[0].content[1]: ")
    r = httpx.post(base + "/chat/completions", json=_openai(_url(_png(40, 44))), timeout=120)
    assert r.status_code == 200, r.text
    engine_idle(llm)


def test_anthropic_image_is_answered_and_bad_ones_fail_alone(vl_served):
    base, llm = vl_served
    r = httpx.post(base + "/messages", json=_anthropic(_png()), timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] == 3
    for _name, data, media_type in BAD:
        r = httpx.post(base + "/messages", json=_anthropic(data, media_type), timeout=60)
        assert r.status_code == 400, r.text
        data = r.json()
        assert data["type"] == "error"
        assert data["error"]["message"].startswith("messages[0].content[0]: ")
    r = httpx.post(base + "/messages", json=_anthropic(_png(24, 60)), timeout=120)
    assert r.status_code == 200, r.text
    engine_idle(llm)
