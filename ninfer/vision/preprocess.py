"""Qwen3.5 image preprocessing: an RGB image -> the vision tower's patches, as transformers'
`Qwen2VLImageProcessor` (the processor Qwen3.5 checkpoints name; its default torchvision
backend) does with the checkpoint's `preprocessor_config.json`:

    1. smart resize: height and width to multiples of patch_size * merge_size, nearest the
       original aspect ratio, the area within [min_pixels, max_pixels]
    2. resize the uint8 pixels (antialiased bicubic, `resample` 3, or bilinear, 2: torch's
       uint8 kernel, which torchvision calls on the CPU), rounded to uint8
    3. (x - mean / rescale_factor) / (std / rescale_factor) in fp32 (rescale and normalise fused,
       as that backend does)
    4. patchify: [t*h*w, C * temporal_patch_size * P * P] (each patch repeated over the
       temporal patch), patches in merge-block order (merged row, merged col, row, col)

The slow PIL backend (`Qwen2VLImageProcessorPil`) resizes with Pillow, whose uint8 rounding
between its two passes differs from torch's by at most a few levels on some pixels.

`ProcessedImage.digest` names the image by its resized pixels, its grid and the processing
parameters: the same picture sent as a URL, a file or base64 gets the same digest. Knows
nothing about decoding (the image arrives as a PIL image), the model or the cache.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

# transformers' Qwen2VLImageProcessor defaults, for fields a preprocessor_config.json omits
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_RESAMPLE = {2: "bilinear", 3: "bicubic"}  # PIL codes -> torch modes
MAX_ASPECT = 200


@dataclass(frozen=True, slots=True)
class ImageProcessorConfig:
    """The fields of a `preprocessor_config.json` that decide the tower's input."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True

    @property
    def factor(self) -> int:
        """What resized sides are multiples of: patch_size * merge_size."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ImageProcessorConfig:
        """From a preprocessor_config.json's object: `size` {shortest_edge, longest_edge}
        (pixel counts), overridden by `min_pixels` / `max_pixels` where given."""
        size = raw.get("size") or {}
        kept = {k: raw[k] for k in _SCALARS if raw.get(k) is not None}
        for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            value = raw.get(key, size.get(edge))
            if value is not None:
                kept[key] = value
        for key in ("image_mean", "image_std"):
            if raw.get(key) is not None:
                kept[key] = tuple(float(x) for x in raw[key])
        cfg = cls(**kept)
        cfg.check()
        return cfg

    @classmethod
    def from_file(cls, path: str | Path) -> ImageProcessorConfig:
        """From `path`/preprocessor_config.json (or the file `path`)."""
        path = Path(path)
        path = path / "preprocessor_config.json" if path.is_dir() else path
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        try:
            return cls.from_dict(raw)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from None

    def check(self) -> None:
        """ValueError naming a field the processor cannot take."""
        if self.resample not in _RESAMPLE:
            raise ValueError(f"resample {self.resample} is not supported (2 or 3)")
        if min(self.patch_size, self.temporal_patch_size, self.merge_size) < 1:
            raise ValueError("patch_size, temporal_patch_size and merge_size must be >= 1")
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError("need 0 < min_pixels <= max_pixels")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or 0 in self.image_std:
            raise ValueError("image_mean and image_std need 3 values, std non-zero")


_SCALARS = ("patch_size", "temporal_patch_size", "merge_size", "rescale_factor", "resample")
_SCALARS += ("do_resize", "do_rescale", "do_normalize")


class ProcessedImage(NamedTuple):
    """One image as the tower takes it."""

    pixel_values: torch.Tensor  # [t*h*w, C * temporal_patch_size * P * P] fp32
    grid: tuple[int, int, int]  # (t, h, w) patches
    num_tokens: int  # its pad tokens in the prompt: t*h*w / merge^2
    digest: bytes  # 32 bytes: resized pixels, grid, processing parameters


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor` with the area in [min_pixels,
    max_pixels], the aspect ratio kept as nearly as possible (transformers' `smart_resize`)."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(
            f"image aspect ratio {max(height, width) / min(height, width):.1f} is over {MAX_ASPECT}"
        )
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def to_rgb(image):
    """`image` (PIL) as RGB, any transparency composited onto white (as transformers does)."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        image = image.convert("RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def resized_pixels(image, cfg: ImageProcessorConfig) -> torch.Tensor:
    """The RGB uint8 pixels [3, h, w] of PIL `image` after step 1-2 of the module docstring."""
    pixels = torch.from_numpy(np.array(to_rgb(image))).permute(2, 0, 1)
    height, width = pixels.shape[1:]
    if not cfg.do_resize:
        return pixels
    size = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    if size == (height, width):
        return pixels
    mode = _RESAMPLE[cfg.resample]
    return F.interpolate(pixels[None], size, mode=mode, align_corners=False, antialias=True)[0]


def normalise(pixels: torch.Tensor, cfg: ImageProcessorConfig) -> torch.Tensor:
    """uint8 [3, h, w] -> fp32 (step 3 of the module docstring)."""
    x = pixels.float()
    mean = torch.tensor(cfg.image_mean)[:, None, None]
    std = torch.tensor(cfg.image_std)[:, None, None]
    if cfg.do_rescale and cfg.do_normalize:
        return (x - mean * (1.0 / cfg.rescale_factor)) / (std * (1.0 / cfg.rescale_factor))
    if cfg.do_normalize:
        return (x - mean) / std
    return x * cfg.rescale_factor if cfg.do_rescale else x


def patchify(x: torch.Tensor, cfg: ImageProcessorConfig) -> torch.Tensor:
    """[C, H, W] -> [H/P * W/P, C * T * P * P] in merge-block order (step 4)."""
    c, height, width = x.shape
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = height // p, width // p
    x = x.reshape(c, gh // m, m, p, gw // m, m, p).permute(1, 4, 2, 5, 0, 3, 6)
    x = x.unsqueeze(5).expand(*x.shape[:5], t, p, p)
    return x.reshape(gh * gw, c * t * p * p)


def process_image(image, cfg: ImageProcessorConfig) -> ProcessedImage:
    """A PIL image (RGB, or converted as transformers does) as the tower's input."""
    pixels = resized_pixels(image, cfg)
    height, width = pixels.shape[1:]
    if height % cfg.factor or width % cfg.factor:
        raise ValueError(f"image {width}x{height}: sides not multiples of {cfg.factor}")
    grid = (1, height // cfg.patch_size, width // cfg.patch_size)
    values = patchify(normalise(pixels, cfg), cfg)
    return ProcessedImage(
        values, grid, values.shape[0] // cfg.merge_size**2, digest(pixels, grid, cfg)
    )


def digest(pixels: torch.Tensor, grid: tuple[int, int, int], cfg: ImageProcessorConfig) -> bytes:
    """32-byte BLAKE2b of the resized uint8 pixels [3, h, w], the grid and `cfg`."""
    h = hashlib.blake2b(digest_size=32, person=b"ninfer-image")
    h.update(json.dumps([list(grid), asdict(cfg)], sort_keys=True).encode())
    h.update(pixels.contiguous().numpy().tobytes())
    return h.digest()
