"""Anthropic Messages wire format: request model, block conversion, responses and stream events.

`cache_control` on a system block, a message's content block (a tool_result's blocks too) or
the message marks the end of that turn as a client breakpoint; on a tool it marks the end of
the tools/system turn; at the request's top level it marks the last message. It is checked as
Anthropic checks it (`check_cache_control`). Usage splits the prompt as Anthropic does:
`input_tokens + cache_read_input_tokens + cache_creation_input_tokens` is the whole prompt.
A stream's `message_start` carries that split as the request's first token fixes it (the same
figures as its final `message_delta`); `stop_sequence` names the stop string that ended a reply.
`thinking: {"type": "disabled"}` turns Qwen's thinking off, `{"type": "enabled"}` on; left out,
the template's default holds (`chat_template_kwargs` may set it too). Its `budget_tokens`
(checked as Anthropic checks it: an integer >= 1024, below `max_tokens`) is enforced: the
reasoning ends with `</think>` after that many tokens (`SamplingParams.thinking_token_budget`);
`{"type": "enabled"}` without it leaves the reasoning unbounded.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from ninfer.request import RequestOutput, StructuredOutputsParams, Usage
from ninfer.server.errors import ApiError
from ninfer.server.tool_calls import Text, ToolArgs, ToolCall, ToolEnd, ToolStart
from ninfer.server.wire import Structured, check_max_tokens, media_part, tool_structured

MIN_THINKING_BUDGET = 1024  # Anthropic's least thinking.budget_tokens


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[Any]
    max_tokens: int
    system: str | list[Any] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    cache_control: Any = None  # automatic caching: a breakpoint on the last message


def check_sampling(req: MessagesRequest, max_model_len: int) -> None:
    """Anthropic's own ranges: temperature in [0, 1]; max_tokens within the model's length."""
    t = req.temperature
    if t is not None and not 0.0 <= t <= 1.0:
        raise ApiError(f"temperature: must be in [0, 1], got {t!r}", "temperature")
    check_max_tokens(req.max_tokens, "max_tokens", max_model_len)


def check_conversation(messages: list) -> None:
    """The conversation's shape as Anthropic checks it (and the chat template needs): roles
    user / assistant, the first one user, each tool_result answering a tool_use of the assistant
    message just before it; each violation an ApiError naming `messages.N...`."""
    if not messages:
        raise ApiError("messages: must be a non-empty list", "messages")
    calls: set = set()  # the tool_use ids of the previous assistant message
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            raise ApiError(
                f"messages.{i}.role: must be user or assistant, got {role!r}",
                f"messages.{i}.role",
            )
        if i == 0 and role != "user":
            raise ApiError(
                f"messages.0.role: the first message must use the user role, got {role!r}",
                "messages.0.role",
            )
        content = m.get("content")
        blocks = content if isinstance(content, list) else []
        if role == "assistant":
            calls = {
                b["id"]
                for b in blocks
                if isinstance(b, dict)
                and b.get("type") == "tool_use"
                and isinstance(b.get("id"), str)
            }
            continue
        for j, b in enumerate(blocks):
            if isinstance(b, dict) and b.get("type") == "tool_result":
                tid = b.get("tool_use_id")
                if not isinstance(tid, str) or tid not in calls:
                    raise ApiError(
                        f"messages.{i}.content.{j}: unexpected tool_use_id {tid!r} in a "
                        "tool_result block: each tool_result must answer a tool_use block of "
                        "the previous message",
                        f"messages.{i}.content.{j}.tool_use_id",
                    )
        calls = set()


def enable_thinking(req: MessagesRequest) -> bool | None:
    kind = (req.thinking or {}).get("type")
    if kind is None:
        return None
    if kind not in ("enabled", "disabled", "adaptive"):
        raise ApiError(f"thinking.type must be enabled or disabled, got {kind!r}", "thinking.type")
    return kind != "disabled"


def thinking_budget(req: MessagesRequest) -> int | None:
    """`thinking.budget_tokens` as the engine's thinking budget (None: not set); an ApiError
    naming it unless it is an integer >= MIN_THINKING_BUDGET below `max_tokens`, with type
    enabled (Anthropic's rules)."""
    thinking = req.thinking or {}
    if "budget_tokens" not in thinking:
        return None
    budget, where = thinking["budget_tokens"], "thinking.budget_tokens"
    if thinking.get("type") != "enabled":
        raise ApiError(f"{where}: only with thinking.type enabled", where)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
        raise ApiError(
            f"{where}: must be an integer >= {MIN_THINKING_BUDGET}, got {budget!r}", where
        )
    if budget >= req.max_tokens:
        raise ApiError(f"max_tokens: must be greater than {where} ({budget})", where)
    return budget


def _tool_content(content, where: str, supports_images: bool) -> str | list[dict]:
    """A tool_result's content: its text blocks joined by newlines or, with an image among
    them, its text and image parts in order (a media block decoded or refused naming it)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(f"{where}.content must be a string or a list of blocks", f"{where}.content")
    parts = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        media = media_part(block, at, supports_images)
        if media is not None:
            parts.append(media)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        else:
            raise ApiError(f"{at}: only text and image blocks are supported", at)
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _errored(content: str | list[dict]) -> str | list[dict]:
    """A tool_result's content with `is_error` set, as the template shows it."""
    if isinstance(content, str):
        return f"Error: {content}"
    return [{"type": "text", "text": "Error: "}, *content]


def _marked_inside(content) -> bool:
    """A tool_result's own blocks carry cache_control."""
    blocks = content if isinstance(content, list) else []
    return any(isinstance(b, dict) and b.get("cache_control") for b in blocks)


def _system(system) -> list[dict]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    parts = []
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise ApiError(f"system[{j}] must be a text block", f"system[{j}]")
        p = {"type": "text", "text": str(block.get("text", ""))}
        if block.get("cache_control"):
            p["cache_control"] = block["cache_control"]
        parts.append(p)
    return [{"role": "system", "content": parts}]


def _user(blocks: list, where: str, supports_images: bool) -> list[dict]:
    """A user message's blocks: each tool_result becomes a tool message, runs of text and
    image blocks a user message (in order); a media block is decoded or refused naming it."""
    out: list[dict] = []
    parts: list[dict] = []

    def flush() -> None:
        if parts:
            out.append({"role": "user", "content": list(parts)})
            parts.clear()

    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        media = media_part(block, at, supports_images)
        kind = block.get("type") if isinstance(block, dict) else None
        if media is not None:
            parts.append(media)
        elif kind == "text":
            p = {"type": "text", "text": str(block.get("text", ""))}
            if block.get("cache_control"):
                p["cache_control"] = block["cache_control"]
            parts.append(p)
        elif kind == "tool_result":
            flush()
            content = _tool_content(block.get("content"), at, supports_images)
            msg: dict[str, Any] = {
                "role": "tool",
                "content": _errored(content) if block.get("is_error") else content,
                "tool_call_id": block.get("tool_use_id"),
            }
            if block.get("cache_control") or _marked_inside(block.get("content")):
                msg["cache_control"] = {"type": "ephemeral"}
            out.append(msg)
        else:
            raise ApiError(f"{at}: unsupported block type {kind!r} in a user message", at)
    flush()
    return out


def _assistant(blocks: list, where: str) -> dict:
    texts, reasoning, calls = [], [], []
    marked = False
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        marked = marked or bool(isinstance(block, dict) and block.get("cache_control"))
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            args = block.get("input", {})
            if not isinstance(args, dict) or not isinstance(block.get("name"), str):
                raise ApiError(f"{at}: tool_use needs a name and an object input", at)
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block["name"], "arguments": args},
                }
            )
        else:
            raise ApiError(f"{at}: unsupported block type {kind!r} in an assistant message", at)
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        msg["reasoning_content"] = "\n".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    if marked:
        msg["cache_control"] = {"type": "ephemeral"}
    return msg


