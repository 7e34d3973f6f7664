"""Qwen3.5 text-model configuration, normalised from a Hugging Face `config.json`.

Accepts the flat text configs (`qwen3_5_text`, `qwen3_5_moe_text`) and the Hub's multimodal
wrappers (`qwen3_5`, `qwen3_5_moe`, with a nested `text_config`), `rope_parameters` or the older
`rope_theta` / `partial_rotary_factor` / `rope_scaling` fields, and `layer_types` or
`full_attention_interval`. Knows nothing about weights or tensors.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ninfer.forward import HeadDims

TEXT_MODEL_TYPES = {"qwen3_5_text", "qwen3_5_moe_text"}
WRAPPER_MODEL_TYPES = {"qwen3_5", "qwen3_5_moe"}


@dataclass(frozen=True, slots=True)
class Qwen35Config:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]  # "linear_attention" | "full_attention" per layer
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    intermediate_size: int = 0  # dense SwiGLU width (0 for MoE)
    num_experts: int = 0  # 0 = dense
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    # rotary frequencies per position axis (t, h, w) of the interleaved multimodal RoPE
    mrope_section: tuple[int, ...] = (11, 11, 10)
    max_position_embeddings: int = 262_144
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    model_type: str = "qwen3_5_text"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    # ---- derived values -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def full_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def gdn_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def rope_axes(self) -> tuple[int, ...]:
        """The position axis (0 t, 1 h, 2 w) that rotates each of the R/2 rotary frequencies
        (interleaved mRoPE, as transformers' Qwen3.5): frequency i takes h when i % 3 == 1
        and i < 3 * mrope_section[1], w when i % 3 == 2 and i < 3 * mrope_section[2], else t.
        Text tokens have t = h = w, so for them this is plain 1-D RoPE."""
        h, w = (3 * n for n in self.mrope_section[1:])
        return tuple(
            1 if i % 3 == 1 and i < h else 2 if i % 3 == 2 and i < w else 0
            for i in range(self.rotary_dim // 2)
        )

    @property
    def head_dims(self) -> HeadDims:
        """The per-head dims that decide which kernels serve the model (`ninfer.forward`)."""
        return HeadDims(
            self.head_dim, self.rotary_dim, self.linear_key_head_dim, self.linear_value_head_dim
        )

    @property
    def key_dim(self) -> int:  # Kd = Hk * dk
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:  # Vd = Hv * dv
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:  # C = 2 Kd + Vd
        return 2 * self.key_dim + self.value_dim

    def kv_bytes_per_token(self, kv_itemsize: int) -> int:
        """K + V bytes of one token over all full-attention layers."""
        return len(self.full_layer_ids) * 2 * self.num_key_value_heads * self.head_dim * kv_itemsize

    def state_image_bytes(self, conv_itemsize: int) -> int:
        """Bytes of one state slot: fp32 recurrent + conv history of every GDN layer."""
        n = len(self.gdn_layer_ids)
        ssm = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        ssm *= 4  # fp32
        conv = self.conv_dim * (self.linear_conv_kernel_dim - 1) * conv_itemsize
        return n * (ssm + conv)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_types"] = list(self.layer_types)
        d["eos_token_ids"] = list(self.eos_token_ids)
        d["mrope_section"] = list(self.mrope_section)
        return d

    # ---- parsing --------------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> Qwen35Config:
        raw = _text_config(raw)
        model_type = raw["model_type"]
        n_layers = _require(raw, "num_hidden_layers")
        layer_types = _layer_types(raw, n_layers)
        theta, partial, mrope_section = _rope(raw)
        eos = raw.get("eos_token_id")
        eos_list = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        eos_ids = tuple(_typed("eos_token_id", e, int) for e in eos_list)
        is_moe = model_type == "qwen3_5_moe_text"
        hidden = _require(raw, "hidden_size")
        heads = _require(raw, "num_attention_heads")
        for key, value in (("num_hidden_layers", n_layers), ("hidden_size", hidden)):
            if value < 1:
                raise ValueError(f"config.json: {key!r} must be >= 1, got {value}")
        if heads < 1:
            raise ValueError(f"config.json: 'num_attention_heads' must be >= 1, got {heads}")
        head_dim = _get(raw, "head_dim", 0, int) or hidden // heads
        return cls(
            vocab_size=_require(raw, "vocab_size"),
            hidden_size=hidden,
            num_hidden_layers=n_layers,
            layer_types=tuple(layer_types),
            num_attention_heads=heads,
            num_key_value_heads=_require(raw, "num_key_value_heads"),
            head_dim=head_dim,
            linear_num_key_heads=_require(raw, "linear_num_key_heads"),
            linear_num_value_heads=_require(raw, "linear_num_value_heads"),
            linear_key_head_dim=_require(raw, "linear_key_head_dim"),
            linear_value_head_dim=_require(raw, "linear_value_head_dim"),
            linear_conv_kernel_dim=_get(raw, "linear_conv_kernel_dim", 4, int),
            intermediate_size=0 if is_moe else _require(raw, "intermediate_size"),
            num_experts=_require(raw, "num_experts") if is_moe else 0,
            num_experts_per_tok=_require(raw, "num_experts_per_tok") if is_moe else 0,
            moe_intermediate_size=_require(raw, "moe_intermediate_size") if is_moe else 0,
            shared_expert_intermediate_size=(
                _require(raw, "shared_expert_intermediate_size") if is_moe else 0
            ),
            rms_norm_eps=_get(raw, "rms_norm_eps", 1e-6, float),
            rope_theta=theta,
            partial_rotary_factor=partial,
            mrope_section=mrope_section,
            max_position_embeddings=_get(raw, "max_position_embeddings", 32768, int),
            tie_word_embeddings=_get(raw, "tie_word_embeddings", False, bool),
            eos_token_ids=eos_ids,
            model_type=model_type,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> Qwen35Config:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(raw).__name__}")
        try:
            return cls.from_hf_dict(raw)
        except ValueError as exc:
            raise ValueError(f"{path}: {str(exc).removeprefix('config.json: ')}") from None
        except (TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"{path}: malformed field ({type(exc).__name__}: {exc})") from None


def _require(raw: dict[str, Any], key: str, kind: type = int) -> Any:
    """`raw[key]`, present and of `kind` (an int for the shape fields)."""
    if key not in raw:
        raise ValueError(f"config.json: missing field {key!r}")
    return _typed(key, raw[key], kind)


def _get(raw: dict[str, Any], key: str, default: Any, kind: type) -> Any:
    """`raw[key]` of `kind` (None or absent: `default`)."""
    value = raw.get(key)
    return default if value is None else _typed(key, value, kind)


def _typed(key: str, value: Any, kind: type) -> Any:
    """`value` as `kind` (int: an integer, not a bool; float: any number; bool: a bool);
    ValueError naming `key` otherwise."""
    ok = (
        isinstance(value, bool)
        if kind is bool
        else isinstance(value, (int, float) if kind is float else int)
        and not isinstance(value, bool)
    )
    if not ok:
        what = {int: "an integer", float: "a number", bool: "true or false"}[kind]
        raise ValueError(f"config.json: {key!r} must be {what}, got {value!r}")
    return kind(value)


def _text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The text model's config (a multimodal wrapper's `text_config`, inheriting the wrapper's
    tie_word_embeddings and eos_token_id), its model_type set and checked."""
    model_type = raw.get("model_type", "qwen3_5_text")
    if model_type in WRAPPER_MODEL_TYPES:
        if "text_config" not in raw:
            raise ValueError(f"config.json: model_type {model_type!r} needs text_config")
        text = dict(raw["text_config"])
        text.setdefault("model_type", model_type + "_text")
        for key in ("tie_word_embeddings", "eos_token_id"):
            if key not in text and key in raw:
                text[key] = raw[key]
        raw = text
        model_type = raw["model_type"]
    if model_type not in TEXT_MODEL_TYPES:
        raise ValueError(
            f"config.json: model_type {model_type!r} is not a Qwen3.5 model "
            f"(expected one of {sorted(TEXT_MODEL_TYPES | WRAPPER_MODEL_TYPES)})"
        )
    return {**raw, "model_type": model_type}


def _layer_types(raw: dict[str, Any], n_layers: int) -> list[str]:
    """`layer_types`, or every `full_attention_interval`-th layer full attention."""
    layer_types = raw.get("layer_types")
    if layer_types is None:
        interval = _get(raw, "full_attention_interval", 4, int)
        if interval < 1:
            raise ValueError("config.json: 'full_attention_interval' must be >= 1")
        layer_types = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(n_layers)
        ]
    if not isinstance(layer_types, list):
        raise ValueError(f"config.json: 'layer_types' must be a list, got {layer_types!r}")
    if len(layer_types) != n_layers:
        raise ValueError(
            f"config.json: layer_types has {len(layer_types)} entries, "
            f"num_hidden_layers is {n_layers}"
        )
    bad = [t for t in layer_types if t not in ("full_attention", "linear_attention")]
    if bad:
        raise ValueError(f"config.json: unknown layer_types {sorted(map(str, bad))}")
    return layer_types


def _rope(raw: dict[str, Any]) -> tuple[float, float, tuple[int, ...]]:
    """(rope_theta, partial_rotary_factor, mrope_section): from `rope_parameters` (or
    `rope_scaling`), else the top level; only the default rope type and the interleaved
    multimodal layout are supported."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ValueError(f"config.json: 'rope_parameters' must be an object, got {rope!r}")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ValueError(f"config.json: rope_type {rope_type!r} is not supported")
    theta = _get(rope, "rope_theta", _get(raw, "rope_theta", 10_000.0, float), float)
    partial = _get(
        rope, "partial_rotary_factor", _get(raw, "partial_rotary_factor", 0.25, float), float
    )
    if not _get(rope, "mrope_interleaved", True, bool):
        raise ValueError("config.json: mrope_interleaved false is not supported")
    section = rope.get("mrope_section") or [11, 11, 10]
    if not isinstance(section, list) or len(section) != 3:
        raise ValueError(f"config.json: 'mrope_section' must be 3 integers, got {section!r}")
    return theta, partial, tuple(_typed("mrope_section", n, int) for n in section)
