"""`ninfer.vision.parts`: image parts in every form users send become
`{"type": "image", "image": <RGB>}` in place; the official template renders each as
`<|vision_start|><|image_pad|><|vision_end|>`; what a model with a tower still refuses."""

from __future__ import annotations

import base64
import copy

import numpy as np
import pytest
from media_helpers import anthropic_source, data_url, encode, pattern, pixels
from PIL import Image

from ninfer.chat_template import ChatTemplate, prepare_messages
from ninfer.demo import DEMO_DIR
from ninfer.tokenizer import Tokenizer
from ninfer.vision.parts import (
    check_placeholders,
    image_part,
    normalise_messages,
    split_images,
)

PNG = encode(pattern(), "PNG")
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def _forms(tmp_path) -> dict[str, dict]:
    path = tmp_path / "p.png"
    path.write_bytes(PNG)
    url = data_url(PNG)
    return {
        "image_url": {"type": "image_url", "image_url": {"url": url, "detail": "high"}},
        "image_url string": {"type": "image_url", "image_url": url},
        "input_image": {"type": "input_image", "image_url": url, "detail": "auto"},
        "image PIL": {"type": "image", "image": pattern()},
        "image bytes": {"type": "image", "image": PNG},
        "image path": {"type": "image", "image": str(path)},
        "untyped image": {"image": path},
        "hf url": {"type": "image", "url": url},
        "hf path": {"type": "image", "path": str(path)},
        "hf base64": {"type": "image", "base64": base64.b64encode(PNG).decode()},
        "anthropic": {"type": "image", "source": anthropic_source(PNG)},
    }


def test_every_image_form_becomes_a_decoded_image_part_in_place(tmp_path):
    for name, part in _forms(tmp_path).items():
        marked = {**part, "cache_control": {"type": "ephemeral"}}
        messages = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, marked, "b"]},
        ]
        before = copy.deepcopy(messages)
        out = normalise_messages(messages, True, local_files=True)
        assert messages == before or name == "image PIL", name  # the input is not mutated
        assert out[0] is messages[0]
        first, image, last = out[1]["content"]
        assert first == {"type": "text", "text": "a"} and last == {"type": "text", "text": "b"}
        assert set(image) == {"type", "image", "cache_control"} and image["type"] == "image"
        assert image["image"].mode == "RGB", name
        assert np.array_equal(pixels(image["image"]), pixels(pattern())), name


def test_files_are_read_only_where_local_files_allows(tmp_path):
    part = _forms(tmp_path)["image path"]
    with pytest.raises(ValueError, match=r"^messages\[0\]\.content\[0\]: .*data: URL"):
        normalise_messages([{"role": "user", "content": [part]}], True)


@pytest.mark.parametrize(
    "part,needle",
    [
        ({"type": "video", "video": ["a.png"]}, "video input is not supported"),
        ({"type": "input_audio", "input_audio": {}}, "audio input is not supported"),
        ({"type": "file", "file": {}}, "file input is not supported"),
        ({"type": "input_image", "file_id": "f"}, "by file_id are not supported"),
        ({"type": "image"}, "holds no image"),
        ({"type": "image_url", "image_url": {"url": "https://x.y/a.png"}}, "not fetched"),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            "supported format",
        ),
    ],
)
def test_a_model_with_a_tower_still_refuses_what_it_cannot_read(part, needle):
    messages = [{"role": "user", "content": [{"type": "text", "text": "x"}, part]}]
    with pytest.raises(ValueError, match=r"^messages\[0\]\.content\[1\]: ") as e:
        normalise_messages(messages, True)
    assert needle in str(e.value)
    if needle.endswith("input is not supported"):
        assert "takes text and images" in str(e.value)


def test_string_parts_become_text_parts_not_placeholders():
    """The template tests a string part for the substring "image": one saying "image" was
    rendered as a vision placeholder."""
    messages = [{"role": "user", "content": ["Describe the image ", {"type": "text", "text": "."}]}]
    out = normalise_messages(messages, False)
    assert out[0]["content"][0] == {"type": "text", "text": "Describe the image "}
    template = ChatTemplate(Tokenizer.from_dir(DEMO_DIR))
    text = template.render_text(prepare_messages(out))
    assert "Describe the image ." in text and "<|vision_start|>" not in text


def test_split_images_keeps_the_order_the_template_renders_placeholders_in():
    red, blue = pattern(2, 2), pattern(2, 2).transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    messages = [
        {"role": "system", "content": "You see."},
        {"role": "user", "content": [{"type": "image", "image": red}, "Compare it with"]},
        {"role": "assistant", "content": "Which one?"},
        {"role": "user", "content": ["this:", {"image": blue, "cache_control": {"type": "x"}}]},
    ]
    shown, images = split_images(normalise_messages(messages, True))
    assert [pixels(i).tolist() for i in images] == [pixels(red).tolist(), pixels(blue).tolist()]
    assert shown[1]["content"][0] == {"type": "image"}
    assert shown[3]["content"][1] == {"type": "image", "cache_control": {"type": "x"}}
    text = ChatTemplate(Tokenizer.from_dir(DEMO_DIR)).render_text(prepare_messages(shown))
    user_1 = f"<|im_start|>user\n{PLACEHOLDER}Compare it with<|im_end|>"
    user_2 = f"<|im_start|>user\nthis:{PLACEHOLDER}<|im_end|>"
    assert user_1 in text and user_2 in text and text.count(PLACEHOLDER) == 2
    assert text.index(user_1) < text.index(user_2)


def test_a_system_image_is_refused_by_the_official_template():
    shown, _ = split_images(
        normalise_messages([{"role": "system", "content": [{"image": pattern()}]}], True)
    )
    template = ChatTemplate(Tokenizer.from_dir(DEMO_DIR))
    with pytest.raises(ValueError, match="System message cannot contain images"):
        template.render_text(prepare_messages([*shown, {"role": "user", "content": "x"}]))


def test_placeholders_must_match_the_images():
    check_placeholders([5, 9, 5], 9, 1)
    check_placeholders([5, 5], None, 0)
    with pytest.raises(ValueError, match="wrote 1 <|image_pad|> placeholders for 2 images"):
        check_placeholders([5, 9, 5], 9, 2)
    with pytest.raises(ValueError, match="wrote 0"):
        check_placeholders([5, 9], None, 1)


def test_image_part_keeps_nothing_of_the_wire_form():
    part = {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "low"}}
    got = image_part(part, "m")
    assert set(got) == {"type", "image"}
