"""Tiny FP8 checkpoints written the way the releases write them, from a random bf16 transformers
model, and the dense checkpoint each stands for.

- fine-grained (the Qwen FP8 releases): the Hub's multimodal layout (`model.language_model.*`,
  wrapper config), e4m3 weights with bf16 `weight_scale_inv` per BLOCK, experts per expert, and
  `modules_to_not_convert` listing every module kept bf16 by name, as the releases do;
- compressed-tensors FP8_DYNAMIC (llm-compressor): per-channel bf16 `weight_scale` [N, 1], the
  GDN, routers, shared expert and LM head left bf16 through `ignore` patterns.

The quantiser here is written out independently of ninfer's: per block, scale = amax / 448,
values w / scale cast to e4m3. `dequantized_checkpoint` writes the dense model an FP8 checkpoint
holds (each weight its e4m3 values times its scale) in transformers' flat layout: the oracle.
Dims are multiples of BLOCK except in_proj_a / in_proj_b (kept bf16, as in the releases).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ninfer.demo import DEMO_DIR

BLOCK = (32, 32)
FP8 = torch.float8_e4m3fn
_COMMON = dict(
    vocab_size=2560, hidden_size=64, num_hidden_layers=4, full_attention_interval=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=32, linear_num_key_heads=2,
    linear_key_head_dim=16, linear_value_head_dim=16, tie_word_embeddings=False,
)  # fmt: skip
# name -> (moe?, text-config kwargs), for tests.models.hf_util.CONFIGS
SHAPES = {
    "dense-fp8": (False, dict(_COMMON, intermediate_size=96, linear_num_value_heads=2)),
    "moe-fp8": (True, dict(
        _COMMON, linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32,
    )),
}  # fmt: skip
# the releases' FP8 modules (every other weight stays bf16)
FINE_FP8 = re.compile(
    r"(self_attn\.[qkvo]_proj|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)"
    r"|mlp\.(shared_expert\.)?(gate|up|down)_proj|experts\.\d+\.(gate|up|down)_proj)\.weight$"
)
COMPRESSED_IGNORE = [
    "lm_head", "re:.*embed_tokens$", "re:.*linear_attn.*", "re:.*mlp\\.gate$",
    "re:.*shared_expert_gate$", "re:.*shared_expert\\..*",
]  # fmt: skip
COMPRESSED_FP8 = re.compile(r"(self_attn\.[qkvo]_proj|mlp\.(experts\.\d+\.)?(gate|up|down)_proj)")


def quantize(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values, bf16 scales [ceil(N/bn), ceil(K/bk)]) of w [N, K]."""
    n, k = w.shape
    bn, bk = block
    scale = torch.empty(-(-n // bn), -(-k // bk))
    q = torch.empty(n, k, dtype=FP8)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            tile = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk].float()
            amax = tile.abs().max()
            s = (amax / 448.0).to(torch.bfloat16).float() if amax > 0 else torch.tensor(1.0)
            scale[i, j] = s
            q[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = (tile / s).clamp(-448, 448).to(FP8)
    return q, scale.to(torch.bfloat16)


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    bn, bk = -(-n // scale.shape[0]), -(-k // scale.shape[1])
    full = scale.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return q.float() * full


def _per_expert(state: dict) -> dict:
    """transformers' fused experts as the releases store them: one tensor per expert."""
    out = {}
    for key, t in state.items():
        if key.endswith("experts.gate_up_proj"):
            for e, w in enumerate(t):
                gate, up = w.chunk(2)
                out[key.replace("gate_up_proj", f"{e}.gate_proj.weight")] = gate
                out[key.replace("gate_up_proj", f"{e}.up_proj.weight")] = up
        elif key.endswith("experts.down_proj"):
            for e, w in enumerate(t):
                out[key.replace("down_proj", f"{e}.down_proj.weight")] = w
        else:
            out[key] = t
    return out


def write_fp8_checkpoint(path: Path, hf, kind: str = "fine", mtp: dict | None = None) -> None:
    """`hf` (a transformers Qwen3.5 text model) as a fine-grained ("fine") or compressed-tensors
    ("compressed") FP8 checkpoint in `path`, with the demo model's tokenizer. `mtp`: an MTP
    head's tensors (`mtp.*`, experts fused as transformers holds them), written at the top
    level as the releases do: its projections FP8 like the target's, `mtp.fc`, its norms and
    its router bf16 and listed as such."""
    path.mkdir(parents=True, exist_ok=True)
    full = {**hf.state_dict(), **(mtp or {})}
    state = _per_expert({k: v.to(torch.bfloat16) for k, v in full.items()})
    tensors, kept = {}, []
    for key, w in state.items():
        hub_key = "model.language_model." + key[6:] if key.startswith("model.") else key
        if kind == "fine" and FINE_FP8.search(key):
            q, s = quantize(w, BLOCK)
            tensors[hub_key], tensors[hub_key + "_scale_inv"] = q, s
        elif kind == "compressed" and COMPRESSED_FP8.search(key) and "shared_expert" not in key:
            q, s = quantize(w, (1, w.shape[1]))
            tensors[hub_key], tensors[hub_key.removesuffix("weight") + "weight_scale"] = q, s
        else:
            tensors[hub_key] = w
            kept.append(hub_key.removesuffix(".weight"))  # A_log, dt_bias: the parameter
    text = hf.config.to_dict()
    config = {"model_type": text["model_type"].removesuffix("_text"), "text_config": text,
              "tie_word_embeddings": hf.config.tie_word_embeddings}  # fmt: skip
    if kind == "fine":
        kept = sorted(set(kept))
        kept = ["model.embed_tokens" if k.endswith("embed_tokens") else k for k in kept]
        config["quantization_config"] = {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": list(BLOCK), "modules_to_not_convert": kept,
        }  # fmt: skip
    else:
        group = {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                        "symmetric": True, "dynamic": False, "observer": "minmax"},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                  "symmetric": True, "dynamic": True},
        }  # fmt: skip
        config["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "config_groups": {"group_0": group},
            "ignore": COMPRESSED_IGNORE,
        }  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))
    _copy_tokenizer(path)


def dequantized_checkpoint(fp8_dir: Path, out: Path) -> None:
    """The dense (fp32) checkpoint `fp8_dir` stands for, in transformers' flat layout."""
    out.mkdir(parents=True, exist_ok=True)
    raw = load_file(str(fp8_dir / "model.safetensors"))
    config = json.loads((fp8_dir / "config.json").read_text())
    dense = {}
    for key, t in raw.items():
        if key.endswith(("_scale_inv", "_scale")):
            continue
        name = key.replace("model.language_model.", "model.", 1)
        if t.dtype == FP8:
            scale = raw.get(
                key + "_scale_inv", raw.get(key.removesuffix("weight") + "weight_scale")
            )
            dense[name] = dequantize(t, scale)
        else:
            dense[name] = t.float()
    (out / "config.json").write_text(json.dumps(config["text_config"]))
    save_file(dense, str(out / "model.safetensors"))
    _copy_tokenizer(out)


def _copy_tokenizer(path: Path) -> None:
    for name in ("tokenizer.model", "tokenizer_config.json"):
        shutil.copy(DEMO_DIR / name, path / name)
