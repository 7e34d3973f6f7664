"""Released Qwen3.5 shapes (no weights) and deterministic random initialisation.

Shapes are from docs/reference qwen35.md §1. `tie_word_embeddings` is confirmed for 0.8B (tied)
and 9B / 27B / 35B-A3B (untied); 2B and 4B are assumed tied like the small Qwen3 models. The
vision tower (`vision_preset`) and the image processor (`IMAGE_PROCESSOR`) are those of the
released multimodal checkpoints' config.json and preprocessor_config.json. Random models exist
for benchmarks and memory sizing: their outputs are finite and vary with the input, nothing
more. Knows nothing about checkpoints on disk.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ninfer.models.config import Qwen35Config
from ninfer.models.quant import on_the_fly
from ninfer.models.quantize import convert_module, fp8_targets, quantize_
from ninfer.models.qwen3_5 import Qwen35ForCausalLM
from ninfer.models.vision import VisionConfig, VisionModel, add_vision_tower
from ninfer.vision.preprocess import ImageProcessorConfig

_COMMON = dict(
    vocab_size=248_320,
    head_dim=256,
    linear_num_key_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    rope_theta=10_000_000.0,
    partial_rotary_factor=0.25,
    max_position_embeddings=262_144,
    eos_token_ids=(248_046, 248_044),
)


def _preset(hidden, layers, heads, kv_heads, v_heads, tied, ffn=0, moe=None) -> Qwen35Config:
    experts, top_k, moe_inter, shared = moe or (0, 0, 0, 0)
    return Qwen35Config(
        hidden_size=hidden,
        num_hidden_layers=layers,
        layer_types=tuple(
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)
        ),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        linear_num_value_heads=v_heads,
        intermediate_size=ffn,
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared,
        tie_word_embeddings=tied,
        model_type="qwen3_5_moe_text" if moe else "qwen3_5_text",
        **_COMMON,
    )


PRESETS: dict[str, Qwen35Config] = {
    "0.8B": _preset(1024, 24, 8, 2, 16, tied=True, ffn=3584),
    "2B": _preset(2048, 24, 8, 2, 16, tied=True, ffn=6144),
    "4B": _preset(2560, 32, 16, 4, 32, tied=True, ffn=9216),
    "9B": _preset(4096, 32, 16, 4, 32, tied=False, ffn=12288),
    "27B": _preset(5120, 64, 24, 4, 48, tied=False, ffn=17408),
    "35B-A3B": _preset(2048, 40, 16, 2, 32, tied=False, moe=(256, 8, 512, 512)),
}


def vision_preset(out_hidden_size: int) -> VisionConfig:
    """The released checkpoints' vision tower, emitting `out_hidden_size` (the text model's
    hidden size) per merged token; the multimodal token ids are Qwen3.5's."""
    return VisionConfig(
        depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, patch_size=16,
        temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=out_hidden_size,
        num_position_embeddings=2304, hidden_act="gelu_pytorch_tanh",
    )  # fmt: skip


# the released preprocessor_config.json: size {shortest_edge, longest_edge} are pixel counts
IMAGE_PROCESSOR = ImageProcessorConfig(
    patch_size=16, temporal_patch_size=2, merge_size=2, min_pixels=65_536,
    max_pixels=16_777_216, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5),
)  # fmt: skip


@torch.no_grad()
def init_random_(model: Qwen35ForCausalLM, seed: int, std: float = 0.02) -> None:
    """Overwrites every parameter in place, deterministically for a given seed and device type.

    Matrices and embeddings ~ N(0, std); zero-centred norm weights ~ N(0, 0.1) and the gated
    norm ~ 1 + N(0, 0.1); conv taps ~ N(0, 1/K); GDN decay as in Mamba-2 (A in [1, 16], dt in
    [1e-3, 1e-1] through dt_bias = softplus^-1(dt)), so the recurrent state keeps a memory.
    Parameter i (in `named_parameters` order) draws from its own generator, seeded from `seed`
    and i, so parameters can be drawn one at a time (`_random_fp8_`).
    """
    for i, (name, p) in enumerate(model.named_parameters()):
        _init_param(name, p, _generator(p.device, seed, i), std)


def _generator(device: torch.device, seed: int, i: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + i)


