"""ninfer's image preprocessing (`ninfer.vision.preprocess`) against transformers' processors
for Qwen3.5 (`Qwen2VLImageProcessor`): grids and patch layout exactly; pixel values within two
uint8 levels of the PIL backend on photo-like images (Pillow's and torch's resize kernels round
differently), and equal to the default torchvision backend's where torchvision is installed.
Also smart_resize against transformers' on drawn sizes, the config fields, and the digest."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
    Qwen2VLImageProcessorPil,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
    smart_resize as hf_smart_resize,
)

from ninfer.vision.preprocess import (
    CLIP_MEAN,
    ImageProcessorConfig,
    process_image,
    smart_resize,
)

QWEN35 = {  # the fields of the Qwen3.5 checkpoints' preprocessor_config.json
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
}  # fmt: skip
SMALL = {  # tiny bounds, CLIP statistics and bilinear: every branch at small sizes
    "size": {"shortest_edge": 20 * 20, "longest_edge": 64 * 64},
    "patch_size": 5, "merge_size": 2, "temporal_patch_size": 3, "resample": 2,
    "image_mean": list(CLIP_MEAN), "image_std": [0.26, 0.26, 0.27],
}  # fmt: skip
LEVEL = 1 / 255  # one uint8 level, in rescaled units
# (width, height): tiny (scaled up), large (scaled down), odd aspect ratios, already on the grid
SIZES = [(3, 5), (1000, 700), (2500, 40), (33, 401), (64, 96), (257, 255)]


def _image(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """Photo-like pixels: smooth colour fields plus a little grain. (On white noise, a resize
    that grows one side and shrinks the other differs by up to ~25 levels between Pillow and
    torch: both round and clip to uint8 between their two passes, in a different order.)"""
    rng = np.random.default_rng(seed)
    shape = (3, 4) if mode == "L" else (3, 4, len(mode))
    coarse = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)
    smooth = np.array(coarse.resize((width, height), Image.BILINEAR), dtype=np.int16)
    grain = rng.integers(-6, 7, smooth.shape, dtype=np.int16)
    return Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8), mode)


def _tolerance(raw: dict) -> float:
    std = raw.get("image_std", [0.5])
    return 2 * LEVEL / min(std) + 1e-5  # at most 2 levels (upscaling overshoot near edges)


@pytest.mark.parametrize("raw", [QWEN35, SMALL], ids=["qwen3.5", "small"])
@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_matches_the_pil_processor(raw, size):
    if raw is QWEN35 and max(size) >= 1000:
        size = (size[0] * 5, size[1] * 5)  # 5000x3500: past the checkpoints' max_pixels
    image = _image(*size, seed=sum(size))
    cfg = ImageProcessorConfig.from_dict(raw)
    got = process_image(image, cfg)
    want = Qwen2VLImageProcessorPil(**raw)(image, return_tensors="pt")
    assert [list(got.grid)] == want["image_grid_thw"].tolist()
    assert got.pixel_values.dtype == torch.float32
    assert got.pixel_values.shape == want["pixel_values"].shape
    diff = (got.pixel_values - want["pixel_values"]).abs()
    assert diff.max().item() < _tolerance(raw)
    assert diff.mean().item() < 0.5 * LEVEL / 0.26  # most pixels equal
    assert got.num_tokens == got.grid[1] * got.grid[2] // cfg.merge_size**2


def test_matches_the_pil_processor_exactly_without_resizing():
    """On the grid already (no resize): only the normalisation's fp32 rounding differs."""
    image = _image(64, 64)
    got = process_image(image, ImageProcessorConfig.from_dict({**QWEN35, "size": SMALL["size"]}))
    want = Qwen2VLImageProcessorPil(**{**QWEN35, "size": SMALL["size"]})(image, return_tensors="pt")
    torch.testing.assert_close(got.pixel_values, want["pixel_values"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("size", SIZES[:4])
def test_matches_the_default_torchvision_processor(size):
    pytest.importorskip("torchvision")
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    image = _image(*size, seed=1)
    got = process_image(image, ImageProcessorConfig.from_dict(SMALL))
    want = Qwen2VLImageProcessor(**SMALL)(image, return_tensors="pt")
    assert [list(got.grid)] == want["image_grid_thw"].tolist()
    torch.testing.assert_close(got.pixel_values, want["pixel_values"], atol=1e-6, rtol=0)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 20000),
    st.integers(1, 20000),
    st.sampled_from([28, 32, 10]),
    st.integers(1, 2000),
    st.integers(1, 4000),
)
def test_smart_resize_matches_transformers(height, width, factor, low, span):
    low, high = low * factor, (low + span) * factor
    try:
        want = hf_smart_resize(height, width, factor, min_pixels=low, max_pixels=high)
    except ValueError:
        with pytest.raises(ValueError, match="aspect ratio"):
            smart_resize(height, width, factor, low, high)
        return
    assert smart_resize(height, width, factor, low, high) == want


def test_config_fields():
    cfg = ImageProcessorConfig.from_dict(QWEN35)
    assert (cfg.min_pixels, cfg.max_pixels) == (65536, 16777216)
    assert (cfg.patch_size, cfg.temporal_patch_size, cfg.merge_size, cfg.factor) == (16, 2, 2, 32)
    assert cfg.image_mean == cfg.image_std == (0.5, 0.5, 0.5) and cfg.resample == 3
    # min_pixels / max_pixels override `size`, as transformers' constructor does
    cfg = ImageProcessorConfig.from_dict({**QWEN35, "min_pixels": 100, "max_pixels": 1000})
    assert (cfg.min_pixels, cfg.max_pixels) == (100, 1000)
    assert ImageProcessorConfig.from_dict({}) == ImageProcessorConfig()  # transformers' defaults
    for bad in ({"resample": 1}, {"image_std": [0.5, 0, 0.5]}, {"size": {"shortest_edge": 0}}):
        with pytest.raises(ValueError):
            ImageProcessorConfig.from_dict(bad)


def test_transparency_and_grey_as_transformers():
    cfg = ImageProcessorConfig.from_dict(SMALL)
    hf = Qwen2VLImageProcessorPil(**SMALL)
    for image in (_image(40, 30, 2, "RGBA"), _image(40, 30, 3, "L")):
        got = process_image(image, cfg)
        want = hf(image, return_tensors="pt")["pixel_values"]
        assert (got.pixel_values - want).abs().max().item() < _tolerance(SMALL)


def test_digest_names_the_resized_pixels():
    cfg = ImageProcessorConfig.from_dict(SMALL)
    image = _image(300, 200, 4)
    a = process_image(image, cfg)
    assert len(a.digest) == 32
    assert process_image(image.copy(), cfg).digest == a.digest
    again = Image.frombytes("RGB", image.size, image.tobytes())  # same pixels, new object
    assert process_image(again, cfg).digest == a.digest
    changed = image.copy()
    changed.putpixel((0, 0), tuple(255 - v for v in image.getpixel((0, 0))))
    assert process_image(changed, cfg).digest != a.digest
    other = ImageProcessorConfig.from_dict({**SMALL, "image_std": [0.5, 0.5, 0.5]})
    assert process_image(image, other).digest != a.digest  # other values for the same pixels
    bigger = ImageProcessorConfig.from_dict(
        {**SMALL, "size": {"shortest_edge": 400, "longest_edge": 8000}}
    )
    assert process_image(image, bigger).grid != a.grid
    assert process_image(image, bigger).digest != a.digest
