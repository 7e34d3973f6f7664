"""What both wire formats share: sampling parameters, request ids, the reply parser's setup."""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass

from ninfer.request import SamplingParams, StructuredOutputsParams
from ninfer.server.errors import ApiError

MAX_N = 16
MAX_TOP_LOGPROBS = 20


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


def _number(name: str, value, lo: float | None = None, hi: float | None = None):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(f"{name} must be a finite number, got {value!r}", name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ApiError(f"{name} must be in [{lo}, {hi}], got {value!r}", name)
    return value


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
    logprobs: int | None = None,
    ignore_eos: bool = False,
    structured: StructuredOutputsParams | None = None,
) -> SamplingParams:
    """SamplingParams from wire fields, every bad value an ApiError naming its field.
    `remaining`: context left after the prompt (the default and the cap of max_tokens)."""
    if max_tokens is None:
        max_tokens = max(remaining, 1)
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ApiError(f"{max_tokens_field} must be an integer >= 1", max_tokens_field)
    _number("temperature", temperature, 0.0, 2.0)
    _number("top_p", top_p, 0.0, 1.0)
    _number("min_p", min_p, 0.0, 1.0)
    if top_p is not None and top_p <= 0:
        raise ApiError("top_p must be in (0, 1]", "top_p")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
        raise ApiError("top_k must be an integer", "top_k")
    if top_k is not None and top_k < 1 and top_k not in (0, -1):
        raise ApiError("top_k must be -1 or 0 (off) or >= 1", "top_k")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (
        not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)
    ):
        raise ApiError("stop must be a non-empty string or a list of non-empty strings", "stop")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ApiError("seed must be an integer", "seed")
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        top_k=-1 if top_k in (None, 0) else top_k,
        min_p=0.0 if min_p is None else float(min_p),
        seed=None if seed is None else seed & 0x7FFF_FFFF_FFFF_FFFF,
        stop=stop or None,
        logprobs=logprobs,
        ignore_eos=ignore_eos,
        structured_outputs=structured,
    )
    try:
        params.validate()
    except ValueError as e:
        raise ApiError(str(e), str(e).split(" ", 1)[0]) from None
    return params


def siblings(params: SamplingParams, n: int) -> list[SamplingParams]:
    """n choices of one prompt: distinct seeds when the caller fixed one (else the engine's)."""
    from dataclasses import replace

    if n == 1:
        return [params]
    seeds = [None if params.seed is None else params.seed + i for i in range(n)]
    return [replace(params, seed=s) for s in seeds]


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
