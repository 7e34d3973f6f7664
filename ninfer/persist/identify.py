"""Whether the file at `prefix_cache_file` is one a save may replace (design §5.5).

A save replaces the file whole, so a path that names something else (a typo, a swapped flag:
notes, a config, a model's weights) would lose it. Only a ninfer prefix cache file (its magic,
whatever its version or damage), an empty file or no file at all may be replaced; anything else
is described in a few words, for the refusal. Reads at most the first 4 KiB; pure Python.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path

from ninfer.persist.tables import MAGIC

_PEEK = 4096


def foreign(path: Path) -> str | None:
    """None when a save may replace `path`: absent, empty, or a ninfer prefix cache file (its
    magic, whatever its version or damage; a file shorter than the magic that begins it).
    Otherwise a few words on what it holds ("2.1 kB, text"). Opens without blocking and reads
    only a regular file; one it cannot read is foreign too (nothing vouches for it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"it cannot be read: {e.strerror or e}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        head = os.pread(fd, _PEEK, 0)
    except OSError as e:
        return f"it cannot be read: {e.strerror or e}"
    finally:
        os.close(fd)
    if not head or head[: len(MAGIC)] == MAGIC[: len(head)]:
        return None
    return describe(head, info.st_size)


def describe(head: bytes, size: int) -> str:
    """A few words on a file from its first bytes and size: "2.1 kB of text"."""
    return f"{_size(size)}, {_kind(head, size)}"


def _kind(head: bytes, size: int) -> str:
    if len(head) >= 9 and head[8:9] == b"{":
        (n,) = struct.unpack_from("<Q", head)
        if 8 + n <= size:
            return "safetensors weights"
    if head.startswith(b"GGUF"):
        return "GGUF weights"
    if head.startswith(b"PK\x03\x04"):
        return "a ZIP archive (a PyTorch checkpoint?)"
    text = _text(head, complete=len(head) == size)
    if text is None:
        return "binary"
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        if len(head) < size:
            return "JSON"
        try:
            json.loads(text)
        except ValueError:
            return "text"
        return "JSON"
    return "text"


def _text(head: bytes, complete: bool) -> str | None:
    """`head` as UTF-8 text (a character cut at the end of a partial read allowed), or None."""
    if b"\x00" in head:
        return None
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as e:
        if complete or e.start < len(head) - 3:
            return None
        return head[: e.start].decode("utf-8")


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
