"""Response bodies as JSON text, built so that the server's other threads keep running.

A reply of many choices with top logprobs runs to megabytes. One call of the C encoder would
hold the GIL (and stall the engine thread and the event loop) for all of it, the pure-Python
encoder for ten times as long; so `json_bytes` encodes long lists element by element, each
piece one short C call. A part that would otherwise be a large graph of dicts and lists (the
top logprobs of every token) is built as text at once (`RawJson`): strings are not tracked by
the garbage collector, so a reply's size does not lengthen the collector's full passes, which
hold the GIL too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

_ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode
_PIECE_ITEMS = 32  # a list longer than this is encoded element by element, as is one that
# holds a dict or a list (a RawJson may be inside it)


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
