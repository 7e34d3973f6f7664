"""ninfer's Qwen3.5 with images equals transformers' Qwen3_5ForConditionalGeneration (fp32, CPU):
a tiny random checkpoint saved with a processor config, loaded by `load_model(vision=True)`;
prompts with one and with several images of different sizes, text between and after them;
logits of the whole prompt within fp32 tolerance, greedy tokens identical (decode rows at index
+ rope_delta, against `generate`). The pixels are ninfer's preprocessing of each image, fed to
both (the processors are compared in tests/vision)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from ninfer.models.weights import load_model
from tests.models.util import Row, make_batch, make_cache
from tests.models.vision_util import (
    END,
    IMAGE,
    START,
    TEXT,
    TEXT_VOCAB,
    Prompt,
    hf_run,
    load_pair,
    ninfer_run,
)

# fp32 rounding of different reduction orders over ~5 layers, on logits of magnitude ~10
TOL = 2e-4
STEPS = 4


@pytest.fixture(scope="module", params=list(TEXT))
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return load_pair(request.param, path, seed=len(request.param))


def _image(width: int, height: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _text(n: int, seed: int) -> list[int]:
    return torch.randint(
        0, TEXT_VOCAB, (n,), generator=torch.Generator().manual_seed(seed)
    ).tolist()


def _placeholder() -> list[int]:
    return [START, IMAGE, END]


def _check(pair, ids: list[int], images: list[Image.Image], ref_ops) -> Prompt:
    hf, model, pcfg, _ = pair
    prompt = Prompt(model, pcfg, ids, images)
    got, got_tokens = ninfer_run(model, prompt, ref_ops, STEPS)
    want, want_tokens = hf_run(hf, prompt, STEPS)
    assert want.abs().max() > 1.0  # not degenerate
    assert (got - want).abs().max().item() < TOL
    assert got_tokens == want_tokens
    return prompt


def test_one_image_then_text(pair, ref_ops):
    ids = _text(5, 0) + _placeholder() + _text(9, 1)
    prompt = _check(pair, ids, [_image(50, 30, 0)], ref_ops)
    assert len(prompt.spans) == 1 and prompt.delta < 0  # the grid is wider than tall: 3 < 4


def test_several_images_of_different_sizes(pair, ref_ops):
    """A tiny image (scaled up to min_pixels), a large one (scaled down to max_pixels), an odd
    aspect ratio; text between and after; two images back to back around one text token."""
    ids = _text(3, 2) + _placeholder() + _text(4, 3) + _placeholder() + [7] + _placeholder()
    ids += _text(6, 4)
    images = [_image(5, 9, 1), _image(640, 480, 2), _image(23, 97, 3)]
    prompt = _check(pair, ids, images, ref_ops)
    grids = {g[1:] for g in prompt.grids}
    assert len(grids) == 3


def test_image_last_in_the_prompt(pair, ref_ops):
    """No text after the image: the first decoded token continues at the span's start plus
    its largest merged side."""
    ids = _text(4, 5) + [START, IMAGE]
    _check(pair, ids, [_image(37, 64, 4)], ref_ops)


def test_text_only_prompt_same_with_or_without_3d_positions(pair, ref_ops):
    """A prompt without images: the 3-D path (t = h = w) gives the 1-D path's logits bit for
    bit, and both transformers'."""
    hf, model, pcfg, _ = pair
    ids = _text(21, 6)
    prompt = Prompt(model, pcfg, ids, [])
    got_3d, tokens = ninfer_run(model, prompt, ref_ops, STEPS)
    cache = make_cache(model.config, num_pages=1, num_slots=1)
    got_1d = model(make_batch([Row(ids, 0, 0, [0])]), cache, ref_ops)
    assert torch.equal(got_3d, got_1d)
    want, want_tokens = hf_run(hf, prompt, STEPS)
    assert (got_1d - want).abs().max().item() < TOL and tokens == want_tokens


def test_text_model_loads_the_same_without_the_tower(pair):
    """`vision=False` (the default) skips model.visual.*: the text weights are the same."""
    model = pair.model
    text_only = load_model(pair.path, dtype=torch.float32)
    assert text_only.model.visual is None
    tower = {n for n, _ in model.named_parameters() if n.startswith("model.visual.")}
    assert tower and "model.visual.patch_embed.proj.weight" in tower
    text = dict(text_only.named_parameters())
    assert set(text) == {n for n, _ in model.named_parameters()} - tower
    assert all(torch.equal(p, text[n]) for n, p in model.named_parameters() if n in text)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_with_cuda_ops(pair, ref_ops):
    """The same prompt on CUDA (`CudaOps`, fp32: the ops that take no fp32 run the reference
    on the GPU) as on the CPU: the tower, the embeddings and the 3-D positions on the device."""
    for module in ("flashinfer", "fla", "triton"):
        pytest.importorskip(module)
    from ninfer.ops.cuda import CudaOps

    _, model, pcfg, path = pair
    ids = _text(3, 2) + _placeholder() + _text(4, 3) + _placeholder() + _text(5, 4)
    prompt = Prompt(model, pcfg, ids, [_image(64, 48, 5), _image(20, 90, 6)])
    want, want_tokens = ninfer_run(model, prompt, ref_ops, STEPS)
    gpu = load_model(path, dtype=torch.float32, device="cuda", vision=True)
    ops = CudaOps("cuda")
    ops.configure(gpu.config.head_dims, "float32", "float32")
    got, tokens = ninfer_run(gpu, prompt, ops, STEPS)
    assert (got.cpu() - want).abs().max().item() < 1e-3
    assert tokens == want_tokens
