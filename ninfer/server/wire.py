"""What both wire formats share: sampling parameters, request ids, the reply parser's setup,
media content parts."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from ninfer.request import SamplingParams, StructuredOutputsParams
from ninfer.server.errors import ApiError
from ninfer.vision.parts import image_part, media_kind, refusal

MAX_N = 16
MAX_TOP_LOGPROBS = 20


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


def media_part(part, at: str, supports_images: bool) -> dict | None:
    """A content part that carries media, normalised (`vision.parts.image_part`: an image
    decoded from a data: URL or base64, never from a file or a remote URL); None for any other
    part. An ApiError naming the part (`at`) when the model cannot take its medium or the
    image cannot be read."""
    kind = media_kind(part)
    if kind is None:
        return None
    why = refusal(kind, at, supports_images)
    if why is not None:
        raise ApiError(why, at)
    try:
        return image_part(part, at)
    except ValueError as e:
        raise ApiError(str(e), at) from None


MAX_WIRE_TEMPERATURE = 2.0  # OpenAI's range is [0, 2] (Anthropic's [0, 1]: anthropic_api.py)
SEED_MASK = 0x7FFF_FFFF_FFFF_FFFF  # any integer seed is taken, folded into 63 bits


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sampling_params(
    *,
    max_tokens: int | None,
    max_tokens_field: str,
    remaining: int,
    temperature=None,
    top_p=None,
    top_k=None,
    min_p=None,
    seed=None,
    stop=None,
    stop_token_ids=None,
    logprobs: int | None = None,
    ignore_eos: bool = False,
    structured: StructuredOutputsParams | None = None,
    thinking_token_budget: int | None = None,
) -> SamplingParams:
    """The checked SamplingParams (`SamplingParams.validated`, the one set of rules) of wire
    fields, every bad value an ApiError naming its field. The wire adds only its defaults (a
    field left out takes the engine's default; max_tokens `remaining`, the context left after
    the prompt), its aliases (top_k 0 is off; any integer seed, folded into 63 bits) and
    OpenAI's temperature range."""
    if max_tokens is None:
        max_tokens = max(remaining, 1)
    if _is_int(top_k) and top_k == 0:
        top_k = -1
    if _is_int(seed):
        seed &= SEED_MASK
    if isinstance(stop, str):
        stop = [stop] if stop else None  # "" names no stop string, as [] does
    given = dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
    params = SamplingParams(
        max_tokens=max_tokens,
        stop=stop or None,
        stop_token_ids=None if stop_token_ids == [] else stop_token_ids,
        logprobs=logprobs,
        ignore_eos=ignore_eos,
        structured_outputs=structured,
        thinking_token_budget=thinking_token_budget,
        **{name: value for name, value in given.items() if value is not None},
    )
    try:
        checked = params.validated()
    except ValueError as e:
        text = str(e)
        name = text.split(" ", 1)[0]
        if name == "max_tokens":  # named as the client sent it (max_completion_tokens)
            name, text = max_tokens_field, max_tokens_field + text[len(name) :]
        raise ApiError(text, name) from None
    if checked.temperature > MAX_WIRE_TEMPERATURE:
        raise ApiError(
            f"temperature must be in [0.0, {MAX_WIRE_TEMPERATURE}], got {temperature!r}",
            "temperature",
        )
    return checked


def siblings(params: SamplingParams, n: int) -> list[SamplingParams]:
    """n choices of one prompt: distinct seeds when the caller fixed one (else the engine's)."""
    from dataclasses import replace

    if n == 1:
        return [params]
    seeds = [None if params.seed is None else params.seed + i for i in range(n)]
    return [replace(params, seed=s) for s in seeds]


def check_max_tokens(max_tokens, field: str, max_model_len: int) -> None:
    """A reply may not ask for more tokens than the model's context length."""
    if _is_int(max_tokens) and max_tokens > max_model_len:
        raise ApiError(
            f"{field}: {max_tokens} is more than the model's context length "
            f"(max_model_len={max_model_len})",
            field,
        )


def check_room(n: int, max_tokens: int, field: str, room: int) -> None:
    """n replies of up to `max_tokens` each must fit in `room` KV tokens (the engine's capacity
    less the prompt): a request that asks for more could never run to its end."""
    if n * max_tokens > room:
        raise ApiError(
            f"n x {field} = {n} x {max_tokens} is more than the {room} tokens the engine holds "
            f"beside the prompt; ask for fewer",
            field,
        )


def check_n(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise ApiError(f"n must be an integer in [1, {MAX_N}], got {n!r}", "n")
    return n


def token_text(tokenizer, token_id: int) -> str:
    return tokenizer.token_text(token_id) if tokenizer is not None else ""


# ---- structured outputs -----------------------------------------------------------------------
# vLLM's extra fields over both OpenAI routes, each one StructuredOutputsParams kind
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}  # fmt: skip


@dataclass(slots=True)
class Structured:
    """A request's structured output: the spec, and the wire field its errors name."""

    spec: StructuredOutputsParams
    field: str


def openai_structured(extra: dict) -> Structured | None:
    """`response_format` (text | json_object | json_schema) or vLLM's `structured_outputs` /
    `guided_*` fields of an OpenAI request (`extra`: its fields by name); at most one."""
    found: list[Structured] = []
    fmt = extra.get("response_format")
    if fmt is not None:
        try:
            spec = StructuredOutputsParams.from_response_format(fmt)
        except ValueError as e:
            raise ApiError(str(e), str(e).split(" ", 1)[0]) from None
        if spec is not None:
            field = "response_format" if spec.json_object else "response_format.json_schema.schema"
            found.append(Structured(spec, field))
    so = extra.get("structured_outputs")
    if so not in (None, {}):
        try:
            spec = StructuredOutputsParams.from_dict(so)
            kind, _ = spec.kind()
        except ValueError as e:
            raise ApiError(str(e), "structured_outputs") from None
        found.append(Structured(spec, f"structured_outputs.{kind}"))
    for name, kind in _GUIDED.items():
        if extra.get(name) not in (None, [], ""):
            found.append(Structured(StructuredOutputsParams(**{kind: extra[name]}), name))
    if len(found) > 1:
        names = " and ".join(f.field.split(".")[0] for f in found)
        raise ApiError(f"{names}: set one structured output, not several", found[1].field)
    return found[0] if found else None


def tool_structured(tools: list[dict] | None, choice, parallel: bool = True) -> Structured | None:
    """A tool choice that forces a call ("required" / a named function, OpenAI-form `choice`)
    as the structured output of Qwen3.5's tool-call format (None for auto / none)."""
    if not tools or choice in (None, "auto", "none"):
        return None
    from ninfer.structured import tool_call_tag

    name = "required" if choice == "required" else choice["function"]["name"]
    try:
        tag = tool_call_tag(tools, name, parallel)
    except ValueError as e:
        field = str(e).split(":", 1)[0]
        raise ApiError(str(e), field) from None
    return Structured(StructuredOutputsParams(structural_tag=tag), "tools")


def one_structured(*found: Structured | None) -> Structured | None:
    """The request's one structured output; ApiError when two fields ask for one."""
    given = [f for f in found if f is not None]
    if len(given) > 1:
        raise ApiError(
            f"{given[1].field}: a forced tool call and {given[0].field} cannot both constrain "
            "the reply",
            given[1].field,
        )
    return given[0] if given else None
