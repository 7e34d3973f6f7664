"""`ninfer chat`'s `/image PATH`: with a text-only model a clear line and the chat goes on; with
a model that takes images, the decoded image goes with the next user message."""

from __future__ import annotations

import argparse
import io
import re
from types import SimpleNamespace

from PIL import Image
from rich.console import Console

from ninfer.cli.chat import Chat
from tests.cli.cli_util import ENGINE_FLAGS, ninfer
from tests.cli.test_chat import STATS


def test_image_on_a_text_model_says_so_and_the_chat_goes_on(tmp_path):
    path = tmp_path / "p.png"
    Image.new("RGB", (4, 4), (9, 9, 9)).save(path)
    script = f"/image {path}\nhello\n/exit\n"
    run = ninfer("chat", "--max-tokens", "3", *ENGINE_FLAGS, input=script)
    assert run.returncode == 0, run.stderr
    assert "this model takes no images (it has no vision tower)" in run.stdout
    turns = list(re.finditer(STATS, run.stdout))
    assert len(turns) == 1 and turns[0]["tok"] == "3"
    assert run.stdout.rstrip().endswith("bye")


def _chat(supports_images: bool) -> Chat:
    llm = SimpleNamespace(
        supports_images=supports_images,
        engine_config=SimpleNamespace(cache=SimpleNamespace(prefix_reuse=True)),
    )
    args = argparse.Namespace(
        model="some/checkpoint", thinking=False, max_tokens=8, system="",
        temperature=0.0, top_p=1.0,
    )  # fmt: skip
    return Chat(Console(file=io.StringIO()), llm, args)


def test_an_attached_image_goes_with_the_next_message_only(tmp_path):
    path = tmp_path / "a b.png"
    Image.new("RGBA", (6, 4), (255, 0, 0, 0)).save(path)
    chat = _chat(True)
    assert "image attached (6x4); 1 will go" in chat.attach(f'"{path}"')
    assert "cannot read the image file" in chat.attach(str(tmp_path / "missing.png"))
    assert "needs a path" in chat.attach("  ")
    chat.add_user("what is it?")
    image, text = chat.messages[-1]["content"]
    assert image["type"] == "image" and image["image"].getpixel((0, 0)) == (255, 255, 255)
    assert text == {"type": "text", "text": "what is it?"}
    chat.add_user("and now?")
    assert chat.messages[-1] == {"role": "user", "content": "and now?"}


def test_reset_drops_attached_images_and_a_text_model_attaches_none(tmp_path):
    path = tmp_path / "a.png"
    Image.new("RGB", (2, 2)).save(path)
    chat = _chat(True)
    chat.attach(str(path))
    chat.reset()
    chat.add_user("hi")
    assert chat.messages[-1]["content"] == "hi"
    text_only = _chat(False)
    assert "takes no images" in text_only.attach(str(path))
    text_only.add_user("hi")
    assert text_only.messages[-1]["content"] == "hi"
