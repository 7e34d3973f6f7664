"""Issue 40: a model without a vision tower refuses every media content part of `LLM.chat`,
naming the part, before anything is rendered or submitted; the engine serves on.

The three failures the issue reports: an `image_url` part was rendered as one placeholder and
answered as if there were no picture; a broken image finished `length`; two requests with
different images and the same text shared their cache past the image."""

from __future__ import annotations

import pytest

from ninfer import LLM, SamplingParams
from ninfer.models.qwen3_5 import Qwen35ForCausalLM
from ninfer.vision.parts import PART_MEDIA, media_kind

PNG_1PX = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5Erk"
    "Jggg=="
)
GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    with LLM(device="cpu", max_concurrency=2, kv_capacity=8192, host_cache_mib=0) as engine:
        yield engine


def _asking(part: dict, text: str = "What is in the picture?") -> list[dict]:
    return [
        {"role": "system", "content": "You describe pictures."},
        {"role": "user", "content": [part, {"type": "text", "text": text}]},
    ]


def _image_url(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _served_normally(llm: LLM) -> None:
    out = llm.chat([{"role": "user", "content": "Hello"}], GREEDY)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 4
    llm.check_idle()


def test_a_text_model_says_it_takes_no_images(llm):
    assert llm.supports_images is False
    assert Qwen35ForCausalLM(llm.model_config, device="meta").supports_images is False


def test_an_image_url_part_is_refused_naming_it(llm):
    lookups = llm.cache_stats().lookups
    with pytest.raises(ValueError, match=r"^messages\[1\]\.content\[0\]: image input needs a "
                       r"checkpoint with a vision tower \(this model has none\)$"):  # fmt: skip
        llm.chat(_asking(_image_url("data:image/png;base64," + PNG_1PX)), GREEDY)
    assert llm.cache_stats().lookups == lookups  # nothing reached the engine
    _served_normally(llm)


def test_a_broken_image_is_refused_not_answered(llm):
    with pytest.raises(ValueError, match=r"^messages\[1\]\.content\[0\]: image input"):
        llm.chat(_asking(_image_url("data:image/png;base64,AAAA")), GREEDY)
    _served_normally(llm)


def test_different_images_with_the_same_text_share_nothing(llm):
    """Both are refused: no request with a picture the model cannot see reaches the cache."""
    before = llm.cache_stats()
    for url in ("data:image/png;base64," + PNG_1PX, "data:image/png;base64,AAAA"):
        with pytest.raises(ValueError, match="vision tower"):
            llm.chat(_asking(_image_url(url)), GREEDY)
    after = llm.cache_stats()
    assert (after.lookups, after.reuse_tokens) == (before.lookups, before.reuse_tokens)
    _served_normally(llm)


MEDIA_PARTS = [
    ("image_url", _image_url("https://example.com/cat.png"), "image"),
    ("input_image", {"type": "input_image", "image_url": "data:image/png;base64,AA"}, "image"),
    ("image", {"type": "image", "image": "/tmp/cat.png"}, "image"),
    ("untyped image key", {"image": "/tmp/cat.png"}, "image"),
    ("untyped image_url key", {"image_url": {"url": "data:,"}}, "image"),
    ("anthropic image", {"type": "image", "source": {"type": "base64", "data": ""}}, "image"),
    ("video", {"type": "video", "video": ["a.png"]}, "video"),
    ("video_url", {"type": "video_url", "video_url": {"url": "x.mp4"}}, "video"),
    ("input_audio", {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}, "audio"),
    ("file", {"type": "file", "file": {"file_id": "f"}}, "file"),
    ("input_file", {"type": "input_file", "file_id": "f"}, "file"),
    ("document", {"type": "document", "source": {"type": "text", "data": "x"}}, "document"),
]


@pytest.mark.parametrize("name,part,kind", MEDIA_PARTS, ids=[p[0] for p in MEDIA_PARTS])
def test_every_media_part_is_refused_naming_it_and_its_medium(llm, name, part, kind):
    assert media_kind(part) == kind
    with pytest.raises(ValueError, match=rf"^messages\[1\]\.content\[0\]: {kind} input "):
        llm.chat(_asking(part), GREEDY)


def test_the_part_table_covers_what_the_official_template_renders_as_vision():
    for key in ("image", "image_url", "video"):
        assert media_kind({key: None}) in ("image", "video")
    assert set(PART_MEDIA.values()) == {"image", "video", "audio", "file", "document"}
    assert media_kind({"type": "text", "text": "an image"}) is None
    assert media_kind("an image") is None


def test_in_a_batch_the_refused_conversation_fails_alone(llm):
    image = _asking(_image_url("data:image/png;base64," + PNG_1PX))
    plain = [{"role": "user", "content": "Hello"}]
    refused, answered = llm.chat([image, plain], GREEDY)
    assert refused.finish_reason == "error"
    assert refused.error.startswith("messages[1].content[0]: image input needs")
    assert answered.finish_reason == "length" and len(answered.token_ids) == 4


def test_stream_and_render_chat_refuse_too(llm):
    image = _asking(_image_url("data:image/png;base64," + PNG_1PX))
    with pytest.raises(ValueError, match="vision tower"):
        llm.stream(image, GREEDY)
    with pytest.raises(ValueError, match="vision tower"):
        llm.render_chat(image)
    _served_normally(llm)


def test_a_string_part_saying_image_is_text_not_a_placeholder(llm):
    """The official template tests a string part for the substring "image"."""
    chat = llm.render_chat([{"role": "user", "content": ["Describe the image", " please."]}])
    assert "Describe the image please." in chat.text and "<|vision_start|>" not in chat.text
