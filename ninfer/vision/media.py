"""One image, from what a user sends, decoded to an RGB `PIL.Image` within size limits.

Sources (`decode_image`): a `PIL.Image.Image`; encoded bytes; a `data:image/...;base64,` URL;
an Anthropic source `{"type": "base64", "media_type": "image/...", "data": ...}`; and, where
`local_files` allows it (`LLM.chat`, never the server), a filesystem path, `os.PathLike` or
`file://` URL. http(s) URLs are refused: nothing is fetched on a sender's behalf.

Decoding: PNG, JPEG (MPO too), WEBP, GIF and BMP only (the other Pillow plugins are never
tried). Encoded bytes are capped before they are read or base64-decoded; the pixel count is
checked from the header before any pixel is decoded (Pillow's own `MAX_IMAGE_PIXELS` check is
left as it is: it fires only above ours, and is reported the same way). An animated image
gives its first frame, as transformers' `load_image` and vLLM do; later frames are never
decoded. The EXIF orientation is applied (`ImageOps.exif_transpose`, as `load_image`).

Modes become RGB as transformers' `convert_to_rgb` does for the Qwen2-VL processor: an image
with an alpha band or a transparency key is composited onto white, any other mode converted.
16-bit grayscale (`I;16*`, and `I` holding 16-bit values) is first scaled to 8 bits (its top
byte); transformers' conversion would clip every value above 255 to white.

Every failure is a ValueError whose text starts with `where` (the content part, e.g.
`messages[1].content[0]`); hostile bytes give nothing else. This module knows nothing about
messages, models or the processor's resizing.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

MAX_IMAGE_BYTES = 20 << 20  # an encoded image (OpenAI's per-image limit)
MAX_IMAGE_PIXELS = 32 << 20  # a decoded image: 8192 x 4096, 128 MiB as RGBA
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # the Pillow plugins tried
_DECODED_FORMATS = frozenset(FORMATS) | {"MPO"}  # a multi-picture JPEG opens as MPO
_ORIENTATION = 0x0112  # the EXIF orientation tag


@dataclass(frozen=True, slots=True)
class MediaLimits:
    """What one image may cost: encoded bytes (before base64 decoding too) and pixels."""

    max_bytes: int = MAX_IMAGE_BYTES
    max_pixels: int = MAX_IMAGE_PIXELS


DEFAULT_LIMITS = MediaLimits()


def decode_image(
    source: Any, where: str, limits: MediaLimits = DEFAULT_LIMITS, *, local_files: bool = False
) -> Image.Image:
    """`source` (see the module docstring) as a loaded RGB image, upright; ValueError naming
    `where` otherwise. `local_files`: paths and `file://` URLs may be read. A PIL image passed
    in is not modified."""
    if isinstance(source, Image.Image):
        image = _finish(source, where, limits)
        return image.copy() if image is source else image  # never the caller's object
    data = _encoded(source, where, limits, local_files)
    if len(data) > limits.max_bytes:
        raise ValueError(f"{where}: the image is {len(data)} bytes, over {limits.max_bytes}")
    if not data:
        raise ValueError(f"{where}: the image is empty (0 bytes)")
    return _finish(_open(data, where), where, limits)


def _encoded(source: Any, where: str, limits: MediaLimits, local_files: bool) -> bytes:
    """The encoded image bytes a source holds or names."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, dict):
        return _from_block(source, where, limits)
    if isinstance(source, str):
        return _from_string(source, where, limits, local_files)
    if isinstance(source, os.PathLike):
        if not local_files:
            raise ValueError(f"{where}: image files are not read here (send the image's bytes)")
        return _read_file(Path(source), where, limits)
    raise ValueError(f"{where}: cannot read an image from a {type(source).__name__}")


def _from_string(text: str, where: str, limits: MediaLimits, local_files: bool) -> bytes:
    scheme = text[:8].lower()
    if scheme.startswith("data:"):
        return _from_data_url(text, where, limits)
    if scheme.startswith(("http://", "https://")):
        raise ValueError(
            f"{where}: remote image URLs are not fetched (send a data: URL or base64 image)"
        )
    if not local_files:
        raise ValueError(f"{where}: an image must be a data: URL here (files are not read)")
    path = text[len("file://") :] if scheme.startswith("file://") else text
    return _read_file(Path(path), where, limits)


