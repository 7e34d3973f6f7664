"""Slab bytes of the prefix cache file (design §5.5): Host slabs <-> the file's payload.

The file's tables are `tables.py`'s; this module only moves bytes. A file slab is
one Host slab's cells in layer order (slab-major), while a Host chunk is layer-major, so each
batch goes through one contiguous staging buffer:

    save   chunk[c][:, l0:l0+n]  --transpose copy-->  staging [n, n_fa, cell]  --write-->  file
           (a run of consecutive source slabs)         xxh3_64 per slab         (a writer
                                                       (two buffers: gather     thread)
                                                       overlaps the write)
    load   file  --readinto-->  staging [n, n_fa, cell]  --check xxh3-->  chunk[c][:, l0:l0+n]
           (a run of consecutive file slabs)                              (runs of dest slabs)

A save writes a temporary file in the target's directory (placeholder head, payload, then the
real head with the checksums), fsyncs it and renames it into place (`os.replace`), then fsyncs
the directory. Temporary names are unique (`.NAME.tmp-PID-XXXX`, created exclusively), so two
savers never share one; `stale_temps` finds those a killed save left behind. `abandoned()` is
checked before every batch and before the rename: an abandoned or failed save deletes its
temporary file and leaves the previous file untouched.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from ninfer.memory.copy_runs import coalesce_pages
from ninfer.memory.host_slabs import HostSlabs

BATCH_BYTES = 32 << 20
_xxh3 = xxhash.xxh3_64_intdigest


class SlabChecksumError(ValueError):
    """A payload slab does not match its checksum (a damaged file)."""


@dataclass(frozen=True, slots=True)
class IoResult:
    bytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class _Staging:
    """One reusable [n, n_fa, cell] uint8 buffer of about BATCH_BYTES."""

    def __init__(self, slabs: HostSlabs, batch_bytes: int) -> None:
        g = slabs.geometry
        self.per_batch = max(1, batch_bytes // g.slab_bytes)
        self.buf = torch.empty((self.per_batch, g.n_fa_layers, g.cell_bytes), dtype=torch.uint8)
        self.np = self.buf.view(self.per_batch, -1).numpy()
        self.slab_bytes = g.slab_bytes

    def bytes_of(self, i: int, n: int = 1) -> memoryview:
        return memoryview(self.np[i : i + n]).cast("B")


def _runs(slabs: HostSlabs, ids: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """(position in ids, chunk, local slab, count): consecutive ids inside one chunk
    (`coalesce_pages` over (position, slab) pairs)."""
    geom = slabs.geometry
    runs = coalesce_pages(list(enumerate(ids)), geom)
    return [(r.page, *geom.locate(r.slab), r.count) for r in runs]


def write_payload(
    f,
    slabs: HostSlabs,
    sources: Sequence[int],
    abandoned: Callable[[], bool],
    batch_bytes: int = BATCH_BYTES,
) -> list[int] | None:
    """Write the Host slabs `sources`, in order, at the file's current position; return their
    checksums, or None when `abandoned()` turned true before a batch. Two staging buffers: one
    batch is gathered and hashed while a writer thread writes the previous one."""
    stagings = [_Staging(slabs, batch_bytes), _Staging(slabs, batch_bytes)]
    per_batch = stagings[0].per_batch
    sums: list[int] = []
    with ThreadPoolExecutor(1, thread_name_prefix="ninfer-cache-save") as writer:
        pending: Future | None = None
        for k, start in enumerate(range(0, len(sources), per_batch)):
            if abandoned():
                if pending is not None:
                    pending.result()
                return None
            st = stagings[k % 2]  # its previous write was waited for before the last submit
            batch = sources[start : start + per_batch]
            for pos, chunk, local, n in _runs(slabs, batch):
                src = slabs.chunks[chunk][:, local : local + n]
                st.buf[pos : pos + n].copy_(src.transpose(0, 1))
            sums += [_xxh3(st.bytes_of(i)) for i in range(len(batch))]
            if pending is not None:
                pending.result()
            pending = _submit(writer, _write_all, f, st.bytes_of(0, len(batch)))
        if pending is not None:
            pending.result()
    return sums


def _submit(writer: ThreadPoolExecutor, fn, *args) -> Future:
    """writer.submit, or the call inline once the interpreter is shutting down (an `atexit`
    save of an LLM never closed: no new threads may start then)."""
    try:
        return writer.submit(fn, *args)
    except RuntimeError:
        done: Future = Future()
        done.set_result(fn(*args))
        return done


def _write_all(f, view: memoryview) -> None:
    while view:
        n = f.write(view)
        view = view[n:]


def _read_all(f, view: memoryview) -> int:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def read_payload(
    f,
    payload_offset: int,
    slabs: HostSlabs,
    pairs: Sequence[tuple[int, int]],
    sums: Sequence[int],
    batch_bytes: int = BATCH_BYTES,
) -> int:
    """Read file slabs into Host slabs: `pairs` = (file slab, Host slab), sorted by file slab;
    every slab is checked against `sums[file slab]` (SlabChecksumError). Returns bytes read."""
    st = _Staging(slabs, batch_bytes)
    total = 0
    i = 0
    while i < len(pairs):
        # a batch of file slabs that are consecutive in the file: one seek, one readinto
        j = i + 1
        while j < len(pairs) and j - i < st.per_batch and pairs[j][0] == pairs[j - 1][0] + 1:
            j += 1
        n = j - i
        f.seek(payload_offset + pairs[i][0] * st.slab_bytes)
        view = st.bytes_of(0, n)
        if _read_all(f, view) != len(view):
            raise SlabChecksumError("payload shorter than its tables")
        for k in range(n):
            if _xxh3(st.bytes_of(k)) != sums[pairs[i + k][0]]:
                raise SlabChecksumError(f"slab {pairs[i + k][0]} checksum mismatch")
        dest = [d for _, d in pairs[i:j]]
        for pos, chunk, local, cnt in _runs(slabs, dest):
            slabs.chunks[chunk][:, local : local + cnt].copy_(
                st.buf[pos : pos + cnt].transpose(0, 1)
            )
        total += len(view)
        i = j
    return total


def save_file(
    path: Path,
    slabs: HostSlabs,
    sources: Sequence[int],
    head: Callable[[list[int]], bytes],
    abandoned: Callable[[], bool],
    batch_bytes: int = BATCH_BYTES,
) -> IoResult | None:
    """Write `head(sums)` then the payload to a temporary file beside `path` and rename it into
    place. `head` must return the same length for any checksums (it is written twice: a
    placeholder first, the real one after the payload). None when abandoned (the temporary
    file is deleted, `path` untouched); an OSError also deletes it and propagates."""
    if abandoned():
        return None
    check_regular(path)
    t0 = time.perf_counter()
    placeholder = head([0] * len(sources))
    fd, name = tempfile.mkstemp(prefix=f"{temp_prefix(path)}{os.getpid()}-", dir=path.parent)
    tmp = Path(name)
    done = False
    try:
        with open(fd, "wb", buffering=0) as f:
            _write_all(f, memoryview(placeholder))
            sums = write_payload(f, slabs, sources, abandoned, batch_bytes)
            if sums is None:
                return None
            _rewrite_head(f, head(sums), placeholder)
            os.fsync(f.fileno())
            size = f.seek(0, os.SEEK_END)
        if abandoned():
            return None
        os.replace(tmp, path)
        done = True
        _fsync_dir(path.parent)
        return IoResult(size, time.perf_counter() - t0)
    finally:
        if not done:
            with contextlib.suppress(OSError):
                tmp.unlink()


def _rewrite_head(f, real: bytes, placeholder: bytes) -> None:
    """Overwrite the placeholder head at the file's start with the real one, of its length."""
    assert len(real) == len(placeholder), "head length depends on its checksums"
    f.seek(0)
    _write_all(f, memoryview(real))


def temp_prefix(path: Path) -> str:
    """The name prefix of `path`'s temporary files (a hidden file beside it)."""
    return f".{path.name}.tmp-"


def stale_temps(path: Path) -> list[Path]:
    """Temporary files of `path` in its directory (left by a save that was killed): call only
    while holding the path's lock, when no save of it can be running."""
    prefix = temp_prefix(path)
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    return [path.parent / n for n in names if n.startswith(prefix)]


def check_regular(path: Path) -> None:
    """ValueError unless `path` is absent or a regular file (a symlink to one is followed).
    Only stats it: opening a FIFO to look would block."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = _kind(mode)
        raise ValueError(f"prefix_cache_file: {str(path)!r} is {kind}, not a regular file")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
