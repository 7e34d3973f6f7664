"""`LLM.render_chat` over a model that says it has a vision tower: image parts decoded and
processed, carried on the prompt in placeholder order, one `<|image_pad|>` per image checked.
(The tower itself is not here: the model is the tiny text model, flagged; the engine's use
of images is tests/vision/test_engine_images.py.)"""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny_tokenizer import build_tiny_bpe
from media_helpers import data_url, encode, pattern
from PIL import Image
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from ninfer import LLM
from ninfer.chat_template import ChatTemplate
from ninfer.models.presets import build_random_model
from ninfer.models.qwen3_5 import Qwen35ForCausalLM
from ninfer.tokenizer import Tokenizer
from ninfer.vision.preprocess import ImageProcessorConfig, process_image
from tests.engine.engine_helpers import TINY
from tests.models.vision_util import PREPROCESSOR

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


class _FlaggedWithTower(Qwen35ForCausalLM):
    @property
    def supports_images(self) -> bool:
        return True


@pytest.fixture(scope="module")
def seeing_llm(tmp_path_factory):
    folder = build_tiny_bpe(tmp_path_factory.mktemp("vision_tok"))
    hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    hf.save(str(folder / "tokenizer.json"))
    tok = Tokenizer.from_dir(folder)
    model = build_random_model(TINY, torch.float32, "cpu", seed=1)
    model.__class__ = _FlaggedWithTower
    options = dict(device="cpu", max_concurrency=2, kv_capacity=4096, host_cache_mib=0)
    pcfg = ImageProcessorConfig.from_dict(PREPROCESSOR)
    template = ChatTemplate(tok)
    with LLM.from_model(model, tok, template, image_processor=pcfg, **options) as llm:
        yield llm


def test_images_ride_on_the_prompt_in_placeholder_order(seeing_llm, tmp_path):
    assert seeing_llm.supports_images
    path = tmp_path / "a.png"
    first = pattern(5, 3)
    path.write_bytes(encode(first, "PNG"))
    second = pattern(4, 4).transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    url = data_url(encode(second, "PNG"))
    messages = [
        {"role": "user", "content": [{"type": "image", "image": str(path)}, "and"]},
        {"role": "assistant", "content": "Yes?"},
        {"role": "user", "content": [{"type": "image_url", "image_url": url}]},
    ]
    chat = seeing_llm.render_chat(messages)
    assert chat.text.count(PLACEHOLDER) == 2
    pad = seeing_llm.tokenizer.token_to_id("<|image_pad|>")
    images = chat.prompt.images
    pcfg = ImageProcessorConfig.from_dict(PREPROCESSOR)
    want = [process_image(im, pcfg) for im in (first, second)]
    assert [p.digest for p in images.images] == [w.digest for w in want]
    assert chat.prompt.token_ids.count(pad) == sum(w.num_tokens for w in want)
    assert [s.num_tokens(2) for s in images.spans] == [w.num_tokens for w in want]


def test_text_that_spells_the_placeholder_is_refused(seeing_llm):
    messages = [{"role": "user", "content": [{"image": pattern()}, "<|image_pad|> here"]}]
    with pytest.raises(ValueError, match=r"wrote 2 <\|image_pad\|> placeholders for 1 images"):
        seeing_llm.render_chat(messages)


def test_text_only_prompts_carry_no_images(seeing_llm):
    assert seeing_llm.render_chat([{"role": "user", "content": "hi"}]).prompt.images is None


def test_a_broken_image_fails_alone_naming_its_part(seeing_llm):
    broken = [{"role": "user", "content": [{"type": "image", "image": b"\x89PNG broken"}]}]
    with pytest.raises(ValueError, match=r"^messages\[0\]\.content\[0\]: "):
        seeing_llm.render_chat(broken)
    with pytest.raises(ValueError, match=r"^messages\[0\]\.content\[0\]: video input is not"):
        seeing_llm.render_chat([{"role": "user", "content": [{"type": "video", "video": "v"}]}])


def test_a_server_renders_without_reading_files(seeing_llm, tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(encode(pattern(), "PNG"))
    messages = [{"role": "user", "content": [{"type": "image", "image": str(path)}]}]
    assert len(seeing_llm.render_chat(messages).prompt.images.images) == 1
    with pytest.raises(ValueError, match=r"^messages\[0\]\.content\[0\]: .*files are not read"):
        seeing_llm.render_chat(messages, local_files=False)
