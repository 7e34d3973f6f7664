"""Turning a model's linear layers and experts into FP8, as a `QuantScheme` says.

`to_fp8_layout(model, scheme)` (before loading an FP8 checkpoint, on the meta device) and
`quantize_(model, scheme)` (a built bf16 model, on-the-fly quantisation) convert the same
modules: each nn.Linear the scheme converts becomes an `Fp8Linear`, each MoE block's experts
become FP8 when the scheme converts their per-expert projections. Never converted, whatever the
scheme says: the MoE router (`mlp.gate`) and `shared_expert_gate`, which the routing ops read
as plain weights (the releases keep them bf16), an LM head tied to the embedding, and the
vision tower (`model.visual`, bf16 in the FP8 releases too).
`dequantize_` turns an FP8 model back into the dense model it stands for (the tests' oracle);
`weight_bytes()` counts what a decode step reads. Knows nothing about files.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ninfer.models.fp8 import Fp8Linear
from ninfer.models.quant import QuantScheme
from ninfer.models.qwen3_5 import Experts, Qwen35ForCausalLM, SparseMoE

_ROUTERS = ("gate", "shared_expert_gate")
_TOWER = "model.visual."


def fp8_targets(model: Qwen35ForCausalLM, scheme: QuantScheme) -> tuple[list[str], list[str]]:
    """(nn.Linear module names, Experts module names) that `scheme` makes FP8."""
    routers = {
        f"{name}.{r}" for name, m in model.named_modules() if isinstance(m, SparseMoE)
        for r in _ROUTERS
    }  # fmt: skip
    tied = model.config.tie_word_embeddings
    linears, experts = [], []
    for name, m in model.named_modules():
        kept = name in routers or (tied and name == "lm_head") or name.startswith(_TOWER)
        if isinstance(m, nn.Linear) and not kept:
            if scheme.converts(name):
                linears.append(name)
        elif isinstance(m, Experts):
            parts = [f"{name}.0.{p}_proj" for p in ("gate", "up", "down")]
            if all(scheme.converts(p) for p in parts):
                experts.append(name)
    return linears, experts


def _convert(model: Qwen35ForCausalLM, scheme: QuantScheme, quantize: bool) -> None:
    model.quant_scheme = scheme
    linears, experts = fp8_targets(model, scheme)
    for name in [*linears, *experts]:
        convert_module(model, name, scheme, quantize)


def convert_module(
    model: Qwen35ForCausalLM, name: str, scheme: QuantScheme, quantize: bool = True
) -> None:
    """Makes module `name` (one of `fp8_targets`) FP8 in `scheme`'s blocks: quantised from its
    values (`quantize`), else empty on the meta device (to be loaded). Experts already FP8 stay
    as they are (the loader and the random presets convert module by module as they fill)."""
    module = model.get_submodule(name)
    if isinstance(module, Experts):
        if not module.blocks:
            module.to_fp8(scheme.block_for, quantize)
        return
    parent, _, attr = name.rpartition(".")
    n_out, n_in = module.weight.shape
    block = scheme.block_for(n_in)
    if quantize:
        new = Fp8Linear.quantized(module, block)
    else:
        new = Fp8Linear(n_in, n_out, block, device="meta")
    setattr(model.get_submodule(parent), attr, new)


def to_fp8_layout(model: Qwen35ForCausalLM, scheme: QuantScheme) -> None:
    """Replaces, on a meta-device model, the modules `scheme` converts by empty FP8 ones (the
    parameters a checkpoint in that scheme holds)."""
    _convert(model, scheme, quantize=False)


@torch.no_grad()
def quantize_(model: Qwen35ForCausalLM, scheme: QuantScheme) -> Qwen35ForCausalLM:
    """Quantises, in place, the modules `scheme` converts (their dense weights are freed);
    returns `model`. Call before `fuse_projections`."""
    _convert(model, scheme, quantize=True)
    return model


@torch.no_grad()
def quantize_draft_(model: Qwen35ForCausalLM, scheme: QuantScheme) -> list[str]:
    """Quantises, in place, the MTP draft head's modules `scheme` converts (those under
    `mtp.`: with the official not-convert list, the layer's projections and experts, not
    `mtp.fc`, its norms or routers); the target's modules and `model.quant_scheme` stay as
    they are. Modules already FP8 are left alone. Returns the names converted. Call before
    `fuse_projections`."""
    linears, experts = fp8_targets(model, scheme)
    names = [n for n in (*linears, *experts) if n.startswith("mtp.")]
    for name in names:
        convert_module(model, name, scheme, quantize=True)
    return names


@torch.no_grad()
def dequantize_(model: Qwen35ForCausalLM, dtype: torch.dtype) -> Qwen35ForCausalLM:
    """Replaces, in place, every FP8 module by a dense one in `dtype` whose weights are the FP8
    values times their scales (what the reference op multiplies by); returns `model`. The model
    an FP8 checkpoint stands for, to compare against."""
    for name, m in list(model.named_modules()):
        if isinstance(m, Fp8Linear):
            parent, _, attr = name.rpartition(".")
            dense = nn.Linear(m.in_features, m.out_features, bias=False, device="meta")
            dense.weight = nn.Parameter(m.packed.dequantize(dtype), requires_grad=False)
            setattr(model.get_submodule(parent), attr, dense)
        elif isinstance(m, Experts) and m.blocks:
            for attr, w in zip(Experts.NAMES, m.weights(), strict=True):
                setattr(m, attr, nn.Parameter(w.dequantize(dtype), requires_grad=False))
                delattr(m, f"{attr}_scale_inv")
            m.blocks = {}
    model.quant_scheme = None
    return model


@torch.no_grad()
def dense_state_dict(model: Qwen35ForCausalLM, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`model.state_dict()` with every FP8 weight dequantised to `dtype` and no scales: the
    dense model's, for transformers (the model itself is unchanged)."""
    state = model.state_dict()
    for name, m in model.named_modules():
        if isinstance(m, Fp8Linear):
            state[f"{name}.weight"] = m.packed.dequantize(dtype)
            del state[f"{name}.weight_scale_inv"]
        elif isinstance(m, Experts) and m.blocks:
            for attr, w in zip(Experts.NAMES, m.weights(), strict=True):
                state[f"{name}.{attr}"] = w.dequantize(dtype)
                del state[f"{name}.{attr}_scale_inv"]
    return state


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """Bytes of the model's weights: `total`, and what one decode token reads (`per_token`:
    every weight but the embedding, which is looked up, and the unused experts: MoE blocks
    read top_k of E); `per_token_bf16`: the same with every weight in bf16 and no scales."""

    total: int
    per_token: int
    per_token_bf16: int


