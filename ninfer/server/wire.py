"""What both wire formats share: sampling parameters, request ids, the reply parser's setup."""

from __future__ import annotations

import math
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
