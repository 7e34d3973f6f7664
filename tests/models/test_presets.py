"""Released shapes (text models, the vision tower, the image processor) and the deterministic
random initialisation."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from PIL import Image

from ninfer.models.presets import (
    IMAGE_PROCESSOR,
    PRESETS,
    build_random_model,
    build_random_vl_model,
    vision_preset,
)
from ninfer.models.qwen3_5 import Qwen35ForCausalLM
from ninfer.models.vision import VisionModel
from ninfer.vision.preprocess import process_image
from tests.models.util import Row, make_batch, make_cache, narrow

# text-model parameters (the released names also count the vision tower)
BILLIONS = {"0.8B": 0.75, "2B": 1.88, "4B": 4.21, "9B": 8.95, "27B": 26.9, "35B-A3B": 34.66}


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_shapes(name):
    cfg = PRESETS[name]
    assert (cfg.vocab_size, cfg.head_dim, cfg.linear_key_head_dim) == (248320, 256, 128)
    assert cfg.eos_token_ids == (248046, 248044) and cfg.rope_theta == 1e7
    assert cfg.full_layer_ids == tuple(range(3, cfg.num_hidden_layers, 4))
    model = Qwen35ForCausalLM(cfg, device="meta")
    total = sum(p.numel() for p in model.parameters()) / 1e9
    assert total == pytest.approx(BILLIONS[name], abs=0.01)
    assert PRESETS["35B-A3B"].is_moe


def test_random_model_is_deterministic_and_fully_random():
    cfg = narrow(PRESETS["0.8B"])
    a = build_random_model(cfg, torch.float32, "cpu", seed=3)
    b = build_random_model(cfg, torch.float32, "cpu", seed=3)
    c = build_random_model(cfg, torch.float32, "cpu", seed=4)
    for (name, pa), pb, pc in zip(
        a.named_parameters(), b.parameters(), c.parameters(), strict=True
    ):
        assert torch.equal(pa, pb), name
        assert not torch.equal(pa, pc), name
        assert pa.std() > 0 and not pa.requires_grad, name
    assert a.lm_head.weight is a.model.embed_tokens.weight


@pytest.mark.parametrize("name", ["27B", "35B-A3B"])
def test_random_model_bf16_outputs_are_finite_and_vary(ref_ops, name):
    cfg = narrow(PRESETS[name])
    model = build_random_model(cfg, torch.bfloat16, "cpu", seed=0)
    cache = make_cache(cfg, num_pages=2, num_slots=2, dtype=torch.bfloat16)
    prompt = list(range(10, 40))
    rows = [Row(prompt, 0, 0, [0]), Row(prompt[:-1] + [7], 0, 1, [1])]
    logits = model(make_batch(rows, logits_indices=[0, 29, 59]), cache, ref_ops)
    assert logits.isfinite().all()
    assert logits.std(dim=-1).min() > 0.1  # not flat
    assert (logits[1] - logits[2]).abs().max() > 1e-2  # the last token matters
    assert not torch.equal(logits[0], logits[1])


def test_vision_preset_is_the_released_tower():
    """Its parameters are transformers' `Qwen3_5VisionModel`'s at the 9B's width; the processor
    tiles 32-pixel blocks (a 1024 x 1024 image: 1024 tokens)."""
    from transformers import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    cfg = vision_preset(PRESETS["9B"].hidden_size)
    fields = ("depth", "hidden_size", "num_heads", "intermediate_size", "patch_size")
    fields += ("temporal_patch_size", "spatial_merge_size", "num_position_embeddings")
    with torch.device("meta"):
        ours = VisionModel(cfg)
        hf = Qwen3_5VisionModel(
            Qwen3_5VisionConfig(**{k: getattr(cfg, k) for k in fields}, out_hidden_size=4096)
        )
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    assert (cfg.image_token_id, cfg.vision_start_token_id) == (248056, 248053)
    assert IMAGE_PROCESSOR.factor == cfg.patch_size * cfg.spatial_merge_size == 32
    assert process_image(Image.new("RGB", (1024, 1024)), IMAGE_PROCESSOR).num_tokens == 1024


def test_random_tower_is_deterministic_and_finite_at_full_depth():
    """27 blocks at a narrow width in bf16: finite, not flat, varying with the image; LayerNorm
    weights near 1; the same seed gives the same tower."""
    text = narrow(PRESETS["9B"], layers=4)
    tower = replace(vision_preset(text.hidden_size), hidden_size=64, num_heads=4,
                    intermediate_size=128)  # fmt: skip
    a = build_random_vl_model(text, tower, torch.bfloat16, "cpu", seed=2).model.visual
    b = build_random_vl_model(text, tower, torch.bfloat16, "cpu", seed=2).model.visual
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb) and not pa.requires_grad, name
    assert a.blocks[26].norm1.weight.float().mean().item() == pytest.approx(1.0, abs=0.05)
    g = torch.Generator().manual_seed(0)
    pixels = torch.rand(2 * 64, tower.patch_dim, generator=g) * 2 - 1
    out = a(pixels, [(1, 8, 8), (1, 8, 8)])
    assert out.shape == (32, text.hidden_size) and out.isfinite().all()
    assert out.float().std() > 0.1 and not torch.equal(out[:16], out[16:])
