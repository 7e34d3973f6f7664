"""The lock of a prefix cache file: one engine per path (design §5.5).

An exclusive, non-blocking flock on `.NAME.lock` beside the file, held for the engine's
lifetime and deleted when it lets go; a second engine asking for the same path gets a
ValueError naming the holder's pid.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def lock_path(path: Path) -> Path:
    """The lock file of `path`: beside it, hidden, present while an engine holds the path."""
    return path.with_name(f".{path.name}.lock")


def take_lock(path: Path) -> int:
    """An exclusive, non-blocking flock on `path`'s lock file; returns its descriptor.
    ValueError naming the holder when another engine (of this or another process) has it.

    The holder deletes the lock file when it lets go (`drop_lock`), so a process may lock a
    file that was just deleted: after locking, the descriptor's inode must still be the path's,
    else it tries again on the new file."""
    import fcntl

    lock = lock_path(path)
    for _ in range(100):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:  # a read-only directory, say
            raise ValueError(
                f"prefix_cache_file: cannot create its lock file {str(lock)!r}: {e}"
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                holder = os.pread(fd, 64, 0).decode().strip()
            os.close(fd)
            who = f" (pid {holder})" if holder else ""
            raise ValueError(
                f"prefix_cache_file: {str(path)!r} is in use by another engine{who}; give "
                f"each engine its own file"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except OSError:
            same = False
        if same:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)  # its holder deleted it while we locked: lock the new one
    raise ValueError(f"prefix_cache_file: could not lock {str(lock)!r}")


def drop_lock(path: Path, fd: int) -> None:
    """Delete the lock file, then unlock (in this order: see take_lock)."""
    with contextlib.suppress(OSError):
        os.unlink(lock_path(path))
    with contextlib.suppress(OSError):
        os.close(fd)
