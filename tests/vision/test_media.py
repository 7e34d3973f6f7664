"""`ninfer.vision.media.decode_image`: every source and format to the same RGB pixels, modes as
transformers' `convert_to_rgb`, EXIF orientation, the limits, and hostile bytes."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from media_helpers import (
    WHERE,
    anthropic_source,
    data_url,
    encode,
    pattern,
    pixels,
    png_header,
)
from PIL import Image, ImageOps

from ninfer.vision.media import MAX_IMAGE_PIXELS, MediaLimits, decode_image, to_rgb

PNG = encode(pattern(), "PNG")


def _sources(tmp_path: Path) -> dict:
    path = tmp_path / "p.png"
    path.write_bytes(PNG)
    return {
        "str path": str(path),
        "Path": path,
        "file URL": "file://" + str(path),
        "PIL": Image.open(io.BytesIO(PNG)),
        "bytes": PNG,
        "bytearray": bytearray(PNG),
        "memoryview": memoryview(PNG),
        "data URL": data_url(PNG),
        "data URL with line breaks": data_url(PNG)[:40] + "\n" + data_url(PNG)[40:],
        "anthropic base64": anthropic_source(PNG),
    }


def test_every_source_gives_the_same_rgb_pixels(tmp_path):
    want = pixels(pattern())
    for name, source in _sources(tmp_path).items():
        got = decode_image(source, WHERE, local_files=True)
        assert got.mode == "RGB", name
        assert np.array_equal(pixels(got), want), name


LOSSLESS = [
    ("PNG", {}),
    ("WEBP", {"lossless": True}),
    ("BMP", {}),
    ("GIF", {}),  # 24 colours: the palette holds them all
]


@pytest.mark.parametrize("fmt,options", LOSSLESS, ids=[f for f, _ in LOSSLESS])
def test_lossless_formats_decode_exactly(fmt, options):
    got = decode_image(encode(pattern(), fmt, **options), WHERE)
    assert got.mode == "RGB" and np.array_equal(pixels(got), pixels(pattern()))


def test_jpeg_decodes_to_the_picture_within_its_loss():
    smooth = Image.new("RGB", (32, 16), (200, 100, 50))
    got = decode_image(encode(smooth, "JPEG", quality=95), WHERE)
    assert got.size == (32, 16) and got.mode == "RGB"
    assert np.abs(pixels(got).astype(int) - (200, 100, 50)).max() <= 3


def _modes() -> dict[str, Image.Image]:
    rgba = np.zeros((3, 4, 4), np.uint8)
    rgba[..., 0], rgba[..., 3] = 255, [[0, 64, 128, 255]] * 3  # red, from clear to opaque
    gray = pattern().convert("L")
    palette = pattern().convert("P")
    palette.info["transparency"] = 0
    keyed = gray.copy()
    keyed.info["transparency"] = int(np.asarray(gray)[0, 0])
    return {
        "RGBA": Image.fromarray(rgba),
        "LA": Image.fromarray(np.stack([np.asarray(gray)[:3, :4], rgba[..., 3]], axis=-1)),
        "L": gray,
        "L keyed": keyed,
        "P": pattern().convert("P"),
        "P transparent": palette,
        "1": gray.convert("1"),
        "CMYK": pattern().convert("CMYK"),
        "RGB": pattern(),
    }


@pytest.mark.parametrize("mode", list(_modes()))
def test_modes_become_rgb_as_transformers_convert_to_rgb(mode):
    from transformers.image_transforms import convert_to_rgb

    image = _modes()[mode]
    want = convert_to_rgb(image, return_numpy=True)
    assert np.array_equal(pixels(to_rgb(image)), want)
    assert np.array_equal(pixels(decode_image(image, WHERE)), want)


def test_alpha_is_composited_onto_white():
    rgba = Image.new("RGBA", (2, 1), (255, 0, 0, 0))
    rgba.putpixel((1, 0), (255, 0, 0, 255))
    got = pixels(decode_image(encode(rgba, "PNG"), WHERE))
    assert got[0, 0].tolist() == [255, 255, 255] and got[0, 1].tolist() == [255, 0, 0]


def test_16_bit_grayscale_keeps_its_top_byte():
    values = (np.arange(12, dtype=np.uint16).reshape(3, 4) * 5000).astype(np.uint16)
    image = Image.fromarray(values)
    assert image.mode.startswith("I;16")
    got = pixels(decode_image(encode(image, "PNG"), WHERE))
    assert np.array_equal(got[..., 0], (values >> 8).astype(np.uint8))
    assert np.array_equal(got[..., 0], got[..., 2])


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_exif_orientation_is_applied_as_load_image_does(fmt):
    image = pattern(6, 4)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: shown turned 90 degrees clockwise
    options = {"lossless": True} if fmt == "WEBP" else {"quality": 100} if fmt == "JPEG" else {}
    data = encode(image, fmt, exif=exif.tobytes(), **options)
    got = decode_image(data, WHERE)
    assert got.size == (4, 6)
    want = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    assert np.array_equal(pixels(got), pixels(want))
    if fmt != "JPEG":
        assert np.array_equal(pixels(got), pixels(image.transpose(Image.Transpose.ROTATE_270)))


def test_an_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (4, 4), c) for c in ((255, 0, 0), (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    assert Image.open(io.BytesIO(out.getvalue())).n_frames == 2
    got = pixels(decode_image(out.getvalue(), WHERE))
    assert (got == (255, 0, 0)).all()


def test_the_callers_pil_image_is_left_as_it_is():
    image = pattern()
    got = decode_image(image, WHERE)
    assert got is not image and np.array_equal(pixels(got), pixels(pattern()))
    rgba = Image.new("RGBA", (2, 2), (0, 0, 0, 0))
    decode_image(rgba, WHERE)
    assert rgba.mode == "RGBA" and rgba.getpixel((0, 0)) == (0, 0, 0, 0)


def _refused(source, needle: str, **kwargs) -> None:
    """decode_image raises a ValueError that names the part first and says `needle`."""
    with pytest.raises(ValueError) as e:
        decode_image(source, WHERE, **kwargs)
    assert str(e.value).startswith(WHERE + ": ") and needle in str(e.value), str(e.value)


def test_encoded_bytes_are_capped_before_they_are_decoded(tmp_path):
    limits = MediaLimits(max_bytes=len(PNG) - 1)
    _refused(PNG, "bytes, over", limits=limits)
    _refused(anthropic_source(PNG), "over", limits=limits)
    _refused(data_url(PNG), "over", limits=limits)
    path = tmp_path / "big.png"
    path.write_bytes(PNG)
    _refused(path, "bytes, over", limits=limits, local_files=True)
    _refused("data:image/png;base64," + "!" * (1 << 20), "over", limits=MediaLimits(max_bytes=10))
    assert decode_image(PNG, WHERE, MediaLimits(max_bytes=len(PNG))).size == (6, 4)


def test_pixels_are_capped_from_the_header_before_any_is_decoded():
    _refused(png_header(8192, 4097), f"8192x4097 pixels, over {MAX_IMAGE_PIXELS}")
    _refused(png_header(20000, 20000), "too many pixels")  # past Pillow's own bomb check
    _refused(pattern(6, 4), "6x4 pixels, over 23", limits=MediaLimits(max_pixels=23))
    assert decode_image(pattern(6, 4), WHERE, MediaLimits(max_pixels=24)).size == (6, 4)


def test_unsupported_and_corrupt_images_are_refused():
    _refused(encode(pattern(), "TIFF"), "not an image of a supported format")
    _refused(encode(pattern(), "ICO"), "not an image of a supported format")
    _refused(b"hello, world", "not an image of a supported format")
    _refused(b"", "empty")
    _refused(PNG[: len(PNG) // 2], "cannot be decoded")
    _refused(png_header(4, 4), "cannot be decoded")  # a header with no pixel data


def test_sources_that_are_not_read_are_refused(tmp_path):
    path = tmp_path / "p.png"
    path.write_bytes(PNG)
    _refused("https://example.com/cat.png", "remote image URLs are not fetched")
    _refused("http://127.0.0.1/cat.png", "remote image URLs are not fetched", local_files=True)
    _refused({"type": "url", "url": "https://example.com/a.png"}, "not fetched")
    _refused({"type": "file", "file_id": "f"}, "source type 'file' is not supported")
    _refused(str(path), "must be a data: URL")
    _refused("file://" + str(path), "must be a data: URL")
    _refused(path, "files are not read")
    _refused(str(tmp_path / "missing.png"), "cannot read the image file", local_files=True)
    _refused(str(tmp_path), "cannot read the image file", local_files=True)
    _refused(12, "cannot read an image from a int")


def test_bad_data_urls_and_base64_blocks_are_refused():
    _refused("data:text/plain;base64,aGk=", "holds 'text/plain', not an image")
    _refused("data:,hello", "not an image")
    _refused("data:image/png,%89PNG", "only base64 data: URLs")
    _refused("data:image/png;base64", "needs a comma")
    _refused("data:image/png;base64,@@@@", "not valid base64")
    _refused({"type": "base64", "media_type": "text/plain", "data": "aGk="}, "media_type")
    _refused({"type": "base64", "media_type": "image/png", "data": 5}, "source.data")
    _refused(data_url(encode(pattern(), "TIFF"), "image/tiff"), "supported format")


def test_what_a_sender_wrote_is_quoted_short():
    for source in ("data:" + "x" * 100_000 + ";base64,AA", "y" * 100_000):
        with pytest.raises(ValueError) as e:
            decode_image(source, WHERE, local_files=True)
        assert len(str(e.value)) < 200 and "..." in str(e.value)


def _mutated(data: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
    raw = bytearray(data)
    for position, value in edits:
        raw[position % len(raw)] = value
    return bytes(raw[: max(1, len(raw) - cut)])


def _decodes_or_names_the_part(data: bytes) -> None:
    try:
        image = decode_image(data, WHERE)
    except ValueError as e:
        assert str(e).startswith(WHERE + ": "), str(e)
    else:
        assert image.mode == "RGB" and image.width * image.height <= MAX_IMAGE_PIXELS


_VALID = [
    encode(pattern(9, 7), "PNG"),
    encode(pattern(9, 7), "JPEG"),
    encode(pattern(9, 7), "WEBP"),
    encode(pattern(9, 7), "GIF"),
    encode(pattern(9, 7), "BMP"),
    encode(Image.new("RGBA", (5, 5), (1, 2, 3, 4)), "PNG"),
]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_any_bytes_decode_or_give_a_value_error_naming_the_part(data):
    _decodes_or_names_the_part(data)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(_VALID),
    st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 255)), max_size=8),
    st.integers(0, 64),
)
def test_damaged_images_decode_or_give_a_value_error_naming_the_part(valid, edits, cut):
    _decodes_or_names_the_part(_mutated(valid, edits, cut))
