"""Plain data of the public API (spec/API.md): sampling parameters and request outputs.

This module knows nothing about tensors, the model or the cache; it is imported by everything
above the engine and by the CLI.
"""

from __future__ import annotations

import json as _json
import math
from dataclasses import asdict, dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort", "error"]

# Limits of SamplingParams (checked at submission, named in the errors):
MAX_LOGPROBS = 20  # top-k log-probabilities per position (OpenAI's top_logprobs cap)
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes an unsigned 64-bit seed
MAX_TEMPERATURE = 100.0  # logits / T stay finite and meaningful in fp32
# A temperature below this is greedy (as vLLM's sampling epsilon): dividing the logits by a
# subnormal number overflows them to inf, and the softmax of those is NaN.
MIN_TEMPERATURE = 1e-5
MAX_STOP_STRINGS = 64
MAX_STOP_TOKEN_IDS = 1024
MAX_CHOICES = 1024  # StructuredOutputsParams.choice
_STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


class EngineError(RuntimeError):
    """The engine could not serve a request for a reason that is not the request's fault: an
    injected or transient fault in its step, or a fault that ended the engine. Raised by a
    single-prompt call; inside a batch it is that output's error (finish_reason "error")."""


@dataclass(slots=True)
class StructuredOutputsParams:
    """A constraint on the generated text (vLLM's name and fields); exactly one is set:

    json: a JSON schema (dict or JSON text): the reply is one JSON document valid against it.
    json_object: True: the reply is one JSON object.
    regex: the reply matches this regular expression, whole.
    choice: the reply is exactly one of these strings.
    grammar: an EBNF grammar (GBNF-style, `root ::= ...`) the reply derives from.
    structural_tag: an xgrammar structural tag (dict or JSON text), e.g. tool-call formats.

    The reply may stop early on max_tokens (finish_reason "length"); a stop string or stop
    token ends it where it matches.
    """

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: dict | str | None = None

    def kind(self) -> tuple[str, object]:
        """(field name, value) of the one constraint set; ValueError naming the fields when
        none or several are."""
        set_ = [k for k in _STRUCTURED_KINDS if getattr(self, k) not in (None, False)]
        if len(set_) != 1:
            got = ", ".join(set_) or "none"
            raise ValueError(
                f"structured_outputs: set exactly one of {', '.join(_STRUCTURED_KINDS)} (got {got})"
            )
        return set_[0], getattr(self, set_[0])

    @classmethod
    def from_response_format(cls, fmt: object) -> StructuredOutputsParams | None:
        """OpenAI's `response_format` ({type: text | json_object | json_schema, json_schema:
        {name, schema, strict}}) as a spec (None for text); ValueError naming the field."""
        if not isinstance(fmt, dict) or fmt.get("type") not in (
            "text",
            "json_object",
            "json_schema",
        ):
            raise ValueError("response_format.type must be text, json_object or json_schema")
        if fmt["type"] == "text":
            return None
        if fmt["type"] == "json_object":
            return cls(json_object=True)
        inner = fmt.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if not isinstance(schema, dict):
            raise ValueError("response_format.json_schema.schema must be a JSON schema object")
        return cls(json=schema)

    @classmethod
    def from_dict(cls, data: object) -> StructuredOutputsParams:
        """vLLM's `structured_outputs` object ({"json": ...} and so on); ValueError naming it."""
        if not isinstance(data, dict) or not set(data) <= set(_STRUCTURED_KINDS):
            raise ValueError(
                f"structured_outputs must be an object with one of {', '.join(_STRUCTURED_KINDS)}"
            )
        return cls(**data)

    def validated(self) -> StructuredOutputsParams:
        """A checked copy (ValueError naming the field); the grammar is compiled later, where
        the tokenizer is known (`ninfer.structured`)."""
        kind, value = self.kind()
        where = f"structured_outputs.{kind}"
        if kind in ("json", "structural_tag"):
            if isinstance(value, str):
                try:
                    value = _json.loads(value)
                except ValueError as e:
                    raise ValueError(f"{where}: not valid JSON ({e})") from None
            if not isinstance(value, dict):
                raise ValueError(f"{where} must be a JSON object, got {_show(value)}")
            try:
                value = _json.loads(_json.dumps(value))  # a private, plain copy
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}: not JSON data ({e})") from None
        elif kind == "json_object":
            if value is not True:
                raise ValueError(f"{where} must be True or False, got {_show(value)}")
        elif kind == "choice":
            if not isinstance(value, (list, tuple)) or not value or len(value) > MAX_CHOICES:
                raise ValueError(f"{where} must be a list of 1 to {MAX_CHOICES} strings")
            if not all(isinstance(c, str) and c and _text_ok(c) for c in value):
                raise ValueError(f"{where} must hold non-empty strings, got {_show(value)}")
            value = list(value)
        elif not isinstance(value, str) or not value or not _text_ok(value):
            raise ValueError(f"{where} must be a non-empty string, got {_show(value)}")
        return StructuredOutputsParams(**{kind: value})


