"""Qwen3.5's output conventions, parsed incrementally: the reasoning split and XML tool calls.

A generation prompt that ends inside `<think>` (thinking on) makes the reply start with
reasoning, closed by `</think>`; the template renders an assistant turn as

    <think>\\n REASONING \\n</think>\\n\\n CONTENT <tool_call>\\n<function=NAME>\\n
    <parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

so the newlines around the tags are the format's, not the reply's: they are dropped. Text that
may still become a tag is held back until it can be decided, so a stream of `feed` calls emits
the same events (concatenated) as one `feed` of the whole text. A tool call's arguments come as
JSON fragments, one per completed parameter (`{"a": 1`, `, "b": "x"`, `}`); values are typed by
the tool's JSON schema (`string` stays text, other types are parsed as JSON when they parse).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

THINK_END = "</think>"
TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_END = re.compile(r"\s*(?:</function>\s*)?</tool_call>")


@dataclass(slots=True)
class Text:
    kind: str  # "reasoning" | "content"
    text: str


@dataclass(slots=True)
class ToolStart:
    index: int
    id: str
    name: str


@dataclass(slots=True)
class ToolArgs:
    index: int
    fragment: str  # the concatenated fragments of one call are its arguments' JSON


@dataclass(slots=True)
class ToolEnd:
    index: int
    call: ToolCall


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict = field(default_factory=dict)


Event = Text | ToolStart | ToolArgs | ToolEnd


def _held(buf: str, tag: str) -> int:
    """Where the undecided tail of `buf` starts: trailing newlines plus a proper prefix of
    `tag` (either may be empty)."""
    k = len(buf)
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:n]):
            k = len(buf) - n
            break
    while k > 0 and buf[k - 1] == "\n":
        k -= 1
    return k


def tool_schemas(tools: list[dict] | None) -> dict[str, dict]:
    """name -> parameter properties, from OpenAI-form tools (`{"function": {...}}`)."""
    out: dict[str, dict] = {}
    for tool in tools or []:
        fn = tool.get("function", tool)
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters") or {}
            out[fn["name"]] = params.get("properties") or {} if isinstance(params, dict) else {}
    return out


_PADDING = " \t\n\r"  # the whitespace a constrained reply may pad a value with
_BOUNDS = ("pattern", "format", "minLength", "maxLength")


def convert_value(raw: str, schema: dict | None) -> object:
    """A parameter's text as the schema types it: strings stay text; other declared types
    are JSON-parsed when they parse; an enum or const value, and a string the schema bounds
    (pattern, format, length), is read without the whitespace around it; an undeclared
    parameter stays text."""
    if not isinstance(schema, dict):
        return raw
    kind = schema.get("type")
    if kind == "string" and any(key in schema for key in _BOUNDS):
        # a constrained reply may pad the value (the format's, not the value's); the
        # grammar keeps a bounded value's own edges free of it (`structured.tool_call_tag`)
        return raw.strip(_PADDING)
    if "enum" in schema or "const" in schema:
        # a constrained reply may pad the value with whitespace (the format's, not the value's)
        value = raw.strip()
        choices = schema.get("enum") if "enum" in schema else [schema["const"]]
        if value in [c for c in choices or [] if isinstance(c, str)]:
            return value
        try:
            return json.loads(value)
        except ValueError:
            return raw
    if kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class OutputParser:
    """feed(text) -> events; finish() -> the events of whatever is still held."""

    def __init__(
        self,
        thinking: bool,
        tools: dict[str, dict] | None,
        new_id: Callable[[], str],
        max_calls: int | None = None,
    ) -> None:
        self._state = "reasoning" if thinking else "content"
        self._max_calls = max_calls  # None: any number; calls past it are dropped
        self._tools = tools  # None: tool-call parsing off
        self._new_id = new_id
        self._buf = ""
        self._strip_lead = False  # drop the format's newlines before the next content
        self._calls: list[ToolCall] = []
        self._call: ToolCall | None = None  # the call being parsed
        self._nargs = 0

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self._calls[: self._max_calls]

    def _kept(self, events: list[Event]) -> list[Event]:
        """`events` less those of the calls past `max_calls` (parallel calls turned off)."""
        if self._max_calls is None:
            return events
        limit = self._max_calls
        return [e for e in events if isinstance(e, Text) or e.index < limit]

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while True:
            before = (self._state, len(self._buf))
            if self._state == "reasoning":
                self._reasoning(out)
            elif self._state == "content":
                self._content(out)
            else:
                self._tool(out)
            if (self._state, len(self._buf)) == before:
                return self._kept(out)

    def finish(self) -> list[Event]:
        out: list[Event] = []
        buf, self._buf = self._buf, ""
        if self._state == "reasoning":
            self._emit(out, "reasoning", buf.rstrip("\n"))
        elif self._state == "content":
            self._emit(out, "content", buf.lstrip("\n") if self._strip_lead else buf)
        elif self._call is not None:  # a call cut short (max_tokens): close what parsed
            self._close_call(out)
        else:
            self._emit(out, "content", TOOL_OPEN + buf)
        return self._kept(out)

    # ---- states -----------------------------------------------------------------------------
    def _emit(self, out: list[Event], kind: str, text: str) -> None:
        if not text:
            return
        if out and isinstance(out[-1], Text) and out[-1].kind == kind:
            out[-1].text += text
        else:
            out.append(Text(kind, text))

    def _reasoning(self, out: list[Event]) -> None:
        i = self._buf.find(THINK_END)
        if i >= 0:
            self._emit(out, "reasoning", self._buf[:i].rstrip("\n"))
            self._buf = self._buf[i + len(THINK_END) :]
            self._state, self._strip_lead = "content", True
            return
        k = _held(self._buf, THINK_END)
        self._emit(out, "reasoning", self._buf[:k])
        self._buf = self._buf[k:]

    def _content(self, out: list[Event]) -> None:
        if self._strip_lead:
            stripped = self._buf.lstrip("\n")
            if not stripped:
                self._buf = ""
                return
            self._buf, self._strip_lead = stripped, False
        i = self._buf.find(TOOL_OPEN) if self._tools is not None else -1
        if i >= 0:
            self._emit(out, "content", self._buf[:i].rstrip("\n"))
            self._buf = self._buf[i + len(TOOL_OPEN) :]
            self._state = "tool"
            return
        k = _held(self._buf, TOOL_OPEN) if self._tools is not None else len(self._buf)
        self._emit(out, "content", self._buf[:k])
        self._buf = self._buf[k:]

    def _tool(self, out: list[Event]) -> None:
        if self._call is None:
            m = _FUNCTION.match(self._buf)
            if m is None:
                if TOOL_CLOSE in self._buf or not _could_start(self._buf):
                    # not a call after all: the text is content
                    j = self._buf.find(TOOL_CLOSE)
                    end = j + len(TOOL_CLOSE) if j >= 0 else 0
                    self._emit(out, "content", TOOL_OPEN + self._buf[:end])
                    self._buf = self._buf[end:]
                    self._state = "content"
                return
            self._call = ToolCall(id=self._new_id(), name=m.group(1).strip())
            self._nargs = 0
            out.append(ToolStart(len(self._calls), self._call.id, self._call.name))
            self._buf = self._buf[m.end() :]
            return
        m = _PARAMETER.match(self._buf)
        if m is not None:
            key = m.group(1).strip()
            raw = m.group(2)
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
            props = (self._tools or {}).get(self._call.name) or {}
            value = convert_value(raw, props.get(key))
            self._call.arguments[key] = value
            sep = "{" if self._nargs == 0 else ", "
            frag = sep + json.dumps(key, ensure_ascii=False) + ": "
            out.append(ToolArgs(len(self._calls), frag + json.dumps(value, ensure_ascii=False)))
            self._nargs += 1
            self._buf = self._buf[m.end() :]
            return
        m = _END.match(self._buf)
        if m is not None:
            self._buf = self._buf[m.end() :]
            self._close_call(out)
            self._state, self._strip_lead = "content", True
            return
        j = self._buf.find(TOOL_CLOSE)
        if j >= 0 and "<parameter=" not in self._buf[:j]:  # stray text before the close
            self._buf = self._buf[j + len(TOOL_CLOSE) :]
            self._close_call(out)
            self._state, self._strip_lead = "content", True

    def _close_call(self, out: list[Event]) -> None:
        call, self._call = self._call, None
        assert call is not None
        index = len(self._calls)
        out.append(ToolArgs(index, "{}" if self._nargs == 0 else "}"))
        self._calls.append(call)
        out.append(ToolEnd(index, call))


def _could_start(buf: str) -> bool:
    """True while `buf` (the text after `<tool_call>`) may still become `<function=...>`."""
    s = buf.lstrip()
    head = "<function="
    return s[: len(head)] == head[: len(s)] if len(s) < len(head) else s.startswith(head)


def parse_text(
    text: str, thinking: bool, tools: dict[str, dict] | None, new_id, max_calls=None
) -> tuple:
    """(reasoning, content, tool calls) of a whole reply (`max_calls`: as `OutputParser`)."""
    parser = OutputParser(thinking, tools, new_id, max_calls)
    events = parser.feed(text) + parser.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, Text) and e.kind == "reasoning")
    content = "".join(e.text for e in events if isinstance(e, Text) and e.kind == "content")
    return reasoning, content, parser.tool_calls
