"""Loading Qwen3.5 safetensors checkpoints into `Qwen35ForCausalLM`.

Accepts one `model.safetensors` or shards listed by `model.safetensors.index.json`; keys under
`model.` (transformers' text models) or `model.language_model.` (the Hub's multimodal layout);
MoE experts fused (`mlp.experts.gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]) or per expert
(`mlp.experts.{e}.{gate,up,down}_proj.weight`). The vision tower (`model.visual.*`) and the
MTP draft head (`mtp.*`) are skipped unless asked for (`vision=True`, on a checkpoint whose
config.json has a `vision_config`: `model.model.visual`, in `dtype`, never FP8; `mtp=True`:
`model.mtp`).

FP8 checkpoints (config.json's `quantization_config`, `ninfer.models.quant`): the modules the
scheme converts are made FP8 before loading (`ninfer.models.quantize`) and take the e4m3
`weight` and its scale (`weight_scale_inv`, or compressed-tensors' `weight_scale`, read as
`weight_scale_inv`), in fp32 whatever the file's dtype; per-expert scales stack like the
weights. A tensor whose dtype disagrees with the scheme (FP8 where it keeps the module dense,
or the reverse) is a ValueError naming it. `quantization="fp8"` quantises a dense checkpoint
as it loads: each module the scheme converts becomes FP8 once its weights are in (a linear at
its weight, a layer's experts at their last part; `Fp8Linear.quantized`, `Experts.to_fp8`).

The model is built on the meta device and each tensor is read, cast and placed one at a time,
so peak memory is the model plus one tensor (quantised at load: the FP8 model plus one
module's dense weights). Knows nothing about tokenizers or the engine.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from ninfer.models.config import Qwen35Config
from ninfer.models.quant import QuantScheme, checkpoint_scheme, on_the_fly
from ninfer.models.quantize import convert_module, fp8_targets, quantize_, to_fp8_layout
from ninfer.models.qwen3_5 import Experts, Qwen35ForCausalLM
from ninfer.models.vision import VisionConfig, add_vision_tower
from ninfer.ops.fp8 import FP8_DTYPE

logger = logging.getLogger("ninfer.models")

INDEX_FILE = "model.safetensors.index.json"
SKIPPED_PREFIXES = ("model.visual.", "mtp.")
_PER_EXPERT = re.compile(
    r"^((?:model|mtp)\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.(weight(?:_scale_inv)?)$"
)
SCALE = "weight_scale_inv"  # the model's name of an FP8 weight's scale


def checkpoint_files(path: str | Path) -> list[Path]:
    """The safetensors files of the checkpoint directory `path`, sorted."""
    path = Path(path)
    index = path / INDEX_FILE
    if index.exists():
        try:
            with open(index, encoding="utf-8") as f:
                names = set(json.load(f)["weight_map"].values())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{index}: not valid JSON ({exc})") from None
        except (KeyError, TypeError, AttributeError):
            raise ValueError(f'{index}: no "weight_map" object of tensor -> file') from None
        missing = sorted(n for n in names if not (path / n).is_file())
        if missing:
            raise ValueError(f"{index}: lists {', '.join(missing)}, not in {path}")
        return sorted(path / n for n in names)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    return files


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    quantization: str | None = None,
    mtp: bool = False,
    vision: bool = False,
) -> Qwen35ForCausalLM:
    """Builds the model described by `path`/config.json and loads its weights in `dtype` on
    `device` (the config is `model.config`); FP8 weights stay FP8. `quantization` "fp8"
    quantises a dense checkpoint's linears at load (`ninfer.models.quant.on_the_fly`; an FP8
    checkpoint loads as it is); `mtp`: its MTP draft head too; `vision`: its vision tower too
    (`model.model.visual`; a checkpoint without one loads text-only, `visual` None). Raises
    ValueError naming any missing, unexpected, mis-shaped or mistyped tensor, one holding NaN
    or infinite values, or a malformed `quantization_config` or `vision_config`; with `mtp`,
    naming `speculative` when the checkpoint has no `mtp.*` tensor."""
    config = Qwen35Config.from_file(path)
    device = torch.device(device)
    scheme = checkpoint_scheme(path)
    on_the_fly_scheme = on_the_fly(quantization)  # ValueError naming a bad value, first
    if scheme is not None:  # already FP8: loaded as it is
        on_the_fly_scheme = None
    model = Qwen35ForCausalLM(config, dtype=dtype, device="meta")
    if mtp:
        from ninfer.models.mtp import add_mtp_head

        add_mtp_head(model, dtype, "meta")
    if scheme is not None:
        to_fp8_layout(model, scheme)
    vision_config = VisionConfig.from_file(path) if vision else None
    if vision_config is not None:
        add_vision_tower(model, vision_config, dtype, "meta")
    loader = _Loader(model, dtype, device, scheme.scale_name if scheme else SCALE)
    if on_the_fly_scheme is not None:
        loader.quantize_as_loaded(on_the_fly_scheme)
    for file in checkpoint_files(path):
        try:
            with safe_open(file, framework="pt", device=_safetensors_device(device)) as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                    loader.add(key, f)
        except SafetensorError as exc:  # truncated or not a safetensors file: name it
            raise ValueError(f"{file}: not a valid safetensors file ({exc})") from None
    loader.finish()
    if loader.skipped:
        logger.info(
            "skipped %d checkpoint tensors of the vision tower / MTP head in %s",
            loader.skipped,
            path,
        )
    model.tie_weights()
    model.init_buffers()
    if vision_config is not None:
        model.model.visual.init_buffers()
    if on_the_fly_scheme is not None:
        quantize_(model, on_the_fly_scheme)  # the scheme recorded; every target is FP8 already
    return model.eval()


def _safetensors_device(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index}"
    return "cpu"


class _Loader:
    """Places checkpoint tensors into a meta-device model, tracking what is still missing.
    With `quantize_as_loaded`, each module an on-the-fly scheme converts becomes FP8 as soon as
    its weights are in (a linear at its weight, a layer's experts at their last part), so the
    load never holds more than one such module in bf16 beside the FP8 model."""

    def __init__(
        self, model: Qwen35ForCausalLM, dtype: torch.dtype, device: torch.device, scale_name: str
    ):
        self.model, self.dtype, self.device = model, dtype, device
        self.scale_name = scale_name  # the checkpoint's suffix for SCALE
        self.expected = dict(model.named_parameters())  # tied lm_head is not listed
        self.loaded: set[str] = set()
        self.expert_parts: dict[str, set[tuple[int, str]]] = {}
        self.skipped = 0
        self.scheme: QuantScheme | None = None
        self.to_quantize: set[str] = set()  # module names still to make FP8 once loaded

    def quantize_as_loaded(self, scheme: QuantScheme) -> None:
        """Make each module `scheme` converts FP8 once its weights have loaded (class
        docstring)."""
        linears, experts = fp8_targets(self.model, scheme)
        self.scheme, self.to_quantize = scheme, {*linears, *experts}

    def _quantize_if_loaded(self, module_name: str) -> None:
        if module_name not in self.to_quantize:
            return
        module = self.model.get_submodule(module_name)
        if isinstance(module, Experts):
            e = self.model.config.num_experts
            for name in Experts.NAMES:
                full = f"{module_name}.{name}"
                parts = self.expert_parts.get(full, set())
                want = e if name == "down_proj" else 2 * e
                if full not in self.loaded and len(parts) < want:
                    return  # a part still to come
        convert_module(self.model, module_name, self.scheme)
        self.to_quantize.discard(module_name)

    def add(self, key: str, source) -> None:
        """Places tensor `key` of `source` (an open safetensors file)."""
        name = _canonical_name(
            key, self.scale_name, self.model.mtp is not None, self.model.model.visual is not None
        )
        if name is None:
            self.skipped += 1
            return
        if name == "lm_head.weight" and self.model.config.tie_word_embeddings:
            return  # some tied checkpoints still carry a copy of the embedding
        per_expert = _PER_EXPERT.match(name)
        if per_expert:
            self._add_expert(key, per_expert, source)
            return
        if name not in self.expected:
            raise ValueError(f"unexpected tensor {key!r} in the checkpoint")
        tensor = source.get_tensor(key)
        want = self.expected[name]
        _check_shape(key, tuple(tensor.shape), tuple(want.shape))
        _check_kind(key, tensor.dtype, want.dtype)
        placed = tensor.to(device=self.device, dtype=want.dtype)
        _check_finite(key, placed, tensor.dtype)
        self._assign(name, placed)
        self.loaded.add(name)
        self._quantize_if_loaded(name.rpartition(".")[0])

    def _add_expert(self, key: str, match: re.Match, source) -> None:
        prefix, expert, part = match.group(1), int(match.group(2)), match.group(3)
        fused = f"{prefix}.down_proj" if part == "down" else f"{prefix}.gate_up_proj"
        if match.group(4) == SCALE:
            fused += "_scale_inv"
        if fused not in self.expected or expert >= self.model.config.num_experts:
            raise ValueError(f"unexpected tensor {key!r} in the checkpoint")
        target = self._fused_storage(fused)
        i = _expert_rows(self.model.get_submodule(prefix), key, match.group(4))
        rows = {"gate": slice(0, i), "up": slice(i, 2 * i), "down": slice(None)}[part]
        dest = target[expert, rows]
        tensor = source.get_tensor(key)
        _check_shape(key, tuple(tensor.shape), tuple(dest.shape))
        _check_kind(key, tensor.dtype, dest.dtype)
        dest.copy_(tensor)
        _check_finite(key, dest, tensor.dtype)
        self.expert_parts.setdefault(fused, set()).add((expert, part))
        self._quantize_if_loaded(prefix)

    def _fused_storage(self, name: str) -> torch.Tensor:
        """The real parameter for a fused expert tensor, allocated on first use."""
        param = self.model.get_parameter(name)
        if param.is_meta:
            param = torch.empty(param.shape, dtype=param.dtype, device=self.device)
            self._assign(name, param)
        return self.model.get_parameter(name)

    def _assign(self, name: str, tensor: torch.Tensor) -> None:
        module_name, _, attr = name.rpartition(".")
        module = self.model.get_submodule(module_name)
        module._parameters[attr] = nn.Parameter(tensor, requires_grad=False)

    def finish(self) -> None:
        """Raises ValueError naming the first missing tensors, if any."""
        if self.model.mtp is not None and not any(n.startswith("mtp.") for n in self.loaded):
            raise ValueError(
                "speculative='mtp': the checkpoint has no MTP draft head (no mtp.* tensors)"
            )
        missing = []
        for name in self.expected:
            if name in self.loaded:
                continue
            parts = self.expert_parts.get(name)
            prefix, _, attr = name.rpartition(".")
            kinds = ("down",) if attr.startswith("down_proj") else ("gate", "up")
            # fused experts' scales: always per expert in a checkpoint
            scale = attr in ("gate_up_proj_scale_inv", "down_proj_scale_inv")
            suffix = self.scale_name if scale else "weight"
            if parts is None and not scale:
                missing.append(_checkpoint_name(name, self.scale_name))
                continue
            parts = parts or set()
            missing += [
                f"{prefix}.{e}.{kind}_proj.{suffix}"
                for e in range(self.model.config.num_experts)
                for kind in kinds
                if (e, kind) not in parts
            ]
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ValueError(f"missing tensors in the checkpoint: {missing[:5]}{more}")


def _canonical_name(
    key: str, scale_name: str, mtp: bool = False, vision: bool = False
) -> str | None:
    """The model's parameter name for a checkpoint key (a weight's scale named `scale_name`
    becomes SCALE), None for tensors to skip (`mtp`: the MTP head's are kept; `vision`: the
    tower's)."""
    kept = (mtp and key.startswith("mtp.")) or (vision and key.startswith("model.visual."))
    if key.startswith(SKIPPED_PREFIXES) and not kept:
        return None
    if key.endswith("." + scale_name):
        key = key.removesuffix(scale_name) + SCALE
    if key.startswith("model.language_model."):
        return "model." + key.removeprefix("model.language_model.")
    return key


def _checkpoint_name(name: str, scale_name: str) -> str:
    """A parameter's name as the checkpoint spells a missing tensor (its scale's suffix)."""
    if name.endswith("." + SCALE):
        return name.removesuffix(SCALE) + scale_name
    return name


def _expert_rows(experts, key: str, attr: str) -> int:
    """Rows of the gate (and of the up) part of an expert's gate_up weight (SCALE: of its
    scale, which needs I to be a multiple of the block's rows)."""
    i = experts.down_proj.shape[-1]
    if attr != SCALE:
        return i
    bn = experts.blocks["gate_up_proj"][0]
    if i % bn:
        raise ValueError(
            f"tensor {key!r}: moe_intermediate_size {i} is not a multiple of the FP8 block's "
            f"{bn} rows, so gate and up scales cannot be stacked"
        )
    return i // bn


def _check_kind(key: str, got: torch.dtype, want: torch.dtype) -> None:
    """ValueError naming `key` when a stored FP8 tensor meets a dense parameter or the reverse
    (the quantisation config and the tensors disagree)."""
    if (got == FP8_DTYPE) != (want == FP8_DTYPE):
        what = "FP8 in the quantization_config" if want == FP8_DTYPE else "not FP8"
        raise ValueError(
            f"tensor {key!r} is stored as {got}, but its module is {what} "
            "(check quantization_config's modules_to_not_convert / ignore)"
        )


_FINITE_CHUNK = 1 << 26  # elements checked at a time (bounds the check's scratch memory)


def _check_finite(key: str, tensor: torch.Tensor, stored: torch.dtype) -> None:
    """ValueError naming `key` when the placed tensor holds a NaN or an infinity (a corrupt
    checkpoint, or values beyond the load dtype's range): the model would only print noise."""
    if not tensor.is_floating_point():
        return
    flat = tensor.reshape(-1)
    for start in range(0, flat.numel(), _FINITE_CHUNK):
        part = flat[start : start + _FINITE_CHUNK]
        if not bool(_finite(part).all()):
            bad = sum(
                int((~_finite(flat[i : i + _FINITE_CHUNK])).sum())
                for i in range(0, flat.numel(), _FINITE_CHUNK)
            )
            why = "the checkpoint is corrupt"
            if tensor.dtype != stored:
                why += f", or its {stored} values overflow {tensor.dtype} (try another --dtype)"
            raise ValueError(
                f"tensor {key!r} holds {bad} NaN or infinite values of {flat.numel()}: {why}"
            )


def _finite(part: torch.Tensor) -> torch.Tensor:
    # e4m3fn has a NaN (no infinity) but no isfinite kernel
    return torch.isfinite(part.float() if part.dtype == FP8_DTYPE else part)


def _check_shape(key: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if got != want:
        raise ValueError(f"tensor {key!r} has shape {list(got)}, expected {list(want)}")
