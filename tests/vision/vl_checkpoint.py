"""A tiny random Qwen3.5 checkpoint folder with a vision tower, a processor config and a tiny
BPE tokenizer whose vision tokens are the checkpoint's (fp32, CPU), and transformers' greedy
tokens over the same expanded prompt and pixels."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from fixtures.tiny_tokenizer import build_tiny_bpe
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

from tests.models.hf_util import _torch_kernels
from tests.models.vision_util import PREPROCESSOR, TEXT, VISION

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def _tokenizer(folder: Path) -> dict[str, int]:
    build_tiny_bpe(folder)
    hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    hf.save(str(folder / "tokenizer.json"))
    return {t: hf.token_to_id(t) for t in VISION_TOKENS} | {"size": hf.get_vocab_size()}


@torch.no_grad()
def build_vl_checkpoint(
    folder: Path, seed: int = 0, name: str = "section-3-3-2"
) -> Qwen3_5ForConditionalGeneration:
    """Writes the checkpoint (text config `TEXT[name]`) into `folder`; returns transformers'
    model of it."""
    ids = _tokenizer(folder)
    text = {**TEXT[name], "vocab_size": ids["size"], "tie_word_embeddings": False}
    config = Qwen3_5Config(
        text_config=text, vision_config={**VISION, "out_hidden_size": text["hidden_size"]},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(seed)
    hf = Qwen3_5ForConditionalGeneration(config).eval()
    for n, p in hf.named_parameters():
        if p.dim() == 1:
            ln = "visual" in n and "norm" in n and n.endswith("weight")
            p.copy_(torch.randn_like(p) * (0.1 if ln else 0.3) + ln)
        elif n.endswith("embed_tokens.weight") or n.endswith("pos_embed.weight"):
            p.copy_(torch.randn_like(p))
        else:
            p.copy_(torch.randn_like(p) * p[0].numel() ** -0.5)
    hf.lm_head.weight.mul_(3.0)
    hf.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return hf


@torch.no_grad()
def hf_greedy(hf, ids: list[int], images, steps: int) -> list[int]:
    """transformers' `generate` over the expanded prompt `ids` and the record's pixels."""
    input_ids = torch.tensor([ids])
    pad = hf.config.image_token_id
    inputs = {"input_ids": input_ids, "mm_token_type_ids": (input_ids == pad).int()}
    if images is not None:
        inputs["pixel_values"] = torch.cat([p.pixel_values for p in images.images])
        inputs["image_grid_thw"] = torch.tensor([p.grid for p in images.images])
    with _torch_kernels(hf.model.language_model):
        out = hf.generate(**inputs, max_new_tokens=steps, do_sample=False)
    return out[0, len(ids) :].tolist()


def add_random_mtp_head(folder: Path, seed: int = 3) -> None:
    """Adds `mtp.safetensors` to the checkpoint in `folder`: a random MTP head of its text
    model's shape (the releases ship one; transformers writes none)."""
    from safetensors.torch import save_file

    from ninfer.models.mtp import add_mtp_head
    from ninfer.models.weights import load_model

    head = add_mtp_head(load_model(folder, torch.float32, "cpu"), torch.float32, "cpu")
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for key, t in head.state_dict().items():
        scale = t.shape[-1] ** -0.5 if t.dim() > 1 else 0.3
        tensors[f"mtp.{key}"] = (torch.randn(t.shape, generator=gen) * scale).contiguous()
    save_file(tensors, str(folder / "mtp.safetensors"))
