"""OpenAI wire format: request models, message conversion, responses and stream chunks.

Cache breakpoints on OpenAI requests: `"cache_control": {"type": "ephemeral"}` on a message or
on one of its content parts (the Anthropic spelling, as OpenAI-compatible gateways pass it
through) marks the end of that message's turn as a client breakpoint. On completions,
`cache_breakpoints` (token positions) does the same for raw prompts. `return_token_ids: true`
on a chat or completions request adds each choice's (or streamed chunk's) generated token ids;
`stop_token_ids` (vLLM's extension) ends a choice at the first of those ids it generates,
finish_reason "stop": the id is the last of its token ids and, as in `SamplingParams`, its text
ends the reply (a control token such as `<|im_end|>` has none; vLLM drops an ordinary token's).
`/v1/completions` takes a batch as OpenAI does (a list of texts or of token-id lists): choice
`i * n + j` is prompt i's j-th; the prompts run as one batch and share the prefix cache.
"""

from __future__ import annotations

import json
from operator import itemgetter
from typing import Any

from pydantic import BaseModel, ConfigDict

from ninfer.request import RequestOutput
from ninfer.server.errors import ApiError
from ninfer.server.jsontext import PAUSE_EVERY, RawJson, encode, pause
from ninfer.server.tool_calls import Text, ToolArgs, ToolCall, ToolStart
from ninfer.server.wire import MAX_TOP_LOGPROBS, media_part, token_text

ROLES = ("system", "developer", "user", "assistant", "tool")


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    ignore_eos: bool = False
    user: str | None = None
    # OpenAI's routing hint for its cache; one engine finds reuse by content, so it is only
    # checked (a string) and does not change the output
    prompt_cache_key: str | None = None
    # (vLLM's extension) the most tokens a reply spends inside the `<think>` block its prompt
    # leaves open; `</think>` is forced after them (`SamplingParams.thinking_token_budget`)
    thinking_token_budget: int | None = None


class ChatRequest(_Request):
    messages: list[Any]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    return_token_ids: bool | None = None  # (vLLM's extension) each choice/chunk's token ids


class CompletionRequest(_Request):
    # one prompt (text or token ids) or a batch of them (a list of texts or of token-id lists)
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    cache_breakpoints: list[int] | None = None
    return_token_ids: bool | None = None  # (vLLM's extension) each choice/chunk's token ids

    def prompts(self) -> list[str | list[int]]:
        """The batch: one prompt, or each of a list's."""
        p = self.prompt
        if isinstance(p, str) or not p or isinstance(p[0], int):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


MAX_BATCH_CHOICES = 128  # prompts x n of one /v1/completions request


def thinking_of(effort) -> bool | None:
    """`reasoning_effort` as Qwen's thinking switch ("none" / "minimal": off); None: not set."""
    if effort is None:
        return None
    if effort not in ("none", "minimal", "low", "medium", "high"):
        raise ApiError(
            f"reasoning_effort must be none, minimal, low, medium or high, got {effort!r}",
            "reasoning_effort",
        )
    return effort not in ("none", "minimal")


def check_penalties(req: _Request) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name) not in (None, 0, 0.0):
            raise ApiError(f"{name} is not supported (only 0)", name)


def chat_logprobs_k(req: ChatRequest) -> int | None:
    if not req.logprobs:
        if req.top_logprobs:
            raise ApiError("top_logprobs needs logprobs: true", "top_logprobs")
        return None
    k = req.top_logprobs or 0
    if not 0 <= k <= MAX_TOP_LOGPROBS:
        raise ApiError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", "top_logprobs")
    return k


