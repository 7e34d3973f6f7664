"""What both wire formats share: sampling parameters, request ids, the reply parser's setup."""

from __future__ import annotations

import secrets
import time

from ninfer.request import SamplingParams
from ninfer.server.errors import ApiError

MAX_N = 16
MAX_TOP_LOGPROBS = 20


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


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
    logprobs: int | None = None,
    ignore_eos: bool = False,
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
        stop = [stop]
    given = dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
    params = SamplingParams(
        max_tokens=max_tokens,
        stop=stop or None,
        logprobs=logprobs,
        ignore_eos=ignore_eos,
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