def _from_data_url(url: str, where: str, limits: MediaLimits) -> bytes:
    """`data:image/<kind>;base64,<payload>` (RFC 2397); the payload capped before decoding."""
    header, comma, payload = url[len("data:") :].partition(",")
    if not comma:
        raise ValueError(f"{where}: a data: URL needs a comma before its data")
    media_type, *params = header.split(";")
    if not media_type.lower().startswith("image/"):
        raise ValueError(
            f"{where}: the data: URL holds {_short(media_type or 'text')}, not an image"
        )
    if "base64" not in (p.strip().lower() for p in params):
        raise ValueError(f"{where}: only base64 data: URLs are read (`;base64,`)")
    return _base64(payload, where, limits)


def _from_block(block: dict, where: str, limits: MediaLimits) -> bytes:
    """An Anthropic image source: `base64` is read; `url` and `file` are refused."""
    kind = block.get("type")
    if kind == "url":
        raise ValueError(
            f"{where}: remote image URLs are not fetched (send a data: URL or base64 image)"
        )
    if kind != "base64":
        raise ValueError(
            f"{where}: image source type {_short(kind)} is not supported (base64 only)"
        )
    media_type = block.get("media_type")
    if not isinstance(media_type, str) or not media_type.lower().startswith("image/"):
        raise ValueError(
            f"{where}: source.media_type must be an image type, got {_short(media_type)}"
        )
    data = block.get("data")
    if not isinstance(data, str):
        raise ValueError(f"{where}: source.data must be a base64 string")
    return _base64(data, where, limits)


def _base64(text: str, where: str, limits: MediaLimits) -> bytes:
    """Base64 (line breaks allowed) of at most `limits.max_bytes`, checked before decoding."""
    most = (limits.max_bytes + 2) // 3 * 4
    compact = "".join(text.split()) if len(text) <= 2 * most else text
    if len(compact) > most:
        raise ValueError(f"{where}: the image is over {limits.max_bytes} bytes")
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: the image data is not valid base64") from None


def _read_file(path: Path, where: str, limits: MediaLimits) -> bytes:
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limits.max_bytes:
                raise ValueError(f"{where}: {path} is {size} bytes, over {limits.max_bytes}")
            return f.read(limits.max_bytes + 1)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ValueError(
            f"{where}: cannot read the image file {_short(str(path))} ({reason})"
        ) from None


def _open(data: bytes, where: str) -> Image.Image:
    """A lazily decoded image of an allowed format (its header read, no pixels yet)."""
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as e:  # above Pillow's MAX_IMAGE_PIXELS (and ours)
        raise ValueError(f"{where}: the image has too many pixels ({e})") from None
    except Image.UnidentifiedImageError:
        raise ValueError(
            f"{where}: not an image of a supported format ({', '.join(FORMATS)})"
        ) from None
    except Exception as e:  # noqa: BLE001 - Pillow's header parsers raise many kinds on bad bytes
        raise ValueError(f"{where}: the image cannot be decoded ({type(e).__name__})") from None
    if image.format not in _DECODED_FORMATS:
        raise ValueError(f"{where}: image format {image.format} is not supported")
    return image


def _finish(image: Image.Image, where: str, limits: MediaLimits) -> Image.Image:
    """Size checked, pixels decoded (the first frame), upright, RGB."""
    width, height = image.size
    if width * height > limits.max_pixels:
        raise ValueError(f"{where}: the image is {width}x{height} pixels, over {limits.max_pixels}")
    if width < 1 or height < 1:
        raise ValueError(f"{where}: the image is {width}x{height} pixels (empty)")
    try:
        image.load()
        if image.getexif().get(_ORIENTATION, 1) != 1:
            image = ImageOps.exif_transpose(image)
        return to_rgb(image)
    except Exception as e:  # noqa: BLE001 - Pillow's decoders raise many kinds on bad data
        detail = str(e).splitlines()[0][:120] if str(e) else ""
        raise ValueError(
            f"{where}: the image cannot be decoded ({type(e).__name__}{': ' if detail else ''}"
            f"{detail})"
        ) from None


def _short(value: Any, most: int = 80) -> str:
    """`repr(value)` cut to `most` characters: a sender's text quoted in an error stays short."""
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` in mode RGB: alpha (a band or a transparency key) composited onto white, as
    transformers' `convert_to_rgb`; 16-bit grayscale scaled to 8 bits first. An RGB image is
    returned as it is."""
    if image.mode.startswith("I;16") or image.mode == "I":
        top = np.clip(np.asarray(image).astype(np.int64), 0, 65535) >> 8
        image = Image.fromarray(top.astype(np.uint8))
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")
