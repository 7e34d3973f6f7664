"""The Qwen3.5 vision tower (`model.visual.*`): pixel patches in, one embedding per merged
token out, at the text model's width.

As transformers' `Qwen3_5VisionModel` (Qwen3-VL's ViT without DeepStack):

    pixel_values [N, C*T*P*P]   N patches of all images, each image's in merge-block order
    patch_embed   the Conv3d over one (T, P, P) patch, run as a linear over its flat pixels
    + pos_embed   a learned square grid, bilinearly resampled to each image's (h, w) grid
    blocks        pre-LayerNorm ViT blocks; 2-D rotary (h, w) on every head; attention
                  within each image frame only (SDPA per frame)
    merger        LayerNorm, then each merge x merge block of patches -> one token (MLP) ->
                  out_hidden_size
    -> [N / merge^2, out_hidden_size]

An image of grid (t, h, w) patches gives t*h*w / merge^2 tokens, in raster order of the merged
grid (the order of its pad tokens in the prompt). Attribute names mirror the checkpoint keys.
Knows nothing about pixels' origin (`ninfer.vision.preprocess`), prompts or the engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ninfer.models.config import _get, _require

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "silu": F.silu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}
LAYER_NORM_EPS = 1e-6
# the multimodal token ids of the Qwen3.5 tokenizer (config.json's fields, when absent)
TOKEN_IDS = {
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
}


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """A checkpoint's `vision_config` and the multimodal token ids of its config.json."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    num_position_embeddings: int
    hidden_act: str = "gelu_pytorch_tanh"
    in_channels: int = 3
    rope_theta: float = 10_000.0
    image_token_id: int = TOKEN_IDS["image_token_id"]
    video_token_id: int = TOKEN_IDS["video_token_id"]
    vision_start_token_id: int = TOKEN_IDS["vision_start_token_id"]
    vision_end_token_id: int = TOKEN_IDS["vision_end_token_id"]

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Pixel values per patch: C * T * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> VisionConfig | None:
        """From a multimodal config.json (`vision_config` and the wrapper's token ids); None
        when it has no `vision_config` (a text-only checkpoint)."""
        v = raw.get("vision_config")
        if v is None:
            return None
        if not isinstance(v, dict):
            raise ValueError(f"config.json: 'vision_config' must be an object, got {v!r}")
        act = v.get("hidden_act", "gelu_pytorch_tanh")
        if act not in _ACTIVATIONS:
            raise ValueError(f"config.json: vision hidden_act {act!r} is not supported")
        rope = v.get("rope_parameters") or {}
        if not isinstance(rope, dict):
            raise ValueError(
                f"config.json: vision 'rope_parameters' must be an object, got {rope!r}"
            )
        ints = ("depth", "hidden_size", "num_heads", "intermediate_size", "out_hidden_size")
        ints += ("patch_size", "temporal_patch_size", "spatial_merge_size")
        cfg = cls(
            **{k: _require(v, k) for k in ints},
            num_position_embeddings=_require(v, "num_position_embeddings"),
            hidden_act=act,
            in_channels=_get(v, "in_channels", 3, int),
            rope_theta=_get(rope, "rope_theta", 10_000.0, float),
            **{k: _get(raw, k, default, int) for k, default in TOKEN_IDS.items()},
        )
        cfg.check()
        return cfg

    @classmethod
    def from_file(cls, path: str | Path) -> VisionConfig | None:
        """`from_hf_dict` of the config.json in directory `path` (or at `path`)."""
        path = Path(path)
        path = path / "config.json" if path.is_dir() else path
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        try:
            return cls.from_hf_dict(raw)
        except ValueError as exc:
            raise ValueError(f"{path}: {str(exc).removeprefix('config.json: ')}") from None

    def check(self) -> None:
        """ValueError naming a field whose value the tower cannot take."""
        sizes = ("depth", "hidden_size", "num_heads", "intermediate_size", "patch_size")
        sizes += ("temporal_patch_size", "spatial_merge_size", "out_hidden_size", "in_channels")
        for name in sizes:
            if getattr(self, name) < 1:
                raise ValueError(f"config.json: vision {name} must be >= 1")
        side = int(round(self.num_position_embeddings**0.5))
        if side * side != self.num_position_embeddings:
            raise ValueError("config.json: vision num_position_embeddings must be a square")
        if self.hidden_size % self.num_heads or self.head_dim % 4:
            raise ValueError("config.json: vision hidden_size / num_heads must be a multiple of 4")


class PatchEmbed(nn.Module):
    """`patch_embed.proj`: Conv3d(C, hidden, kernel = stride = (T, P, P)) with bias."""

    def __init__(self, cfg: VisionConfig, factory: dict) -> None:
        super().__init__()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel, stride=kernel, **factory)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, C*T*P*P] -> [N, hidden] in the weight's dtype."""
        w = self.proj.weight
        return F.linear(pixels.to(w.dtype), w.reshape(w.shape[0], -1), self.proj.bias)


