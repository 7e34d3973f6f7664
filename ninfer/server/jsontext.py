"""Response bodies as JSON text, built so that the server's other threads keep running.

A reply of many choices with top logprobs runs to megabytes. One call of the C encoder would
hold the GIL (and stall the engine thread and the event loop) for all of it, the pure-Python
encoder for ten times as long; so `json_bytes` encodes long lists element by element, each
piece one short C call. A part that would otherwise be a large graph of dicts and lists (the
top logprobs of every token) is built as text at once (`RawJson`): strings are not tracked by
the garbage collector, so a reply's size does not lengthen the collector's full passes, which
hold the GIL too.

Short C calls are not enough: a thread that keeps the GIL busy in Python code gives it up
every switch interval, but the engine thread and the event loop, which release it at every
GPU wait and socket call, then wait up to a whole interval for it each time, and a reply's
build stretched their steps into one long stall. So the builders `pause` (sleep, GIL
released) every `PAUSE_EVERY` tokens, and the others run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

_ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode
_PIECE_ITEMS = 32  # a list longer than this is encoded element by element, as is one that
# holds a dict or a list (a RawJson may be inside it)


PAUSE_EVERY = 32  # tokens of a reply's logprobs built between two pauses
PAUSE_S = 0.0005


def pause() -> None:
    """Let the process's other threads run (module docstring)."""
    time.sleep(PAUSE_S)


class RawJson(str):
    """JSON text that `json_bytes` places in a body as it is."""

    __slots__ = ()


def encode(value) -> str:
    """`value` as JSON text, as `json.dumps` writes it (no NaN or Infinity; non-ASCII kept)."""
    return _ENCODE(value)


def json_bytes(body: dict) -> bytes:
    """A response body as UTF-8 JSON, long lists encoded piece by piece (module docstring)."""
    return "".join(_json_pieces(body)).encode()


def _json_pieces(value) -> Iterator[str]:
    if isinstance(value, RawJson):
        yield value
    elif isinstance(value, dict):
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            yield ("," if i else "") + _ENCODE(str(key)) + ":"
            yield from _json_pieces(item)
        yield "}"
    elif isinstance(value, list) and (len(value) > _PIECE_ITEMS or _nests(value)):
        yield "["
        for i, item in enumerate(value):
            if i:
                yield ","
            yield from _json_pieces(item)
        yield "]"
    else:
        yield _ENCODE(value)


def _nests(items: list) -> bool:
    return any(isinstance(item, (dict, list)) for item in items)
