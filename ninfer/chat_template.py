"""Chat rendering with the checkpoint's own Jinja template, plus the tap hints of design §7.1.

The template runs in the same sandbox transformers uses (`_compile_jinja_template` in
`transformers/utils/chat_template_utils.py`): ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and loop controls; `raise_exception`, `strftime_now`, `dict`, a `namespace` that
refuses underscore names, and transformers' `tojson` (no HTML escaping, ensure_ascii=False).
Messages are prepared as `apply_chat_template` prepares them (keys whose value is None dropped,
`reasoning`/`thinking` aliased to `reasoning_content`), the special tokens of tokenizer_config.json
are template variables, and the text is encoded without BOS, so the ids equal
`apply_chat_template(..., tokenize=True)`.

Tap hints are token positions in the rendered ids. They rely on ChatML turns (`<|im_start|>`):
every turn start is a message start, the leading turn is the tools/system block when it starts
with `<|im_start|>system`, and the generation opener is the final `<|im_start|>assistant`. A
message with `"cache_control": {"type": "ephemeral"}` (on the message or on one of its content
parts) marks the position after its turn: a turn holding several tool results ends after the
last of them. Templates without `<|im_start|>` get no hints. This module knows nothing about
the cache or the engine; `cache_breakpoints` on raw prompts are the engine's.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ninfer.tokenizer import Tokenizer

TURN_START = "<|im_start|>"
THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL = "<tool_call>"
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


@dataclass(slots=True)
class TapHints:
    """Token positions the tap planner may snapshot at (all in [0, len(token_ids)])."""

    message_starts: list[int] = field(default_factory=list)  # every turn start but the opener
    structural: list[int] = field(default_factory=list)  # end of the leading tools/system turn
    opener: int | None = None  # start of the final `<|im_start|>assistant` (generation prompt)
    explicit: list[int] = field(default_factory=list)  # after each cache_control message
    # output boundaries: token ids the reply is likely re-rendered around in the next turn's
    # history, so the state right after (`</think>`, when the generation prompt opens a think
    # block) or right before (`<tool_call>`, when tools are given) is worth keeping
    output_after: tuple[int, ...] = ()
    output_before: tuple[int, ...] = ()


@dataclass(slots=True)
class RenderedPrompt:
    token_ids: list[int]
    text: str
    hints: TapHints


class _Namespace(jinja2.utils.Namespace):
    """Jinja's namespace without underscore-prefixed attributes (as transformers)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (jinja's signature trick)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template exactly as transformers does (cached by source)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = dict
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def has_cache_control(message: dict) -> bool:
    """True if the message, or one of its content parts, carries an Anthropic cache_control."""
    if message.get("cache_control"):
        return True
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("cache_control") for p in content
    )


def prepare_messages(messages: list[dict]) -> list[dict]:
    """A copy as the template should see it: cache_control stripped (it is ours, not the
    template's), None-valued keys dropped and reasoning aliased, as apply_chat_template does."""
    out = []
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError(f"messages: each message must be a dict, got {type(message).__name__}")
        m = {k: copy.deepcopy(v) for k, v in message.items() if v is not None}
        m.pop("cache_control", None)
        if isinstance(m.get("content"), list):
            m["content"] = [
                {k: v for k, v in p.items() if k != "cache_control"} if isinstance(p, dict) else p
                for p in m["content"]
            ]
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


# Roles whose content a ChatML template writes whole (trimmed); an assistant turn's content it
# may rewrite (Qwen's drop the reasoning of earlier turns), so that is not counted.
_WHOLE_ROLES = frozenset({"system", "developer", "user", "tool"})


class TooLong(ValueError):
    """The conversation has more characters (`chars`) than `max_chars`: no tokenization of it
    fits (`Tokenizer.max_text_chars`)."""

    def __init__(self, chars: int, max_chars: int) -> None:
        super().__init__(f"messages: {chars} characters is more than the {max_chars} that fit")
        self.chars = chars
        self.max_chars = max_chars


def text_floor(messages: list, tools: list | None) -> int:
    """Characters every rendering of the conversation holds, counted without rendering it: the
    text of each system, user and tool message (its string content or its text parts, each
    without the leading and trailing whitespace a template trims) and every string in the tool
    definitions (templates write each one whole, as JSON). Other messages and fields count 0."""
    total = 0
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in _WHOLE_ROLES:
            continue
        content = m.get("content")
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else part
            if isinstance(text, str):
                total += len(text.strip())
    stack: list = list(tools or [])
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