class VisionAttention(nn.Module):
    """`attn`: fused qkv (with bias), 2-D rotary, attention per frame, proj."""

    def __init__(self, cfg: VisionConfig, factory: dict) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, **factory)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, **factory)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> torch.Tensor:
        """x [N, hidden]; cos, sin [N, head_dim] fp32; `lengths`: patches per frame."""
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.num_heads, -1).unbind(1)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        scale = q.shape[-1] ** -0.5
        out = [
            F.scaled_dot_product_attention(
                *(t.transpose(0, 1) for t in qkv), scale=scale
            ).transpose(0, 1)
            for qkv in zip(*(t.split(lengths) for t in (q, k, v)), strict=True)
        ]
        return self.proj(torch.cat(out).reshape(n, -1))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotation of x [N, H, D] over all D dims with cos, sin [N, D], in fp32, cast back."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class VisionMLP(nn.Module):
    """`mlp`: linear_fc1 -> hidden_act -> linear_fc2 (with biases)."""

    def __init__(self, cfg: VisionConfig, factory: dict) -> None:
        super().__init__()
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, **factory)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nn.Module):
    """`blocks.N`: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, cfg: VisionConfig, factory: dict) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=LAYER_NORM_EPS, **factory)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=LAYER_NORM_EPS, **factory)
        self.attn = VisionAttention(cfg, factory)
        self.mlp = VisionMLP(cfg, factory)

    def forward(self, x, cos, sin, lengths: list[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, lengths)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """`merger`: LayerNorm per patch, then merge^2 consecutive patches as one row -> fc1 ->
    GELU (erf) -> fc2 [out_hidden_size]."""

    def __init__(self, cfg: VisionConfig, factory: dict) -> None:
        super().__init__()
        self.width = cfg.hidden_size * cfg.spatial_merge_size**2
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=LAYER_NORM_EPS, **factory)
        self.linear_fc1 = nn.Linear(self.width, self.width, **factory)
        self.linear_fc2 = nn.Linear(self.width, cfg.out_hidden_size, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x).reshape(-1, self.width)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionModel(nn.Module):
    """`model.visual`: see the module docstring. `forward(pixel_values, grids)` with grids a
    list of (t, h, w) patch grids, one per image, in the order of `pixel_values`' rows."""

    def __init__(self, cfg: VisionConfig, dtype=None, device=None) -> None:
        super().__init__()
        factory = {"dtype": dtype, "device": device}
        self.config = cfg
        self.patch_embed = PatchEmbed(cfg, factory)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size, **factory)
        self.blocks = nn.ModuleList(VisionBlock(cfg, factory) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, factory)
        self.register_buffer("inv_freq", torch.empty(0), persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        """(Re)computes the rotary inv_freq [head_dim / 4] fp32 on the weights' device."""
        dim = self.config.head_dim // 2
        device = self.pos_embed.weight.device
        device = "cpu" if device.type == "meta" else device
        exponents = torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim
        self.inv_freq = 1.0 / (self.config.rope_theta**exponents)

    @torch.no_grad()
    def forward(self, pixel_values: torch.Tensor, grids: list[tuple[int, int, int]]):
        """pixel_values [N, C*T*P*P] -> [N / merge^2, out_hidden_size] in the weights' dtype."""
        merge = self.config.spatial_merge_size
        x = self.patch_embed(pixel_values)
        x = x + self._pos_embeds(grids).to(x.dtype)
        pos = rotary_position_ids(grids, merge, self.inv_freq.device)
        cos, sin = rotary_cos_sin(pos, self.inv_freq)
        lengths = [h * w for t, h, w in grids for _ in range(t)]
        for block in self.blocks:
            x = block(x, cos, sin, lengths)
        return self.merger(x)

    def _pos_embeds(self, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """[N, hidden] fp32 (or wider): the learned grid resampled to every patch."""
        side = int(round(self.config.num_position_embeddings**0.5))
        device = self.pos_embed.weight.device
        idx, weights = zip(
            *(pos_embed_taps(g, side, self.config.spatial_merge_size, device) for g in grids),
            strict=True,
        )
        idx, weights = torch.cat(idx), torch.cat(weights)
        return (self.pos_embed(idx) * weights[:, :, None]).sum(1)


def _axis_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear taps [n, 2] into a `side`-long axis and their weights for `index` on an axis of
    `size` (align_corners: the ends map to 0 and side - 1; taps past the end are clamped)."""
    src = index.float() * (side - 1) / max(size - 1, 1)
    floor = torch.floor(src)
    offsets = torch.arange(2, device=index.device)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def pos_embed_taps(
    grid: tuple[int, int, int], side: int, merge: int, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices [t*h*w, 4] into the flat side x side grid, weights [t*h*w, 4] fp32) of each
    patch of an image, patches in merge-block order."""
    rows, cols = block_order(grid, merge, device)
    h_taps, h_w = _axis_taps(rows, grid[1], side)
    w_taps, w_w = _axis_taps(cols, grid[2], side)
    idx = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
    return idx, (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)


def block_order(
    grid: tuple[int, int, int], merge: int, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) [t*h*w] of each patch of an image of grid (t, h, w), in the processor's order:
    frame, merged row, merged col, row within the block, col within the block."""
    t, h, w = grid
    shape = (h // merge, w // merge, merge, merge)
    r = torch.arange(h, device=device).reshape(h // merge, 1, merge, 1).expand(shape)
    c = torch.arange(w, device=device).reshape(1, w // merge, 1, merge).expand(shape)
    return r.reshape(-1).repeat(t), c.reshape(-1).repeat(t)


def rotary_position_ids(grids: list[tuple[int, int, int]], merge: int, device=None) -> torch.Tensor:
    """[N, 2] (row, col) of every patch of `grids`, in merge-block order."""
    return torch.cat([torch.stack(block_order(g, merge, device), dim=-1) for g in grids])


def rotary_cos_sin(pos: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [N, 4 F] fp32 of positions [N, 2] (row, col) and inv_freq [F]: per head, the row's
    F angles, then the col's, the whole repeated (NeoX halves)."""
    freqs = pos[..., None].float() * inv_freq  # [N, 2, F]
    angles = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def add_vision_tower(model: nn.Module, cfg: VisionConfig, dtype=None, device=None) -> VisionModel:
    """Give the text model `model` (`Qwen35ForCausalLM`) an (uninitialised) tower as
    `model.model.visual`: its parameters are then named as the checkpoint's `model.visual.*`."""
    tower = VisionModel(cfg, dtype=dtype, device=device)
    model.model.visual = tower
    return tower
