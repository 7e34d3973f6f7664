"""The 3-D rotary positions of prompts with images (`ninfer.vision.positions`) equal
transformers' Qwen3.5 `get_rope_index` on drawn prompt layouts, and the rope delta places
decoded tokens where transformers' generation does; pad expansion and span checks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model

from ninfer.vision.positions import ImageSpan, check_spans, expand_image_pads, mrope_positions
from tests.models.vision_util import IMAGE, hf_config

PAD = 7


@pytest.fixture(scope="module")
def hf_model():
    return Qwen3_5Model(hf_config("section-default")).eval()


@st.composite
def layouts(draw):
    """(number of tokens, spans, merge): text runs and images, at least one text token between
    two images (the template's vision_end / vision_start)."""
    merge = draw(st.sampled_from([1, 2, 3]))
    spans, n = [], draw(st.integers(0, 6))
    for _ in range(draw(st.integers(0, 4))):
        grid = (1, merge * draw(st.integers(1, 7)), merge * draw(st.integers(1, 7)))
        spans.append(ImageSpan(n, grid))
        n = spans[-1].end(merge) + draw(st.integers(1, 6))
    if not spans:
        return max(n, 1), spans, merge
    return n - draw(st.integers(0, 1)), spans, merge  # 1: the prompt ends with an image


def _hf_positions(model, n: int, spans: list[ImageSpan], merge: int):
    ids = torch.zeros(1, n, dtype=torch.long)
    for s in spans:
        ids[0, s.start : s.end(merge)] = IMAGE
    model.config.vision_config.spatial_merge_size = merge
    grids = torch.tensor([s.grid for s in spans]) if spans else None
    pos, delta = model.get_rope_index(ids, (ids == IMAGE).int(), image_grid_thw=grids)
    return pos[:, 0], int(delta)


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_positions_match_transformers(hf_model, layout):
    n, spans, merge = layout
    positions, delta = mrope_positions(n, spans, merge)
    want, want_delta = _hf_positions(hf_model, n, spans, merge)
    assert positions.dtype == torch.int64 and torch.equal(positions, want)
    assert delta == want_delta
    text = torch.ones(n, dtype=torch.bool)
    for s in spans:
        text[s.start : s.end(merge)] = False
    assert (positions == positions[0]).all(0).logical_or(~text).all()  # text: t = h = w
    assert n + delta == int(positions.max()) + 1  # where the next (decoded) token goes


def test_an_image_span_and_the_text_after_it():
    """grid 1 x 4 x 6 patches, merge 2: a 2 x 3 merged grid at index 2."""
    positions, delta = mrope_positions(10, [ImageSpan(2, (1, 4, 6))], 2)
    assert positions.tolist() == [
        [0, 1, 2, 2, 2, 2, 2, 2, 5, 6],
        [0, 1, 2, 2, 2, 3, 3, 3, 5, 6],
        [0, 1, 2, 3, 4, 2, 3, 4, 5, 6],
    ]
    assert delta == 7 - 10


def test_expand_image_pads():
    ids = [1, 2, PAD, 3, PAD, PAD, 4]
    grids = [(1, 2, 4), (1, 2, 2), (1, 6, 2)]
    out, spans = expand_image_pads(ids, PAD, grids, 2)
    assert out == [1, 2, PAD, PAD, 3, PAD, PAD, PAD, PAD, 4]
    assert spans == [ImageSpan(2, (1, 2, 4)), ImageSpan(5, (1, 2, 2)), ImageSpan(6, (1, 6, 2))]
    with pytest.raises(ValueError, match="2 image pad tokens for 1 images"):
        expand_image_pads([PAD, 1, PAD], PAD, [(1, 2, 2)], 2)
    assert expand_image_pads([1, 2], PAD, [], 2) == ([1, 2], [])


@pytest.mark.parametrize(
    "n,spans",
    [
        (10, [ImageSpan(2, (1, 3, 4))]),  # grid not a multiple of merge
        (5, [ImageSpan(2, (1, 4, 4))]),  # past the prompt's end
        (20, [ImageSpan(4, (1, 2, 4)), ImageSpan(5, (1, 2, 2))]),  # overlapping
        (20, [ImageSpan(4, (0, 2, 2))]),  # empty
    ],
)
def test_bad_spans_are_refused(n, spans):
    with pytest.raises(ValueError, match="image span"):
        check_spans(n, spans, 2)
    with pytest.raises(ValueError):
        mrope_positions(n, spans, 2)
