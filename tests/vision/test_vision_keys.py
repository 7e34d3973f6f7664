"""An expanded prompt's images as cache identity (spec §5.1): the same picture with the same
tokens gives the same block keys; a different picture with identical tokens changes every key
from the block holding its first pad token on, and none before; the vision spans ride on the
prepared prompt (no tap or resume strictly inside them)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from ninfer.cache.keys import prepare_prompt
from ninfer.engine.images import PromptImages
from ninfer.page import PAGE_SIZE
from ninfer.vision.preprocess import ImageProcessorConfig

PAD = 100
CFG = ImageProcessorConfig(patch_size=4, merge_size=2, min_pixels=256, max_pixels=40 * 40)


def _image(width: int, height: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _blocks(ids: list[int], images):
    expanded, vision = PromptImages.build(ids, PAD, images, CFG)
    return expanded, vision, prepare_prompt(expanded, vision.media_items())


@settings(max_examples=25, deadline=None)
@given(
    before=st.integers(0, 200), after=st.integers(0, 200), width=st.integers(8, 60),
    height=st.integers(8, 60), seed=st.integers(0, 5),
)  # fmt: skip
def test_same_image_same_keys_different_image_differs_from_its_block(
    before, after, width, height, seed
):
    ids = [1] * before + [PAD] + [2] * after
    ids_a, vision, a = _blocks(ids, [_image(width, height, seed)])
    ids_b, _, b = _blocks(ids, [_image(width, height, seed)])
    assert ids_a == ids_b and a.hashes == b.hashes
    other = np.array(_image(width, height, seed))
    other[0, 0, 0] ^= 0xFF  # one pixel differs
    ids_c, _, c = _blocks(ids, [Image.fromarray(other)])
    assert ids_c == ids_a  # identical tokens
    first = vision.spans[0].start // PAGE_SIZE
    assert a.hashes[:first] == c.hashes[:first]
    assert all(x != y for x, y in zip(a.hashes[first:], c.hashes[first:], strict=True))
    start, length = vision.spans[0].start, vision.spans[0].num_tokens(vision.merge)
    assert [(s.begin, s.length) for s in a.vision_spans] == [(start, length)]
    assert ids_a[start : start + length] == [PAD] * length


def test_text_only_prompt_keys_unchanged():
    ids = list(range(101, 300))
    expanded, vision, blocks = _blocks(ids, [])
    assert expanded == ids and vision.rope_delta == 0
    assert blocks.hashes == prepare_prompt(ids).hashes and not blocks.vision_spans


def test_an_image_that_cannot_be_processed_is_named():
    with pytest.raises(ValueError, match="^messages: image 1: image aspect ratio"):
        PromptImages.build([PAD, PAD], PAD, [_image(20, 20, 0), _image(1, 300, 1)], CFG)