def convert_messages(req: MessagesRequest, supports_images: bool = False) -> list[dict]:
    """The request's system and messages as the template's messages (ApiError naming the
    message or block); `supports_images`: the model takes image blocks."""
    out = _system(req.system)
    check_conversation(req.messages)
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise ApiError(f"{where}.role must be user or assistant", f"{where}.role")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
        elif not isinstance(content, list):
            raise ApiError(
                f"{where}.content must be a string or a list of blocks", f"{where}.content"
            )
        elif m["role"] == "user":
            out.extend(_user(content, where, supports_images))
        else:
            out.append(_assistant(content, where))
        if m.get("cache_control") and out:
            out[-1]["cache_control"] = {"type": "ephemeral"}
    if req.cache_control and out:
        out[-1]["cache_control"] = {"type": "ephemeral"}
    return out


def output_structured(req: MessagesRequest) -> Structured | None:
    """`output_config.format` (or the beta's `output_format`): {type: json_schema, schema}."""
    extra = req.model_extra or {}
    found = []
    config = extra.get("output_config")
    if config not in (None, {}):
        if not isinstance(config, dict) or set(config) - {"format"}:
            raise ApiError("output_config: only format is supported", "output_config")
        if config.get("format") is not None:
            found.append((config["format"], "output_config.format"))
    if extra.get("output_format") is not None:
        found.append((extra["output_format"], "output_format"))
    if len(found) > 1:
        raise ApiError("output_format: set output_config.format or output_format", "output_format")
    if not found:
        return None
    fmt, field = found[0]
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise ApiError(f"{field}.type must be json_schema", f"{field}.type")
    if not isinstance(fmt.get("schema"), dict):
        raise ApiError(f"{field}.schema must be a JSON schema object", f"{field}.schema")
    return Structured(StructuredOutputsParams(json=fmt["schema"]), f"{field}.schema")


