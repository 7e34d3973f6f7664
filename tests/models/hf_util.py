"""Tiny random transformers Qwen3.5 models and their ninfer twins, for parity tests (fp32, CPU).

Every parameter is randomised, so a 1 + w versus w mix-up in a norm, or a wrong decay
parametrisation, shows up in the logits. Matrices are N(0, 1/fan_in) (gain ~1 per layer, so fp32
rounding is not amplified through depth: with a fixed 0.3 std, a 5-layer model turns 1e-7
rounding differences between chunkings into 1e-4 logit differences); vectors (norm weights,
A_log, dt_bias) are N(0, 0.3^2), the embedding N(0, 1); the head is scaled to logits of ~10.
"""

from __future__ import annotations

import contextlib
import sys

import torch
from transformers import (
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
)

from ninfer.models.config import Qwen35Config
from ninfer.models.qwen3_5 import Qwen35ForCausalLM

_ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}

# name -> (moe?, text-config kwargs); odd sizes, Hv != Hk, tied and untied, dense and MoE.
CONFIGS: dict[str, tuple[bool, dict]] = {
    "dense-untied-odd": (False, dict(
        vocab_size=101, hidden_size=48, intermediate_size=72, num_hidden_layers=5,
        full_attention_interval=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=8, tie_word_embeddings=False,
    )),
    "dense-tied": (False, dict(
        vocab_size=257, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=16,
        linear_conv_kernel_dim=3, tie_word_embeddings=True,
        rope_parameters={**_ROPE, "partial_rotary_factor": 0.5},
    )),
    "moe-untied": (True, dict(
        vocab_size=97, hidden_size=40, num_hidden_layers=4, full_attention_interval=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=24, linear_num_key_heads=1,
        linear_num_value_heads=3, linear_key_head_dim=8, linear_value_head_dim=12,
        num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
        shared_expert_intermediate_size=20, tie_word_embeddings=False,
    )),
    "moe-tied-full-first": (True, dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=3,
        layer_types=["full_attention", "linear_attention", "linear_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        num_experts=4, num_experts_per_tok=3, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, tie_word_embeddings=True,
    )),
}  # fmt: skip


def hf_config(name: str) -> Qwen3_5TextConfig | Qwen3_5MoeTextConfig:
    moe, kwargs = CONFIGS[name]
    kwargs = {"rope_parameters": _ROPE, "rms_norm_eps": 1e-6, **kwargs}
    cls = Qwen3_5MoeTextConfig if moe else Qwen3_5TextConfig
    return cls(**kwargs, attn_implementation="eager")


@torch.no_grad()
def random_hf_model(name: str, seed: int = 0) -> Qwen3_5ForCausalLM | Qwen3_5MoeForCausalLM:
    """A transformers model with every parameter randomised (see the module doc), fp32, eval."""
    cfg = hf_config(name)
    torch.manual_seed(seed)
    model = (Qwen3_5MoeForCausalLM if CONFIGS[name][0] else Qwen3_5ForCausalLM)(cfg).eval()
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.copy_(torch.randn_like(p) * 0.3)
        elif name.endswith("embed_tokens.weight"):
            p.copy_(torch.randn_like(p))
        else:
            p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5)
    if cfg.tie_word_embeddings:  # the N(0, 1) embedding is the head: shrink 1 + w of the norm
        model.model.norm.weight.copy_(torch.randn_like(model.model.norm.weight) * 0.1 - 0.6)
    else:
        model.lm_head.weight.mul_(3.0)
    return model


def ninfer_twin(hf_model) -> Qwen35ForCausalLM:
    """The ninfer model with the same config and weights (strict name match)."""
    model = Qwen35ForCausalLM(Qwen35Config.from_hf_dict(hf_model.config.to_dict()))
    model.load_state_dict(hf_model.state_dict(), strict=True)
    return model.eval()


@contextlib.contextmanager
def _torch_kernels(hf_model):
    """transformers' modeling module with its plain-PyTorch kernels: where fla is installed (the
    GPU machine) its kernel decorators bind fla's Triton functions, which take no CPU tensors.
    Each decorated `torch_*` function keeps the torch one as `__wrapped__`."""
    module = sys.modules[type(hf_model).__module__]
    saved = {
        k: v
        for k, v in vars(module).items()
        if k.startswith("torch_") and callable(v) and hasattr(v, "__wrapped__")
    }
    try:
        for k, v in saved.items():
            setattr(module, k, v.__wrapped__)
        yield
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


@torch.no_grad()
def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    """fp32 logits [len(ids), vocab] of one sequence, one pass, by transformers' torch path."""
    with _torch_kernels(hf_model):
        return hf_model(torch.tensor([ids])).logits[0].float()