# ---- messages --------------------------------------------------------------------------------
def _content(content, where: str, supports_images: bool):
    """A message's content as the template takes it: a string or a list of text and image
    parts (their cache_control kept: it is a breakpoint). A media part is decoded or refused
    naming it (`wire.media_part`)."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(f"{where}.content must be a string or a list of parts", f"{where}.content")
    parts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if isinstance(part, str):
            part = {"type": "text", "text": part}
        media = media_part(part, at, supports_images)
        if media is not None:
            parts.append(media)
            continue
        if not isinstance(part, dict) or part.get("type", "text") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ApiError(f"{at}: unsupported content part {kind!r} (text only)", at)
        if not isinstance(part.get("text"), str):
            raise ApiError(f"{where}.content[{j}].text must be a string", f"{where}.content[{j}]")
        p = {"type": "text", "text": part["text"]}
        if part.get("cache_control"):
            p["cache_control"] = part["cache_control"]
        parts.append(p)
    return parts


def _tool_calls(calls, where: str) -> list[dict]:
    """History tool calls with `function.arguments` parsed: the Qwen templates iterate the
    arguments as a mapping and fail on the JSON string OpenAI clients send."""
    if not isinstance(calls, list):
        raise ApiError(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(f"{at}.function.name is missing", f"{at}.function")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as e:
                raise ApiError(
                    f"{at}.function.arguments is not valid JSON ({e})", f"{at}.function.arguments"
                ) from None
        if not isinstance(args, dict):
            raise ApiError(
                f"{at}.function.arguments must be a JSON object", f"{at}.function.arguments"
            )
        out.append(
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": fn["name"], "arguments": args},
            }
        )
    return out


def convert_messages(messages: list, supports_images: bool = False) -> list[dict]:
    """OpenAI chat messages -> the template's messages (ApiError naming the message or the
    content part); `supports_images`: the model takes image parts."""
    if not messages:
        raise ApiError("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(f"{where} must be an object", where)
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(f"{where}.role must be one of {list(ROLES)}, got {role!r}", where)
        msg: dict[str, Any] = {
            "role": "system" if role == "developer" else role,
            "content": _content(m.get("content"), where, supports_images),
        }
        if m.get("cache_control"):
            msg["cache_control"] = m["cache_control"]
        if role == "assistant":
            if m.get("tool_calls"):
                msg["tool_calls"] = _tool_calls(m["tool_calls"], where)
            reasoning = m.get("reasoning_content", m.get("reasoning"))
            if isinstance(reasoning, str):
                msg["reasoning_content"] = reasoning
        if role == "tool" and m.get("tool_call_id") is not None:
            msg["tool_call_id"] = m["tool_call_id"]
        if role != "assistant" and msg["content"] is None:
            raise ApiError(f"{where}.content is missing", f"{where}.content")
        out.append(msg)
    check_conversation(out, lambda i: f"messages[{i}]")
    return out


def check_conversation(msgs: list[dict], where) -> None:
    """The shape the chat template needs, each violation an ApiError naming the message
    (`where(i)`: message i's path): system messages first, then a user message; a tool
    message answers the tool calls of the assistant message before it (by id, when both
    carry ids); some user message."""
    started = False
    calls: set | None = None  # the ids of the open assistant message's tool calls
    for i, m in enumerate(msgs):
        role, at = m["role"], where(i)
        if role == "system":
            if started:
                raise ApiError(
                    f"{at}.role: a system message must come before the conversation's "
                    "first user message",
                    f"{at}.role",
                )
            continue
        if not started and role != "user":
            raise ApiError(
                f"{at}.role: the conversation must start with a user message "
                f"(after any system messages), got {role!r}",
                f"{at}.role",
            )
        started = True
        if role == "assistant":
            made = m.get("tool_calls") or []
            calls = {c["id"] for c in made if isinstance(c.get("id"), str)} if made else None
        elif role == "tool":
            if calls is None:
                raise ApiError(
                    f"{at}.role: a tool message must answer the tool_calls of the assistant "
                    "message before it",
                    f"{at}.role",
                )
            tid, ids = m.get("tool_call_id"), calls
            if tid is not None and ids and (not isinstance(tid, str) or tid not in ids):
                raise ApiError(
                    f"{at}.tool_call_id: {tid!r} answers no tool call of the assistant message "
                    f"before it (its calls: {sorted(map(str, ids))})",
                    f"{at}.tool_call_id",
                )
        else:
            calls = None
    if not started:
        raise ApiError("messages: the conversation has no user message", "messages")


def render_tools(tools, tool_choice) -> list[dict] | None:
    """The tools the template renders (None: none, or tool_choice "none"); a tool_choice that
    forces a call needs tools to call."""
    if not tools and (tool_choice == "required" or isinstance(tool_choice, dict)):
        raise ApiError("tool_choice forces a tool call but no tools are given", "tool_choice")
    if tools is None or tool_choice == "none":
        return None
    for j, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(
                f"tools[{j}] must be {{type: function, function: {{name, ...}}}}", f"tools[{j}]"
            )
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in {t["function"]["name"] for t in tools}:
            raise ApiError(f"tool_choice names an unknown tool {name!r}", "tool_choice")
    elif tool_choice not in (None, "auto", "required"):
        raise ApiError(
            f"tool_choice must be none, auto, required or a function, got {tool_choice!r}",
            "tool_choice",
        )
    return tools or None


# ---- responses -------------------------------------------------------------------------------
def usage(prompt: int, completion: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def usage_of(outs: list[RequestOutput], n: int | None = None) -> dict:
    """n choices of each prompt (n None: of one prompt): each prompt once, its first choice's
    cache reuse."""
    n = n or len(outs)
    firsts = [o.usage for o in outs[::n]]
    completion = sum(o.usage.completion_tokens for o in outs)
    prompt = sum(u.prompt_tokens for u in firsts)
    return usage(prompt, completion, sum(u.cached_tokens for u in firsts))


def finish_reason(out: RequestOutput, calls: list[ToolCall]) -> str:
    if out.finish_reason == "length":
        return "length"
    return "tool_calls" if calls else "stop"


def tool_call_json(call: ToolCall) -> dict:
    args = json.dumps(call.arguments, ensure_ascii=False)
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": args}}


LOGPROB_FLOOR = -9999.0  # what a log-probability of zero (-inf) is sent as: JSON has no -inf


def _lp(value: float) -> float:
    return value if value >= LOGPROB_FLOOR else LOGPROB_FLOOR


_FLOOR_TEXT = repr(LOGPROB_FLOOR)


def _lp_text(value: float) -> str:
    """`encode(_lp(value))` for a float: JSON writes a finite float as its repr."""
    return repr(float(value)) if value >= LOGPROB_FLOOR else _FLOOR_TEXT


def chat_logprobs(
    out: RequestOutput, tokenizer, k: int, seen: dict[int, tuple[str, str]] | None = None
) -> dict | None:
    """The choice's `logprobs` object: `content`, one entry a generated token, built as JSON
    text (`jsontext.RawJson`: a reply of n x max_tokens x k entries adds no objects for the
    garbage collector to walk). A token's text and bytes are encoded once per reply, each
    top entry is one f-string: the whole reply is built on a worker thread that shares the GIL
    with the engine thread and the event loop, so its cost is their stall. `seen`: token id ->
    its entry's text around the logprob, shared by the choices of one reply."""
    if out.logprobs is None:
        return None
    seen = {} if seen is None else seen

    def piece(token_id: int) -> tuple[str, str]:
        entry = seen.get(token_id)
        if entry is None:
            text = token_text(tokenizer, token_id)
            head = f'{{"token": {encode(text)}, "logprob": '
            entry = seen[token_id] = (head, f', "bytes": {encode(list(text.encode()))}')
        return entry

    entries = []
    for n, (tok, top) in enumerate(zip(out.token_ids, out.logprobs, strict=False), 1):
        if n % PAUSE_EVERY == 0:
            pause()
        head, tail = piece(tok)
        ranked = sorted(top.items(), key=itemgetter(1), reverse=True)[:k]
        tops = ", ".join([f"{h}{_lp_text(lp)}{t}}}" for h, t, lp in _pieces(piece, ranked)])
        entries.append(f'{head}{_lp_text(top.get(tok, 0.0))}{tail}, "top_logprobs": [{tops}]}}')
    return {"content": RawJson("[" + ", ".join(entries) + "]")}


def _pieces(piece, ranked):
    for i, lp in ranked:
        head, tail = piece(i)
        yield head, tail, lp


def completion_logprobs(out: RequestOutput, tokenizer, k: int) -> dict | None:
    if out.logprobs is None:
        return None
    tokens, lps, tops, offsets, pos = [], [], [], [], 0
    for n, (tok, top) in enumerate(zip(out.token_ids, out.logprobs, strict=False), 1):
        if n % PAUSE_EVERY == 0:
            pause()
        text = token_text(tokenizer, tok)
        tokens.append(text)
        lp = top.get(tok)
        lps.append(None if lp is None else _lp(lp))
        ranked = sorted(top.items(), key=lambda kv: -kv[1])[:k]
        tops.append({token_text(tokenizer, i): _lp(lp) for i, lp in ranked})
        offsets.append(pos)
        pos += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def chat_message(reasoning: str, content: str, calls: list[ToolCall]) -> dict:
    text = content if content or not calls else None
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = [tool_call_json(c) for c in calls]
    return msg


class ChunkFormat:
    """A stream's chunks as SSE text: the fields every chunk repeats (id, object, created,
    model) are encoded once per request; each chunk encodes only its choices (and usage).
    The text is what `json.dumps` of the whole chunk gives."""

    __slots__ = ("_head",)

    def __init__(self, rid: str, created: int, model: str, obj: str) -> None:
        head = json.dumps(
            {"id": rid, "object": obj, "created": created, "model": model}, ensure_ascii=False
        )
        self._head = "data: " + head[:-1] + ', "choices": '

    def sse(self, choices: list[dict], usage_: dict | None = None) -> str:
        tail = "" if usage_ is None else ', "usage": ' + json.dumps(usage_, ensure_ascii=False)
        return self._head + json.dumps(choices, ensure_ascii=False) + tail + "}\n\n"


def delta_choice(events: list, index: int) -> dict | None:
    """Parser events as one chat-chunk choice (None: nothing to send): the reasoning and the
    content joined, each tool call's start and argument fragments in one entry by its index."""
    delta: dict[str, Any] = {}
    calls: dict[int, dict] = {}
    for event in events:
        if isinstance(event, Text):
            key = "reasoning_content" if event.kind == "reasoning" else "content"
            delta[key] = delta.get(key, "") + event.text
        elif isinstance(event, ToolStart):
            function = {"name": event.name, "arguments": ""}
            calls[event.index] = {
                "index": event.index,
                "id": event.id,
                "type": "function",
                "function": function,
            }
        elif isinstance(event, ToolArgs):
            entry = calls.setdefault(
                event.index, {"index": event.index, "function": {"arguments": ""}}
            )
            entry["function"]["arguments"] += event.fragment
    if calls:
        delta["tool_calls"] = list(calls.values())
    if not delta:
        return None
    return {"index": index, "delta": delta, "finish_reason": None}
