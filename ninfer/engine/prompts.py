"""Normalise the public prompt forms (spec/API.md) into token ids plus tap hints.

Accepted: a string, a list of token ids, `{"prompt": str}` or `{"prompt_token_ids": [...]}`
(either with an optional `"cache_breakpoints": [positions]`), or a chat conversation (a list of
message dicts, rendered with the checkpoint's template). Validation raises ValueError naming the
field; the caller decides whether that fails the call (one prompt) or one output (a batch).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from ninfer.engine.request import PromptHints


@dataclass(slots=True)
class PromptInput:
    token_ids: list[int]
    hints: PromptHints
    # its images (`engine.images.PromptImages`: pixels, spans, positions; `token_ids` holds
    # each image's pad tokens), or None
    images: Any = None


def is_conversation(obj: object) -> bool:
    """One conversation = a non-empty list of message dicts with a "role"."""
    return (
        isinstance(obj, list)
        and bool(obj)
        and all(isinstance(m, dict) and "role" in m for m in obj)
    )


def is_single_prompt(obj: object) -> bool:
    """True for one prompt (str, dict, or a flat list of ints), False for a list of prompts."""
    if isinstance(obj, (str, dict)):
        return True
    return isinstance(obj, list) and bool(obj) and all(isinstance(t, int) for t in obj)


def from_prompt(obj: object, tokenizer) -> PromptInput:
    """One prompt in any of the raw forms."""
    breakpoints: list[int] = []
    if isinstance(obj, dict):
        unknown = set(obj) - {"prompt", "prompt_token_ids", "cache_breakpoints"}
        if unknown:
            raise ValueError(f"prompt: unknown keys {sorted(unknown)}")
        if ("prompt" in obj) == ("prompt_token_ids" in obj):
            raise ValueError("prompt: give exactly one of 'prompt' and 'prompt_token_ids'")
        breakpoints = list(obj.get("cache_breakpoints") or [])
        obj = obj["prompt"] if "prompt" in obj else obj["prompt_token_ids"]
    if isinstance(obj, str):
        if tokenizer is None:
            raise ValueError("prompt: text needs a tokenizer; pass prompt_token_ids")
        ids = tokenizer.encode(obj)
    elif isinstance(obj, (list, tuple)):
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in obj):
            raise ValueError("prompt_token_ids: must be a list of integers")
        ids = list(obj)
    else:
        raise ValueError(f"prompt: unsupported type {type(obj).__name__}")
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in breakpoints):
        raise ValueError("cache_breakpoints: must be a list of integer token positions")
    return PromptInput(ids, PromptHints(explicit=sorted(set(breakpoints))))


def validate(
    prompt: PromptInput, vocab_size: int, max_model_len: int, vision_ids: Collection[int] = ()
) -> None:
    """Raise ValueError naming the field when the prompt cannot be served. `vision_ids`: the
    image pad / vision token ids, which only a prompt with images may hold."""
    ids = prompt.token_ids
    if not ids:
        raise ValueError("prompt: empty prompt (0 tokens)")
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"prompt_token_ids: token id {bad} is outside the vocabulary [0, {vocab_size})"
        )
    if prompt.images is None and vision_ids and not set(vision_ids).isdisjoint(ids):
        _refuse_vision_tokens(ids, frozenset(vision_ids))
    if len(ids) > max_model_len:
        raise ValueError(f"prompt: {len(ids)} tokens is longer than max_model_len={max_model_len}")
    n = len(ids)
    bad_bp = [b for b in prompt.hints.explicit if not 0 < b <= n]
    if bad_bp:
        raise ValueError(f"cache_breakpoints: positions {bad_bp} are outside (0, {n}]")


def _refuse_vision_tokens(ids: list[int], vision_ids: frozenset[int]) -> None:
    """ValueError naming the first vision placeholder token of a prompt without images (the
    model would read a pad's embedding as a picture)."""
    for i, tok in enumerate(ids):
        if tok in vision_ids:
            raise ValueError(
                f"prompt: token {i} (id {tok}) is a vision placeholder, but the prompt carries no "
                "image"
            )
