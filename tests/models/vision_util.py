"""Tiny random transformers `Qwen3_5ForConditionalGeneration` checkpoints (text model, vision
tower, `preprocessor_config.json`) and a model-level driver that runs ninfer's model over a
prompt with images: preprocess, expand the pads, encode, 3-D positions, one prefill pass, then
decode rows at index + rope_delta. No engine, no scheduler (fp32, CPU).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

from ninfer.forward import Embeds
from ninfer.models.qwen3_5 import Qwen35ForCausalLM
from ninfer.models.weights import load_model
from ninfer.vision.positions import expand_image_pads, mrope_positions
from ninfer.vision.preprocess import ImageProcessorConfig, process_image
from tests.models.hf_util import _torch_kernels
from tests.models.util import Row, make_batch, make_cache

IMAGE, VIDEO, START, END = 100, 101, 102, 103  # the tiny vocabulary's multimodal ids
TEXT_VOCAB = 100  # ordinary tokens are drawn below IMAGE
VISION = dict(
    depth=2, hidden_size=32, num_heads=2, intermediate_size=48, patch_size=4,
    temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
)  # fmt: skip
# name -> text-config kwargs: an explicit mrope_section over 8 frequencies (all three axes
# interleaved within the rotary dims), and the checkpoints' default [11, 11, 10] (absent) over 16
TEXT: dict[str, dict] = {
    "section-3-3-2": dict(
        vocab_size=120, hidden_size=48, intermediate_size=72, num_hidden_layers=4,
        full_attention_interval=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=8, rope_parameters={
            "rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5,
            "mrope_section": [3, 3, 2], "mrope_interleaved": True,
        },
    ),
    "section-default": dict(
        vocab_size=120, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        full_attention_interval=2, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, rope_parameters={
            "rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25,
        },
    ),
}  # fmt: skip
PREPROCESSOR = {
    "size": {"shortest_edge": 256, "longest_edge": 40 * 40},
    "patch_size": 4, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 3,
    "rescale_factor": 1 / 255, "image_processor_type": "Qwen2VLImageProcessorFast",
}  # fmt: skip


def hf_config(name: str) -> Qwen3_5Config:
    text = {**TEXT[name], "tie_word_embeddings": False, "rms_norm_eps": 1e-6}
    vision = {**VISION, "out_hidden_size": text["hidden_size"]}
    return Qwen3_5Config(
        text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=VIDEO,
        vision_start_token_id=START, vision_end_token_id=END, tie_word_embeddings=False,
        attn_implementation="eager",
    )  # fmt: skip


@torch.no_grad()
def random_hf_vlm(name: str, seed: int = 0) -> Qwen3_5ForConditionalGeneration:
    """Every parameter random (as `hf_util.random_hf_model`; LayerNorm weights near 1)."""
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(hf_config(name)).eval()
    for n, p in model.named_parameters():
        if p.dim() == 1:
            layer_norm = "visual" in n and "norm" in n and n.endswith("weight")
            p.copy_(torch.randn_like(p) * (0.1 if layer_norm else 0.3) + layer_norm)
        elif n.endswith("embed_tokens.weight") or n.endswith("pos_embed.weight"):
            p.copy_(torch.randn_like(p))
        else:
            p.copy_(torch.randn_like(p) * p[0].numel() ** -0.5)
    model.lm_head.weight.mul_(3.0)
    return model


def save_checkpoint(hf, path: Path) -> Path:
    hf.save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return path


class Pair(NamedTuple):
    """A transformers model and ninfer's, loaded from the checkpoint it saved at `path`."""

    hf: Qwen3_5ForConditionalGeneration
    model: Qwen35ForCausalLM  # with its tower
    processor: ImageProcessorConfig
    path: Path


def load_pair(name: str, path: Path, seed: int = 0) -> Pair:
    hf = random_hf_vlm(name, seed)
    save_checkpoint(hf, path)
    model = load_model(path, dtype=torch.float32, vision=True)
    return Pair(hf, model, ImageProcessorConfig.from_file(path), path)


class Prompt:
    """A prompt with one pad token per image, expanded and encoded for ninfer's model."""

    def __init__(self, model, pcfg: ImageProcessorConfig, ids: list[int], images) -> None:
        merge = model.model.visual.config.spatial_merge_size
        done = [process_image(im, pcfg) for im in images]
        self.grids = [p.grid for p in done]
        self.pixels = torch.cat([p.pixel_values for p in done]) if done else None
        self.ids, self.spans = expand_image_pads(ids, IMAGE, self.grids, merge)
        self.positions, self.delta = mrope_positions(len(self.ids), self.spans, merge)
        rows = [torch.arange(s.start, s.end(merge)) for s in self.spans]
        self.rows = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)


@torch.no_grad()
def ninfer_run(model, prompt: Prompt, ops, steps: int) -> tuple[torch.Tensor, list[int]]:
    """(prompt logits [n, vocab], `steps` greedy tokens): one prefill pass with the image
    embeddings and 3-D positions, then one decode row per token at index + rope_delta (on the
    model's device)."""
    n, dev = len(prompt.ids), model.lm_head.weight.device
    cache = make_cache(model.config, -(-(n + steps) // 64), 1, model.lm_head.weight.dtype, dev)
    pages = list(range(cache.kv[0].shape[0]))
    batch = make_batch([Row(prompt.ids, 0, 0, pages)], dev)
    batch.mrope_positions = prompt.positions.to(dev)
    if prompt.grids:
        embeds = model.model.visual(prompt.pixels.to(dev), prompt.grids)
        batch.embeds = Embeds(prompt.rows.to(dev), embeds)
    logits = model(batch, cache, ops)
    tokens = [int(logits[-1].argmax())]
    for i in range(n, n + steps - 1):
        step = make_batch([Row([tokens[-1]], i, 0, pages)], dev)
        step.positions += prompt.delta
        tokens.append(int(model(step, cache, ops)[-1].argmax()))
    return logits, tokens


def hf_inputs(prompt: Prompt) -> dict:
    ids = torch.tensor([prompt.ids])
    inputs = {"input_ids": ids, "mm_token_type_ids": (ids == IMAGE).int()}
    if prompt.grids:
        inputs |= {"pixel_values": prompt.pixels, "image_grid_thw": torch.tensor(prompt.grids)}
    return inputs


@torch.no_grad()
def hf_run(hf, prompt: Prompt, steps: int) -> tuple[torch.Tensor, list[int]]:
    """transformers' (prompt logits, `steps` greedy tokens by `generate`) on the same pixels."""
    with _torch_kernels(hf.model.language_model):
        logits = hf(**hf_inputs(prompt)).logits[0].float()
        out = hf.generate(**hf_inputs(prompt), max_new_tokens=steps, do_sample=False)
    return logits, out[0, len(prompt.ids) :].tolist()
