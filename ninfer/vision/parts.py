"""Content parts that carry media: which kind each one is, the refusal when the model cannot
take it, and the normalised form the rest of the engine consumes.

A part is media when its `type` names a medium (OpenAI chat `image_url` / `input_audio` /
`file`, OpenAI responses `input_image` / `input_file`, Anthropic `image` / `document`, the
Hugging Face `image` / `video`), or when it has a key the official Qwen chat template renders
as a vision placeholder whatever the type (`image`, `image_url`, `video`). Every such part is
refused with a ValueError naming it (`messages[1].content[0]: ...`) unless the model has a
vision tower and the medium is an image.

An image part, normalised, is `{"type": "image", "image": <RGB PIL image>}` in the same place
(its `cache_control` kept): the official template renders it as
`<|vision_start|><|image_pad|><|vision_end|>`. Where the image comes from, by part:

    image_url      {"image_url": {"url": U, "detail": ...}} or {"image_url": U}  (detail ignored)
    input_image    {"image_url": U}  (OpenAI responses; a file_id is refused)
    image          {"image": X} (X: anything `media.decode_image` reads), {"source": S}
                   (Anthropic), or transformers' {"url": U} / {"path": P} / {"base64": B}

This module knows nothing about the model: callers say whether it takes images.
"""

from __future__ import annotations

from typing import Any

from PIL import Image

from ninfer.vision.media import DEFAULT_LIMITS, MediaLimits, decode_image

# a part's `type` -> the medium it carries
PART_MEDIA: dict[str, str] = {
    "image": "image",
    "image_url": "image",
    "input_image": "image",
    "video": "video",
    "video_url": "video",
    "input_video": "video",
    "audio": "audio",
    "audio_url": "audio",
    "input_audio": "audio",
    "file": "file",
    "input_file": "file",
    "document": "document",
}
# keys the official template renders as a vision placeholder whatever the part's type
_PLACEHOLDER_KEYS: dict[str, str] = {"image": "image", "image_url": "image", "video": "video"}
IMAGE_PAD = "<|image_pad|>"  # the placeholder token the template writes for each image


def media_kind(part: Any) -> str | None:
    """The medium a content part carries ("image", "video", "audio", "file", "document"), or
    None for text and anything that is not a dict."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if isinstance(kind, str) and kind in PART_MEDIA:
        return PART_MEDIA[kind]
    return next((m for key, m in _PLACEHOLDER_KEYS.items() if key in part), None)


def refusal(kind: str, where: str, supports_images: bool) -> str | None:
    """Why a part of medium `kind` at `where` cannot be served (None: it can: an image, with a
    vision tower)."""
    if kind in ("image", "video") and not supports_images:
        return f"{where}: {kind} input needs a checkpoint with a vision tower (this model has none)"
    if kind == "image":
        return None
    takes = "text and images" if supports_images else "text only"
    return f"{where}: {kind} input is not supported (this model takes {takes})"


def image_source(part: dict, where: str) -> Any:
    """What an image part holds for `media.decode_image` (see the module docstring)."""
    if "image" in part:
        return part["image"]
    if "image_url" in part:
        url = part["image_url"]
        return url.get("url") if isinstance(url, dict) else url
    if "source" in part:
        return part["source"]
    if "base64" in part:
        return {"type": "base64", "media_type": "image/*", "data": part["base64"]}
    for key in ("url", "path"):
        if key in part:
            return part[key]
    if "file_id" in part:
        raise ValueError(f"{where}: images by file_id are not supported (send the image)")
    raise ValueError(f"{where}: the image part holds no image (image_url, image or source)")


def image_part(
    part: dict, where: str, limits: MediaLimits = DEFAULT_LIMITS, *, local_files: bool = False
) -> dict:
    """An image part normalised: `{"type": "image", "image": <RGB PIL image>}` (its
    cache_control kept); ValueError naming `where` when the image cannot be read."""
    out: dict[str, Any] = {"type": "image"}
    out["image"] = decode_image(image_source(part, where), where, limits, local_files=local_files)
    if part.get("cache_control"):
        out["cache_control"] = part["cache_control"]
    return out


def normalise_messages(
    messages: list,
    supports_images: bool,
    limits: MediaLimits = DEFAULT_LIMITS,
    *,
    local_files: bool = False,
) -> list:
    """A copy of `messages` whose list contents hold text parts and normalised image parts:
    a string part becomes a text part (the template would test it for the substring "image"),
    a media part is refused naming it (`refusal`) or, an image the model takes, decoded
    (`image_part`). Other messages and parts are kept as they are; the input is not mutated."""
    out = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = media_kind(part)
            if kind is None:
                parts.append({"type": "text", "text": part} if isinstance(part, str) else part)
                continue
            why = refusal(kind, where, supports_images)
            if why is not None:
                raise ValueError(why)
            parts.append(image_part(part, where, limits, local_files=local_files))
        out.append({**message, "content": parts})
    return out


def split_images(messages: list) -> tuple[list, list[Image.Image]]:
    """(the messages with each normalised image part's pixels left out, the images in the
    order the template renders their placeholders: message by message, part by part). The
    template needs only the part's type; its sandbox then never copies the pixels."""
    images: list[Image.Image] = []
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or not any(_is_image(p) for p in content):
            out.append(message)
            continue
        parts = []
        for part in content:
            if _is_image(part):
                images.append(part["image"])
                part = {k: v for k, v in part.items() if k != "image"}
            parts.append(part)
        out.append({**message, "content": parts})
    return out, images


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and isinstance(part.get("image"), Image.Image)


def check_placeholders(token_ids: list[int], pad_id: int | None, n_images: int) -> None:
    """ValueError unless the rendered ids hold one `IMAGE_PAD` per image: a template that
    drops an image part (or text that spells the token) would pair pixels with the wrong
    placeholder, or answer without the picture."""
    found = 0 if pad_id is None else sum(1 for t in token_ids if t == pad_id)
    if found != n_images:
        raise ValueError(
            f"messages: the chat template wrote {found} {IMAGE_PAD} placeholders for "
            f"{n_images} images"
        )