class ChatTemplate:
    """A tokenizer's chat template, rendered to text, ids and tap hints.

    `render` raises ValueError when the template raises (e.g. no user message) or when the
    tokenizer has no template.
    """

    def __init__(self, tokenizer: Tokenizer, template: str | dict[str, str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = template if template is not None else tokenizer.chat_template
        if self.template is None:
            raise ValueError("the tokenizer has no chat_template (tokenizer_config.json)")
        self._turn_id = tokenizer.token_to_id(TURN_START)

    def _source(self, tools: list[dict] | None) -> str:
        if isinstance(self.template, str):
            return self.template
        if tools is not None and "tool_use" in self.template:
            return self.template["tool_use"]
        if "default" not in self.template:
            raise ValueError(f"no default chat template among {sorted(self.template)}")
        return self.template["default"]

    def render_text(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt text for already prepared messages (see `prepare_messages`)."""
        if tools is not None and not all(isinstance(t, dict) for t in tools):
            raise ValueError("tools must be JSON-schema dicts")
        variables = {**self.tokenizer.special_tokens, **kwargs}
        try:
            return compile_template(self._source(tools)).render(
                messages=messages,
                tools=copy.deepcopy(tools),
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.exceptions.TemplateError as e:
            raise ValueError(f"chat template: {e}") from e

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        *,
        max_chars: int | None = None,
        **kwargs: Any,
    ) -> RenderedPrompt:
        """Render, encode and locate the tap hints. Extra kwargs are template variables. With
        `max_chars`, a conversation longer than that raises `TooLong` before it is encoded:
        before it is rendered when its `text_floor` alone is longer."""
        if not messages:
            raise ValueError("messages: a conversation needs at least one message")
        if max_chars is not None and (floor := text_floor(messages, tools)) > max_chars:
            raise TooLong(floor, max_chars)
        if enable_thinking is not None:
            kwargs["enable_thinking"] = enable_thinking
        prepared = prepare_messages(messages)
        text = self.render_text(prepared, tools, add_generation_prompt, **kwargs)
        if max_chars is not None and len(text) > max_chars:
            raise TooLong(len(text), max_chars)
        ids = self.tokenizer.encode(text)
        marked = [i for i, m in enumerate(messages) if has_cache_control(m)]
        hints = self._hints(text, ids, prepared, marked, tools, add_generation_prompt, kwargs)
        return RenderedPrompt(token_ids=ids, text=text, hints=hints)

    # ---- hints ------------------------------------------------------------------------------
    def _hints(
        self,
        text: str,
        ids: list[int],
        prepared: list[dict],
        marked: list[int],
        tools: list[dict] | None,
        add_generation_prompt: bool,
        kwargs: dict,
    ) -> TapHints:
        """Turn starts are where `<|im_start|>` sits in the ids; the k-th one in the text must be
        the k-th one in the ids, or the hints are not trusted and none are given.

            ids:   <|im_start|>system ... <|im_start|>user ... <|im_start|>assistant\\n<think>\\n
                   ^ message start        ^ message start      ^ opener
                                          ^ structural (end of the system turn)
        """
        if self._turn_id is None:
            return TapHints()
        tok_pos = [i for i, t in enumerate(ids) if t == self._turn_id]
        char_pos = [m.start() for m in re.finditer(re.escape(TURN_START), text)]
        if not tok_pos or len(tok_pos) != len(char_pos):
            return TapHints()
        hints = TapHints(message_starts=list(tok_pos))
        if add_generation_prompt and text.startswith(TURN_START + "assistant", char_pos[-1]):
            hints.opener = hints.message_starts.pop()
            hints.output_after, hints.output_before = self._output_marks(
                text[char_pos[-1] :], tools
            )
        leading = bool(tools) or prepared[0].get("role") in ("system", "developer")
        if leading and text.startswith(TURN_START + "system", char_pos[0]):
            hints.structural = [tok_pos[1] if len(tok_pos) > 1 else len(ids)]
        for i in marked:
            k = self._turns_through(prepared[: i + 1], tools, kwargs)
            if k is not None and 0 < k <= len(tok_pos):
                pos = tok_pos[k] if k < len(tok_pos) else len(ids)
                if pos not in hints.explicit:
                    hints.explicit.append(pos)
        return hints

    def _output_marks(
        self, opener: str, tools: list[dict] | None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(after, before) token ids of the reply's structural boundaries: after `</think>` when
        the generation prompt `opener` leaves a think block open, before `<tool_call>` when the
        request offers tools. Ids the tokenizer lacks as single tokens are left out."""
        tok = self.tokenizer
        think_open = opener.rfind(THINK_START) > opener.rfind(THINK_END)
        after = tok.token_to_id(THINK_END) if think_open else None
        before = tok.token_to_id(TOOL_CALL) if tools else None
        return (() if after is None else (after,)), (() if before is None else (before,))

    def _turns_through(
        self, prefix: list[dict], tools: list[dict] | None, kwargs: dict
    ) -> int | None:
        """How many turns `prefix` renders to. History rewriting (stripped reasoning) changes a
        turn's text but not the number of turns. A prefix the template rejects on its own (say,
        no user message yet) is counted with a placeholder user turn appended."""
        try:
            return self.render_text(prefix, tools, False, **kwargs).count(TURN_START)
        except ValueError:
            pass
        try:
            probe = [*prefix, {"role": "user", "content": "."}]
            return self.render_text(probe, tools, False, **kwargs).count(TURN_START) - 1
        except ValueError:
            return None


def render_chat(
    tokenizer: Tokenizer,
    messages: list[dict],
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    **kwargs: Any,
) -> RenderedPrompt:
    """One-shot `ChatTemplate(tokenizer).render(...)`."""
    return ChatTemplate(tokenizer).render(
        messages, tools, add_generation_prompt, enable_thinking, **kwargs
    )
