"""Content parts that carry media: which kind each one is, and the refusal when the model
cannot take it.

A part is media when its `type` names a medium (OpenAI chat `image_url` / `input_audio` /
`file`, OpenAI responses `input_image` / `input_file`, Anthropic `image` / `document`, the
Hugging Face `image` / `video`), or when it has a key the official Qwen chat template renders
as a vision placeholder whatever the type (`image`, `image_url`, `video`). Every such part is
refused with a ValueError naming it (`messages[1].content[0]: ...`) unless the model has a
vision tower and the medium is an image. The module knows nothing about the model: callers
say whether it takes images.
"""

from __future__ import annotations

from typing import Any

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


def check_media(messages: list, supports_images: bool) -> None:
    """ValueError naming the first content part (`messages[i].content[j]`) whose medium the
    model cannot take; mutates nothing."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = media_kind(part)
            why = (
                None
                if kind is None
                else refusal(kind, f"messages[{i}].content[{j}]", supports_images)
            )
            if why is not None:
                raise ValueError(why)
