"""Anthropic's rules for `cache_control` breakpoints, checked before a request is rendered.

Where a breakpoint may sit, in prompt order (the order they are counted in): a tool, a system
block, a message's content block (a tool_result's own blocks too), the message itself (ninfer's
extension for string content) and the request's top level (automatic caching: the last
message). Each must be `{"type": "ephemeral"}` with an optional `ttl` of "5m" or "1h"; a "1h"
breakpoint may not follow a "5m" one; none sits on an empty text block or a thinking block; at
most four per request. A violation is a 400 naming the field path as Anthropic writes it
(`messages.2.content.1.cache_control`). `null` is the field left out.

What a breakpoint does here is the conversion's business (`anthropic_api`): it marks the end of
its turn as a client breakpoint, whatever its ttl (the cache keeps what its policy keeps).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ninfer.server.errors import ApiError

MAX_BREAKPOINTS = 4
TTLS = ("5m", "1h")
_UNCACHEABLE = ("thinking", "redacted_thinking")


def check_cache_control(tools: Any, system: Any, messages: Any, top_level: Any = None) -> None:
    """Raise ApiError naming the first breakpoint that breaks a rule."""
    short_ttl_at = None
    marked = _breakpoints(tools, system, messages, top_level)
    for count, (at, cc, holder) in enumerate(marked, start=1):
        ttl = _checked(at, cc)
        _check_placement(at, holder)
        if count > MAX_BREAKPOINTS:
            raise ApiError(
                f"{at}: a maximum of {MAX_BREAKPOINTS} blocks with cache_control may be "
                f"provided (this is breakpoint {count})",
                at,
            )
        if ttl == "5m" and short_ttl_at is None:
            short_ttl_at = at
        elif ttl == "1h" and short_ttl_at is not None:
            raise ApiError(
                f"{at}.ttl: a ttl='1h' breakpoint must not come after a ttl='5m' one "
                f"({short_ttl_at})",
                f"{at}.ttl",
            )


def _breakpoints(tools, system, messages, top_level) -> Iterator[tuple[str, Any, Any]]:
    """(the cache_control's path, its value, the dict holding it) of every breakpoint, in
    prompt order."""
    for j, tool in enumerate(tools if isinstance(tools, list) else []):
        yield from _marked(f"tools.{j}", tool)
    for j, block in enumerate(system if isinstance(system, list) else []):
        yield from _marked(f"system.{j}", block)
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        for j, block in enumerate(content if isinstance(content, list) else []):
            yield from _marked(f"messages.{i}.content.{j}", block)
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            inner = block.get("content")
            if isinstance(inner, list):
                for k, part in enumerate(inner):
                    yield from _marked(f"messages.{i}.content.{j}.content.{k}", part)
        yield from _marked(f"messages.{i}", m)
    if top_level is not None:
        yield "cache_control", top_level, None


def _marked(path: str, holder) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(holder, dict) and holder.get("cache_control") is not None:
        yield f"{path}.cache_control", holder["cache_control"], holder


def _checked(at: str, cc) -> str:
    """The breakpoint's ttl ("5m" when left out); ApiError on anything but Anthropic's form."""
    if not isinstance(cc, dict):
        raise ApiError(f"{at}: must be an object like {{'type': 'ephemeral'}}", at)
    if cc.get("type") != "ephemeral":
        raise ApiError(f"{at}.type: must be 'ephemeral', got {cc.get('type')!r}", f"{at}.type")
    extra = sorted(str(k) for k in cc if k not in ("type", "ttl"))
    if extra:
        raise ApiError(f"{at}.{extra[0]}: extra inputs are not permitted", f"{at}.{extra[0]}")
    ttl = cc.get("ttl", "5m")
    if ttl not in TTLS:
        raise ApiError(f"{at}.ttl: must be '5m' or '1h', got {ttl!r}", f"{at}.ttl")
    return ttl


def _check_placement(at: str, holder) -> None:
    if holder is None:
        return
    kind = holder.get("type")
    if kind in _UNCACHEABLE:
        raise ApiError(f"{at}: cache_control cannot be set on a {kind} block", at)
    if kind == "text" and holder.get("text") in ("", None):
        raise ApiError(f"{at}: cache_control cannot be set for empty text blocks", at)
    if "role" in holder and holder.get("content") in ("", [], None):
        raise ApiError(f"{at}: cache_control cannot be set on an empty message", at)
