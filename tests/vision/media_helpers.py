"""Small images built in memory for the vision input tests."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
from PIL import Image

WHERE = "messages[1].content[0]"


def pattern(width: int = 6, height: int = 4) -> Image.Image:
    """An RGB image whose every pixel differs (so a flip, a crop or a swap shows)."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 40, y * 60, (x + y) * 20], axis=-1).astype(np.uint8)
    return Image.fromarray(rgb)


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


def anthropic_source(data: bytes, media_type: str = "image/png") -> dict:
    return {"type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode()}


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares `width` x `height` 8-bit gray pixels and holds none of them: what a
    decompression bomb looks like before it is decoded."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image)
