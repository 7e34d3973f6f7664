"""Weight quantisation schemes: a checkpoint's `quantization_config`, or on-the-fly FP8.

Two FP8 formats are read, both e4m3 weights with activations quantised at run time:

- fine-grained FP8 (`"quant_method": "fp8"`, the Qwen FP8 releases): one scale per
  `weight_block_size` block (128 x 128), stored as `<module>.weight_scale_inv`; the modules in
  `modules_to_not_convert` stay in the checkpoint's dtype. A pattern names a module as
  transformers matches it: from the start of the module's name up to a module boundary (as a
  regular expression: "mlp.gate" does not name "mlp.gate_proj"), or as a suffix of it.
- compressed-tensors (`"quant_method": "compressed-tensors"`, llm-compressor's FP8_DYNAMIC or
  FP8_BLOCK): per-channel `weight_scale` [N, 1] (strategy "channel") or block scales (strategy
  "block"); the Linear modules named by `ignore` (a name, or "re:" and a regular expression
  that must match from the start) stay unquantised.

A module's name is tried both as the model names it (`model.layers.0.mlp.gate_proj`) and in the
Hub's multimodal layout (`model.language_model.layers.0.mlp.gate_proj`). `on_the_fly()` is the
fine-grained scheme with the official releases' not-convert list, for quantising a bf16
checkpoint at load. Knows nothing about tensors.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FINE_GRAINED = "fp8"
COMPRESSED = "compressed-tensors"
QUANTIZATION_CHOICES = ("fp8",)  # LLM(quantization=...) besides None
DEFAULT_BLOCK = (128, 128)
# What the official FP8 releases keep in bf16 (only Linear modules and experts are ever
# converted; norms, conv1d, A_log and dt_bias are listed because the releases list them)
OFFICIAL_NOT_CONVERT = (
    "lm_head", "embed_tokens", "norm", "A_log", "conv1d", "dt_bias", "in_proj_a", "in_proj_b",
    "in_proj_ba", "mlp.gate", "shared_expert_gate", "mtp.fc", "model.visual",
)  # fmt: skip
_BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"


@dataclass(frozen=True, slots=True)
class QuantScheme:
    """How a model's linear weights are stored: `method` FINE_GRAINED or COMPRESSED, `block`
    (bn, bk) of one scale (bn == 1 and bk == 0: one scale per output channel, [N, 1]),
    `keep` the patterns of the modules left unquantised, `scale_name` the checkpoint's suffix
    of a weight's scale tensor."""

    method: str
    block: tuple[int, int]
    keep: tuple[str, ...]
    scale_name: str

    @property
    def per_channel(self) -> bool:
        return self.block == (1, 0)

    def block_for(self, k: int) -> tuple[int, int]:
        """The block of a weight with K = `k` input columns (a per-channel one spans K)."""
        return (1, k) if self.per_channel else self.block

    def converts(self, name: str) -> bool:
        """Whether module `name` (canonical `model.layers...` or `lm_head`) is FP8."""
        names = [name]
        if name.startswith("model."):
            names.append("model.language_model." + name.removeprefix("model."))
        return not any(self._kept(n) for n in names)

    def _kept(self, name: str) -> bool:
        if self.method == COMPRESSED:
            return any(
                re.match(p[3:], name) is not None if p.startswith("re:") else p == name
                for p in self.keep
            )
        return any(
            re.match(rf"(?:{p}){_BOUNDARY}", name) is not None or name.endswith(p)
            for p in self.keep
        )

    def describe(self) -> str:
        """One line, e.g. "fp8 e4m3, 128x128 blocks, dynamic activations"."""
        blocks = "per-channel scales" if self.per_channel else "x".join(map(str, self.block))
        blocks += "" if self.per_channel else " blocks"
        return f"{self.method} e4m3, {blocks}, dynamic per-token activations"


def on_the_fly(choice: str | None) -> QuantScheme | None:
    """The scheme of `LLM(quantization=choice)`: None keeps the checkpoint as it is; "fp8"
    quantises its bf16 linears at load (fine-grained, 128 x 128, the official not-convert list).
    ValueError naming `quantization` for anything else."""
    if choice is None:
        return None
    if choice not in QUANTIZATION_CHOICES:
        raise ValueError(
            f"quantization must be None or one of {QUANTIZATION_CHOICES}, got {choice!r}"
        )
    return QuantScheme(FINE_GRAINED, DEFAULT_BLOCK, OFFICIAL_NOT_CONVERT, "weight_scale_inv")


