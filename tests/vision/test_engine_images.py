"""Images through the engine (fp32, CPU, a tiny random checkpoint with a vision tower): the
loader finds the tower, `LLM.chat` with images gives transformers' greedy tokens, the prefix
cache keys the images (same image hits, a different one misses, no resume inside a span)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from ninfer import LLM, SamplingParams
from tests.vision.vl_checkpoint import build_vl_checkpoint, hf_greedy

STEPS = 5
GREEDY = SamplingParams(max_tokens=STEPS, temperature=0, ignore_eos=True)
OPTIONS = dict(device="cpu", dtype="float32", max_concurrency=2, kv_capacity=8192)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vl")
    return folder, build_vl_checkpoint(folder)


@pytest.fixture(scope="module")
def vl(checkpoint):
    with LLM(str(checkpoint[0]), host_cache_mib=0, **OPTIONS) as llm:
        yield llm


def _image(width: int, height: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _ask(*images, text="What is in it?") -> list[dict]:
    return [{"role": "user", "content": [*({"image": im} for im in images), text]}]


def _check_against_hf(llm, hf, messages) -> None:
    prompt = llm.render_chat(messages).prompt
    (got,) = llm.chat(messages, GREEDY)
    assert list(got.token_ids) == hf_greedy(hf, prompt.token_ids, prompt.images, STEPS)


def test_the_loader_finds_the_tower(vl):
    assert vl.supports_images
    assert vl.engine.runner.model.model.visual is not None


def test_one_image_equals_transformers(vl, checkpoint):
    _check_against_hf(vl, checkpoint[1], _ask(_image(50, 30, 0)))


def test_two_images_of_different_sizes_equal_transformers(vl, checkpoint):
    messages = _ask(_image(23, 97, 1), _image(120, 64, 2), text="Compare them.")
    _check_against_hf(vl, checkpoint[1], messages)


def test_image_tokens_without_images_are_refused(vl):
    pad = vl.tokenizer.token_to_id("<|image_pad|>")
    with pytest.raises(ValueError, match="^prompt: holds image pad / vision tokens"):
        vl.generate([1, 2, pad, 3], GREEDY)
    with pytest.raises(ValueError, match="^prompt: holds image pad / vision tokens"):
        vl.generate("look: <|vision_start|>", GREEDY)