def weight_bytes(model: Qwen35ForCausalLM) -> WeightBytes:
    """The bytes of `model`'s parameters (tied weights once), and what a decode token reads."""
    cfg = model.config
    total = per_token = bf16 = 0
    for name, p in model.named_parameters():
        n = p.numel() * p.element_size()
        total += n
        if name.endswith("embed_tokens.weight") and not cfg.tie_word_embeddings:
            continue
        share = cfg.num_experts_per_tok / cfg.num_experts if ".mlp.experts." in name else 1.0
        per_token += int(n * share)
        if not name.endswith("_scale_inv"):
            bf16 += int(p.numel() * 2 * share)
    return WeightBytes(total, per_token, bf16)


def weights_summary(model: Qwen35ForCausalLM) -> dict:
    """What `ninfer info` shows of the weights: the FP8 scheme (or "none"), the kinds of matmul
    weight left dense in an FP8 model, and the bytes (`WeightBytes`)."""
    scheme = model.quant_scheme
    nbytes = weight_bytes(model)
    return {
        "quantization": scheme.describe() if scheme is not None else "none",
        "dense_modules": kept_dense(model) if scheme is not None else [],
        "weight_bytes": nbytes.total,
        "decode_weight_bytes_per_token": nbytes.per_token,
        "decode_weight_bytes_per_token_bf16": nbytes.per_token_bf16,
    }


def kept_dense(model: Qwen35ForCausalLM) -> list[str]:
    """The kinds of matmul weight left dense in an FP8 model, by module name with the layer
    index dropped (e.g. "layers.*.linear_attn.in_proj_a"), sorted."""
    kinds = set()
    for name, m in model.named_modules():
        dense = isinstance(m, nn.Linear) or (isinstance(m, Experts) and not m.blocks)
        if dense:
            parts = ["*" if p.isdigit() else p for p in name.removeprefix("model.").split(".")]
            kinds.add(".".join(parts))
    return sorted(kinds)