def _init_param(name: str, p: torch.Tensor, gen: torch.Generator, std: float) -> None:
    if name.endswith("linear_attn.norm.weight"):
        p.normal_(1.0, 0.1, generator=gen)
    elif name.endswith("norm.weight"):
        p.normal_(0.0, 0.1, generator=gen)
    elif name.endswith("conv1d.weight"):
        p.normal_(0.0, p.shape[-1] ** -0.5, generator=gen)
    elif name.endswith("A_log"):
        p.uniform_(1.0, 16.0, generator=gen).log_()
    elif name.endswith("dt_bias"):
        dt = torch.empty(p.shape, device=p.device).uniform_(
            math.log(1e-3), math.log(1e-1), generator=gen
        )
        dt = dt.exp_()
        p.copy_(dt + torch.log(-torch.expm1(-dt)))
    else:
        p.normal_(0.0, std, generator=gen)


@torch.no_grad()
def _random_fp8_(
    model: Qwen35ForCausalLM, scheme, device: torch.device | str, seed: int, std: float = 0.02
) -> None:
    """`init_random_` on a meta-device model, one parameter at a time, each module `scheme`
    converts made FP8 as soon as its parameters are drawn (a linear at its weight, a layer's
    experts at their second tensor): the same values as drawing the whole dense model and then
    quantising it, at the memory of the FP8 model plus one module."""
    model.tie_weights()  # the tied head is the embedding's parameter: listed once, as drawn
    linears, experts = fp8_targets(model, scheme)
    pending = {*linears, *experts}
    for i, (name, p) in enumerate(list(model.named_parameters())):
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        real = torch.empty(p.shape, dtype=p.dtype, device=device)
        _init_param(name, real, _generator(real.device, seed, i), std)
        module._parameters[attr] = nn.Parameter(real, requires_grad=False)
        if module_name in pending and not any(q.is_meta for q in module.parameters()):
            convert_module(model, module_name, scheme)
            pending.discard(module_name)
    model.tie_weights()


def build_random_model(
    config: Qwen35Config,
    dtype: torch.dtype,
    device: str | torch.device,
    seed: int = 0,
    quantization: str | None = None,
    mtp: bool = False,
) -> Qwen35ForCausalLM:
    """A randomly initialised model allocated directly on `device` (nothing on the host);
    `quantization` "fp8" quantises it as `LLM(quantization="fp8")` quantises a checkpoint
    (`ninfer.models.quant.on_the_fly`), module by module as it is drawn (`_random_fp8_`: the
    dense model is never held whole); `mtp`: with a random MTP draft head (the target's
    weights are the same either way)."""
    scheme = on_the_fly(quantization)  # ValueError naming `quantization` before any work
    model = Qwen35ForCausalLM(config, dtype=dtype, device="meta")
    if mtp:
        from ninfer.models.mtp import add_mtp_head

        add_mtp_head(model, dtype, "meta")
    if scheme is None:
        model.to_empty(device=device)
        model.tie_weights()
        init_random_(model, seed)
    else:
        _random_fp8_(model, scheme, device, seed)
    model.init_buffers()
    for p in model.parameters():
        p.requires_grad_(False)
    if scheme is not None:
        quantize_(model, scheme)  # the scheme recorded; every target is FP8 already
    return model.eval()


@torch.no_grad()
def init_random_tower_(tower: VisionModel, seed: int) -> None:
    """Overwrites every parameter of the tower in place, deterministically for a given seed and
    device type: LayerNorm weights ~ 1 + N(0, 0.1), biases ~ N(0, 0.02), the position grid ~
    N(0, 0.02), every other matrix ~ N(0, 1 / fan_in) (each layer keeps its input's scale, so
    27 blocks stay finite in bf16)."""
    for i, (name, p) in enumerate(tower.named_parameters()):
        gen = torch.Generator(device=p.device).manual_seed(seed * 1_000_003 + i)
        if "norm" in name and name.endswith("weight"):
            p.normal_(1.0, 0.1, generator=gen)
        elif p.dim() == 1 or name.startswith("pos_embed"):
            p.normal_(0.0, 0.02, generator=gen)
        else:
            p.normal_(0.0, p[0].numel() ** -0.5, generator=gen)


def build_random_vl_model(
    config: Qwen35Config,
    vision: VisionConfig,
    dtype: torch.dtype,
    device: str | torch.device,
    seed: int = 0,
) -> Qwen35ForCausalLM:
    """`build_random_model` with a random vision tower of shape `vision` as
    `model.model.visual` (in `dtype`; `init_random_tower_` with the same seed)."""
    model = build_random_model(config, dtype, device, seed)
    tower = add_vision_tower(model, vision, dtype, "meta")
    tower.to_empty(device=device)
    tower.init_buffers()
    init_random_tower_(tower, seed)
    for p in tower.parameters():
        p.requires_grad_(False)
    return model.eval()