def forced_tool(req: MessagesRequest, tools: list[dict] | None) -> Structured | None:
    """tool_choice {type: any} / {type: tool, name}: the reply is a call (Qwen3.5's format)."""
    choice = req.tool_choice or {}
    parallel = not choice.get("disable_parallel_tool_use", False)
    if choice.get("type") in ("any", "tool") and not tools:
        raise ApiError("tool_choice.type: forces a tool call but no tools are given", "tool_choice")
    if choice.get("type") == "any":
        return tool_structured(tools, "required", parallel)
    if choice.get("type") == "tool":
        name = choice.get("name")
        if not tools or name not in {t["function"]["name"] for t in tools}:
            raise ApiError(f"tool_choice.name: no tool is named {name!r}", "tool_choice.name")
        return tool_structured(tools, {"function": {"name": name}}, parallel)
    return None


def convert_tools(req: MessagesRequest) -> tuple[list[dict] | None, bool]:
    """(OpenAI-form tools for the template, whether a tool carries cache_control)."""
    choice = (req.tool_choice or {}).get("type")
    if choice not in (None, "auto", "any", "tool", "none"):
        raise ApiError(f"tool_choice.type {choice!r} is not supported", "tool_choice")
    if not req.tools or choice == "none":
        return None, False
    tools, marked = [], False
    for j, tool in enumerate(req.tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise ApiError(f"tools[{j}] needs a name", f"tools[{j}]")
        if tool.get("type", "custom") not in ("custom", None):  # Anthropic's server tools
            raise ApiError(
                f"tools[{j}].type: {tool['type']!r} is not supported (custom tools only)",
                f"tools[{j}].type",
            )
        marked = marked or bool(tool.get("cache_control"))
        fn = {"name": tool["name"], "description": tool.get("description", "")}
        fn["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
        tools.append({"type": "function", "function": fn})
    return tools, marked


# ---- responses -------------------------------------------------------------------------------
def usage(u: Usage, output_tokens: int | None = None) -> dict:
    """Anthropic's split of the prompt (`output_tokens` overrides the completion count)."""
    read = min(u.cached_tokens, u.prompt_tokens)
    created = max(min(u.cache_creation_tokens, u.prompt_tokens - read), 0)
    return {
        "input_tokens": u.prompt_tokens - read - created,
        "output_tokens": u.completion_tokens if output_tokens is None else output_tokens,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": created,
    }


def stop_reason(out: RequestOutput, calls: list[ToolCall]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): the stop string is named when it ended the reply."""
    if out.finish_reason == "length":
        return "max_tokens", None
    if calls:
        return "tool_use", None
    if out.finish_reason == "stop" and out.stop_string is not None:
        return "stop_sequence", out.stop_string
    return "end_turn", None


def content_blocks(reasoning: str, text: str, calls: list[ToolCall]) -> list[dict]:
    blocks: list[dict] = []
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if text or not calls:
        blocks.append({"type": "text", "text": text})
    blocks.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in calls
    )
    return blocks


def message(
    mid: str,
    model: str,
    content: list[dict],
    stop: tuple[str, str | None] | None,
    usage_: dict,
) -> dict:
    """A Message; `stop` is `stop_reason`'s pair (None while a stream has not ended)."""
    reason, sequence = stop or (None, None)
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_,
    }


class BlockStream:
    """Parser events -> Anthropic content-block events (start / delta / stop, indexed)."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "thinking" | "text" | "tool_use"

    def _start(self, kind: str, block: dict) -> list[tuple[str, dict]]:
        events = self.close()
        self.index += 1
        self.open = kind
        events.append(("content_block_start", {"index": self.index, "content_block": block}))
        return events

    def close(self) -> list[tuple[str, dict]]:
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":
            delta = {"type": "signature_delta", "signature": ""}
            events.append(("content_block_delta", {"index": self.index, "delta": delta}))
        self.open = None
        events.append(("content_block_stop", {"index": self.index}))
        return events

    def feed(self, event) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if isinstance(event, Text):
            kind = "thinking" if event.kind == "reasoning" else "text"
            if self.open != kind:
                block = (
                    {"type": "thinking", "thinking": "", "signature": ""}
                    if kind == "thinking"
                    else {"type": "text", "text": ""}
                )
                events += self._start(kind, block)
            delta = (
                {"type": "thinking_delta", "thinking": event.text}
                if kind == "thinking"
                else {"type": "text_delta", "text": event.text}
            )
            events.append(("content_block_delta", {"index": self.index, "delta": delta}))
        elif isinstance(event, ToolStart):
            block = {"type": "tool_use", "id": event.id, "name": event.name, "input": {}}
            events += self._start("tool_use", block)
        elif isinstance(event, ToolArgs):
            delta = {"type": "input_json_delta", "partial_json": event.fragment}
            events.append(("content_block_delta", {"index": self.index, "delta": delta}))
        elif isinstance(event, ToolEnd):
            events += self.close()
        return events