def checkpoint_scheme(path: str | Path) -> QuantScheme | None:
    """The scheme of the checkpoint folder (or config.json) at `path`, None when its config has
    no `quantization_config`. ValueError naming the malformed field."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    qc = raw.get("quantization_config", text.get("quantization_config"))
    return None if qc is None else parse_scheme(qc)


def parse_scheme(qc: Any) -> QuantScheme:
    """A `quantization_config` object as a QuantScheme; ValueError naming the field."""
    if not isinstance(qc, dict):
        raise ValueError(f"quantization_config must be an object, got {qc!r}")
    method = qc.get("quant_method")
    if method == FINE_GRAINED:
        return _fine_grained(qc)
    if method == COMPRESSED:
        return _compressed(qc)
    raise ValueError(
        f"quantization_config.quant_method {method!r} is not supported "
        f"(expected {FINE_GRAINED!r} or {COMPRESSED!r})"
    )


def _field(qc: dict, key: str, want: Any, default: Any) -> None:
    value = qc.get(key, default)
    if value != want:
        raise ValueError(f"quantization_config.{key} must be {want!r}, got {value!r}")


def _block(value: Any, key: str) -> tuple[int, int]:
    ok = (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    )
    if not ok:
        raise ValueError(f"{key} must be two positive integers, got {value!r}")
    return int(value[0]), int(value[1])


def _names(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key} must be a list of module names, got {value!r}")
    return tuple(value)


def _fine_grained(qc: dict) -> QuantScheme:
    _field(qc, "fmt", "e4m3", "e4m3")
    _field(qc, "activation_scheme", "dynamic", "dynamic")
    block = qc.get("weight_block_size", list(DEFAULT_BLOCK))
    keep = _names(qc.get("modules_to_not_convert"), "quantization_config.modules_to_not_convert")
    return QuantScheme(
        FINE_GRAINED,
        _block(block, "quantization_config.weight_block_size"),
        keep,
        "weight_scale_inv",
    )


def _compressed(qc: dict) -> QuantScheme:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError(f"quantization_config.config_groups must be an object, got {groups!r}")
    blocks = {_group_block(name, group) for name, group in groups.items()}
    if len(blocks) > 1:
        raise ValueError("quantization_config.config_groups: groups with different weight schemes")
    keep = _names(qc.get("ignore"), "quantization_config.ignore")
    return QuantScheme(COMPRESSED, blocks.pop(), keep, "weight_scale")


def _group_block(name: str, group: Any) -> tuple[int, int]:
    """One config group's weight block: (1, 0) for per-channel scales."""
    key = f"quantization_config.config_groups.{name}"
    if not isinstance(group, dict):
        raise ValueError(f"{key} must be an object, got {group!r}")
    if "Linear" not in (group.get("targets") or []):
        raise ValueError(f"{key}.targets must include 'Linear', got {group.get('targets')!r}")
    weights = group.get("weights")
    if not isinstance(weights, dict):
        raise ValueError(f"{key}.weights must be an object, got {weights!r}")
    for field, want in (("num_bits", 8), ("type", "float"), ("dynamic", False)):
        if weights.get(field) != want:
            raise ValueError(f"{key}.weights.{field} must be {want!r}, got {weights.get(field)!r}")
    if weights.get("symmetric", True) is not True:
        raise ValueError(f"{key}.weights.symmetric must be true")
    strategy = weights.get("strategy")
    if strategy == "channel":
        block = (1, 0)
    elif strategy == "block":
        block = _block(weights.get("block_structure"), f"{key}.weights.block_structure")
    else:
        raise ValueError(f"{key}.weights.strategy must be 'channel' or 'block', got {strategy!r}")
    acts = group.get("input_activations")
    if acts is not None and (not isinstance(acts, dict) or acts.get("dynamic") is not True):
        raise ValueError(f"{key}.input_activations must be dynamic, got {acts!r}")
    return block