@dataclass(slots=True)
class SamplingParams:
    """How one request samples. `temperature=0` is greedy.

    `logprobs=k` returns, for every generated position, the top-k natural-log probabilities over
    the full vocabulary (before the sampling filters) plus the chosen token's. With
    `structured_outputs` they are those of the constrained distribution (tokens the grammar
    forbids have -inf), as vLLM and SGLang report them.

    `thinking_token_budget=b` (vLLM's name) caps the reasoning: when the prompt leaves a
    `<think>` block open (Qwen3.5's generation prompt with thinking on), the reply may spend at
    most b tokens inside it; the token after the b-th is forced to `</think>` (0: at once).
    None: no cap. A prompt that opens no block leaves it nothing to do.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    thinking_token_budget: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        self.validated()

    def validated(self) -> SamplingParams:
        """A checked, frozen copy (ValueError naming the first bad field): numbers normalised
        (floats as float), `stop` and `stop_token_ids` as tuples. The engine keeps this copy,
        so changing the caller's object after submission has no effect on the request."""
        max_tokens = _int_field("max_tokens", self.max_tokens, 1, None, ">= 1")
        temperature = _float_field("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        top_p = _float_field("top_p", self.top_p, 0.0, 1.0, low_open=True)
        top_k = _int_field("top_k", self.top_k, None, None, "-1 (off) or >= 1")
        if top_k < 1 and top_k != -1:
            raise ValueError(f"top_k must be -1 (off) or an integer >= 1, got {top_k!r}")
        min_p = _float_field("min_p", self.min_p, 0.0, 1.0)
        seed = None
        if self.seed is not None:
            seed = _int_field("seed", self.seed, 0, MAX_SEED, f"in [0, {MAX_SEED}]")
        logprobs = None
        if self.logprobs is not None:
            rng = f"in [0, {MAX_LOGPROBS}] (or None)"
            logprobs = _int_field("logprobs", self.logprobs, 0, MAX_LOGPROBS, rng)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {_show(self.ignore_eos)}")
        budget = None
        if self.thinking_token_budget is not None:
            rule = ">= 0 (or None)"
            budget = _int_field("thinking_token_budget", self.thinking_token_budget, 0, None, rule)
        structured = self.structured_outputs
        if structured is not None:
            if not isinstance(structured, StructuredOutputsParams):
                raise ValueError(
                    "structured_outputs must be a StructuredOutputsParams, got "
                    f"{type(structured).__name__}"
                )
            structured = structured.validated()
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0 if temperature < MIN_TEMPERATURE else temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            seed=seed,
            stop=_stop_field(self.stop),
            stop_token_ids=_stop_ids_field(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            structured_outputs=structured,
            thinking_token_budget=budget,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(slots=True)
class Usage:
    """Token accounting of one request.

    cached_tokens: the reuse frontier the request resumed from (prompt tokens not prefilled).
    cached_prefix_tokens: the longest cached block prefix, reusable or not.
    restored_host_bytes: bytes copied from the Host tier for this request.
    cache_creation_tokens: prompt tokens this request prefilled into blocks it newly inserted
    into the prefix cache (Anthropic's `cache_creation_input_tokens`); a block another request
    had already cached, or a Host-only block given a Device copy, is not counted.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cached_prefix_tokens: int = 0
    restored_host_bytes: int = 0
    cache_creation_tokens: int = 0


@dataclass(slots=True)
class Metrics:
    """Timings of one request, in seconds.

    restore_s: how long the request's Host restore ran on the restore stream, from its first
    copy to its last (CUDA only; 0.0 on the CPU or without a Host hit). It overlaps the first
    prefill pass, so it is part of ttft_s, not added to it.
    suspensions: how often the request was suspended because the KV pool could not extend it,
    and resumed from its snapshot when pages allowed (a count, not seconds; its tokens are those
    of an uninterrupted run).
    """

    queued_s: float = 0.0
    ttft_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    restore_s: float = 0.0
    suspensions: int = 0


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    error: str | None = None
    logprobs: list[dict[int, float]] | None = None
    usage: Usage = field(default_factory=Usage)
    metrics: Metrics = field(default_factory=Metrics)
    stop_string: str | None = None  # the stop string that ended the text (finish_reason "stop")

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class StreamDelta:
    """One streamed event: new tokens and their text since the previous event.

    `usage` is set on a request's first delta only: its prompt split as its first token fixes
    it (prompt and cached tokens from admission, cache-created tokens once the prompt's blocks
    are committed: the figures its final output reports, unless it is suspended later and
    re-prefills evicted prompt blocks); `completion_tokens` counts the tokens generated so far.
    A server can announce the split before any text (Anthropic's `message_start`)."""

    request_id: str
    token_ids: list[int]
    text: str
    usage: Usage | None = None


def _show(value: object) -> str:
    """A bounded repr for error messages (a hostile value may be huge)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _int_field(name: str, value: object, lo: int | None, hi: int | None, rule: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer {rule}, got {_show(value)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"{name} must be an integer {rule}, got {_show(value)}")
    return int(value)


def _float_field(
    name: str, value: object, lo: float, hi: float, *, low_open: bool = False
) -> float:
    rule = f"{'(' if low_open else '['}{lo:g}, {hi:g}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a finite number in {rule}, got {_show(value)}")
    try:
        x = float(value)
    except OverflowError:
        raise ValueError(f"{name} must be a finite number in {rule}, got {_show(value)}") from None
    ok = math.isfinite(x) and (lo < x if low_open else lo <= x) and x <= hi
    if not ok:
        raise ValueError(f"{name} must be a finite number in {rule}, got {_show(value)}")
    return x


def _text_ok(s: str) -> bool:
    try:
        s.encode("utf-8")  # lone surrogates cannot be encoded (nor matched in decoded text)
    except UnicodeEncodeError:
        return False
    return True


def _stop_field(stop: object) -> tuple[str, ...] | None:
    if stop is None:
        return None
    items = (stop,) if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)):
        raise ValueError(
            f"stop must be a non-empty string or a list of them, got {type(stop).__name__}"
        )
    if len(items) > MAX_STOP_STRINGS:
        raise ValueError(f"stop: at most {MAX_STOP_STRINGS} strings, got {len(items)}")
    for s in items:
        if not isinstance(s, str) or not s or not _text_ok(s):
            raise ValueError(f"stop must hold non-empty, valid UTF-8 strings, got {_show(s)}")
    return tuple(items)


def _stop_ids_field(ids: object) -> tuple[int, ...] | None:
    if ids is None:
        return None
    if not isinstance(ids, (list, tuple)):
        raise ValueError(f"stop_token_ids must be a list of integers, got {type(ids).__name__}")
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise ValueError(f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} ids, got {len(ids)}")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int):
            raise ValueError(f"stop_token_ids must be a list of integers, got {_show(t)}")
    return tuple(ids)
