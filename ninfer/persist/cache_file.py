"""The Host tier across restarts (design §5.5, `prefix_cache_file`): the engine's glue.

    LLM(...)        resolve_path(): absolute path; anything but a regular file (or nothing), or a
                    missing parent -> ValueError (only stat()ed: a FIFO is never opened); a
                    file that is neither empty nor a ninfer cache file (identify.py: its magic)
                    -> ValueError saying what it looks like, since the save would replace it
                    PrefixCacheFile(path, fingerprint(...)).acquire(): the path's lock (an
                    exclusive flock on `.NAME.lock` beside it, deleted at release) for the
                    engine's lifetime -> ValueError when another engine holds it; then the
                    temporary files a killed save left are deleted
    Engine.__init__ load(kv_state): before the loop starts, so before any request
                      decode header + tables (tables.py) -> fingerprint / geometry / size
                      checks -> plan (all, or densest snapshots first; plan.py) -> rebuild
                      entries Host-only in the index -> read only their slabs (payload.py)
                      a damaged file or another engine's: one warning, nothing restored,
                      index reset empty (`KVState.reset_index`; the save replaces it)
    Engine stop     every lane released ("abort"), every Host write drained, requests answered,
                    then save(kv_state): collect -> temp file -> fsync -> os.replace
    abandon()       thread-safe; the save stops before its next slab batch or before the rename
                    and deletes its temporary file (a save not begun never begins)
    release()       LLM.close(): the lock is released (the process's exit releases it too)

Logs go to the "ninfer.cache" logger: "loading prefix cache ...", "prefix cache read | bytes |
time | rate", what was restored (or why not), and the save's "prefix cache saved | ...".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ninfer.config import MemoryGeometry, Persistence
from ninfer.persist.fingerprint import fingerprint
from ninfer.persist.identify import foreign
from ninfer.persist.lock import drop_lock, take_lock
from ninfer.persist.payload import (
    BATCH_BYTES,
    IoResult,
    check_regular,
    read_payload,
    save_file,
    stale_temps,
)
from ninfer.persist.plan import collect, describe_plan, needed_mib, plan_restore, rebuild
from ninfer.persist.tables import check_compatible, decode, encode

logger = logging.getLogger("ninfer.cache")


def resolve_path(path: str | os.PathLike) -> Path:
    """The absolute path of `prefix_cache_file`; ValueError for a directory or a missing parent
    directory (an unusable location fails before any caching), and for a file the save would
    replace that is not a ninfer prefix cache file (nor empty): its content would be lost."""
    p = Path(path).expanduser().resolve()
    check_regular(p)  # a directory, device, FIFO or socket is refused without opening it
    if not p.parent.is_dir():
        raise ValueError(f"prefix_cache_file: directory {str(p.parent)!r} does not exist")
    what = foreign(p)
    if what is not None:
        raise ValueError(
            f"prefix_cache_file: {str(p)!r} is not a ninfer prefix cache file ({what}) and the "
            f"save at shutdown would replace it: give another path, or delete the file"
        )
    return p


def _gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 10**7 else f"{n / 1e6:.3f} MB"


# ---- the file -----------------------------------------------------------------------------


class PrefixCacheFile:
    """One engine's `prefix_cache_file`: load at construction, save at the orderly stop."""

    def __init__(self, path: Path, fingerprint: dict) -> None:
        self.path = Path(path)
        self.fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True))  # as stored
        self._abandon = threading.Event()
        self.last_save: IoResult | None = None
        self.last_load: IoResult | None = None
        self.batch_bytes = BATCH_BYTES  # staging per slab batch (abandon is checked per batch)
        self._lock_fd: int | None = None

    def acquire(self) -> PrefixCacheFile:
        """Take the path's lock for the engine's lifetime (ValueError when another engine has
        it), then delete the temporary files a killed save of this path left."""
        if self._lock_fd is None:
            self._lock_fd = take_lock(self.path)
        for tmp in stale_temps(self.path):  # the lock is ours: no save of this path runs
            with contextlib.suppress(OSError):
                tmp.unlink()
                logger.info("removed %s, left by an interrupted save", tmp)
        return self

    def release(self) -> None:
        """Release the path's lock (idempotent; LLM.close after the save)."""
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None  # (a failed __init__)
        if fd is not None:
            drop_lock(self.path, fd)

    def __del__(self) -> None:
        self.release()

    # ---- abandon (any thread) ------------------------------------------------------------
    def abandon(self) -> None:
        """Stop a running save before its next slab batch or its rename (its temporary file is
        deleted, the previous file stays); a save not yet begun never begins."""
        self._abandon.set()

    @property
    def abandoned(self) -> bool:
        return self._abandon.is_set()

    # ---- load (engine construction) ------------------------------------------------------
    def load(self, kv_state) -> int:
        """Restore what fits of the file into the empty Host tier; returns snapshots restored.
        Never raises for a bad file: it logs one warning and restores nothing."""
        index, slabs = kv_state.index, kv_state.host_slabs
        if not self._readable(index, slabs):
            return 0
        size = self.path.stat().st_size
        logger.info("loading prefix cache %s (%s)", self.path, _gb(size))
        t0 = time.perf_counter()
        changed = False
        try:
            with open(self.path, "rb") as f:
                tables = decode(f, size)
                geometry = slabs.geometry
                check_compatible(tables, self.fingerprint, geometry)
                plan = plan_restore(
                    tables,
                    index.host.free_slabs,
                    geometry,
                    index.cost.prefill_seconds,
                    index.cost.restore_seconds,
                )
                if not plan.snapshots:
                    if tables.snapshots:
                        self._none_fit(plan, tables, geometry, index.host.n_slabs)
                    return 0
                changed = True
                pairs = rebuild(index, tables, plan)
                nbytes = read_payload(
                    f, tables.payload_offset, slabs, pairs, tables.slab_sums, self.batch_bytes
                )
        except (ValueError, OSError, KeyError, TypeError) as e:
            if changed:
                kv_state.reset_index()  # nothing half-restored
            self._not_used(e)
            return 0
        self.last_load = IoResult(nbytes, time.perf_counter() - t0)
        self._report(plan, tables, geometry, index.host.n_slabs)
        return len(plan.snapshots)

    def _readable(self, index, slabs) -> bool:
        """Whether there is a Host tier and a regular file to load (logged when not; a path
        that is no longer a regular file is neither read nor saved)."""
        if index is None or index.host is None or slabs is None:
            logger.warning(
                "prefix_cache_file %s: no Host tier is running, the file is neither read nor saved",
                self.path,
            )
            return False
        if not self.path.exists():
            logger.info(
                "prefix cache file %s does not exist yet: it is saved at shutdown", self.path
            )
            return False
        try:
            check_regular(self.path)  # replaced since construction: never open a FIFO
        except ValueError as e:
            logger.warning("%s; it is neither read nor saved", e)
            self.abandon()
            return False
        what = foreign(self.path)  # refused at construction; something may have replaced it
        if what is not None:
            logger.warning(
                "prefix cache file %s is not a ninfer prefix cache file (%s); it is neither "
                "read nor replaced",
                self.path,
                what,
            )
            return False
        return True

    def _report(self, plan, tables, geometry, n_slabs: int) -> None:
        r = self.last_load
        rate = r.gb_per_s
        logger.info("prefix cache read | %s | %.3f s | %.2f GB/s", _gb(r.bytes), r.seconds, rate)
        if plan.complete:
            logger.info(
                "prefix cache restored: %d snapshots, %d blocks (%d slabs)",
                len(plan.snapshots),
                len(plan.blocks),
                plan.slabs,
            )
        else:
            logger.warning(
                "prefix cache partly restored: %s; this one holds %d MiB",
                describe_plan(plan, tables, geometry.slab_bytes),
                needed_mib(n_slabs, geometry.slab_bytes),
            )

    def _not_used(self, why: Exception) -> None:
        """The one warning of a load that found the file unusable (`why`)."""
        logger.warning(
            "prefix cache file %s not used: %s; the save at shutdown replaces it", self.path, why
        )

    def _none_fit(self, plan, tables, geometry, n_slabs: int) -> None:
        logger.warning(
            "prefix cache not restored: the Host tier (%d MiB) holds none of the file's %d "
            "snapshots (the smallest needs %d MiB, the whole file %d MiB); the save at "
            "shutdown replaces the file",
            needed_mib(n_slabs, geometry.slab_bytes),
            len(tables.snapshots),
            needed_mib(plan.min_slabs, geometry.slab_bytes),
            needed_mib(plan.file_slabs, geometry.slab_bytes),
        )

    # ---- save (the engine's orderly stop, on the engine thread) ---------------------------
    def save(self, kv_state) -> IoResult | None:
        """Write every retained Host-resident snapshot with its Host-resident path (call after
        every lane was released and every Host write drained). None when there is no Host tier,
        the save was abandoned, or it failed (logged; the previous file stays)."""
        index, slabs = kv_state.index, kv_state.host_slabs
        if index is None or index.host is None or slabs is None:
            return None
        if not self._may_save():
            return None
        meta = {"fingerprint": self.fingerprint, "geometry": slabs.geometry.file_dict()}
        chosen = collect(index, meta)
        tables = chosen.tables
        logger.info(
            "saving prefix cache %s: %d snapshots, %d blocks",
            self.path,
            len(tables.snapshots),
            len(tables.blocks),
        )
        result = self._write(slabs, chosen)
        if result is None:
            return None
        self.last_save = result
        logger.info(
            "prefix cache saved | %s | %.3f s | %.2f GB/s | %d snapshots, %d blocks",
            _gb(result.bytes),
            result.seconds,
            result.gb_per_s,
            len(tables.snapshots),
            len(tables.blocks),
        )
        return result

    def _may_save(self) -> bool:
        """False (logged) when the save was abandoned before it began or the path no longer
        holds a ninfer prefix cache file."""
        if self.abandoned:
            logger.warning("prefix cache save abandoned before it began; %s unchanged", self.path)
            return False
        what = foreign(self.path)  # refused at construction; something may have replaced it
        if what is not None:
            logger.error(
                "prefix cache not saved: %s is no longer a ninfer prefix cache file (%s); it is "
                "left as it is",
                self.path,
                what,
            )
            return False
        return True

    def _write(self, slabs, chosen) -> IoResult | None:
        """`chosen` (what `collect` picked) written to the file; None (logged) when the write
        failed or was abandoned, the previous file kept."""
        tables = chosen.tables

        def head(sums: list[int]) -> bytes:
            tables.slab_sums = sums
            return encode(tables)

        try:
            result = save_file(
                self.path, slabs, chosen.sources, head, lambda: self.abandoned, self.batch_bytes
            )
        except OSError as e:
            logger.error(
                "prefix cache save to %s failed: %s; the previous file stays", self.path, e
            )
            return None
        except Exception:  # a bug must not lose the previous file or hang the stop
            logger.exception("prefix cache save to %s failed; the previous file stays", self.path)
            return None
        if result is None:
            logger.warning("prefix cache save abandoned; %s keeps the previous file", self.path)
        return result


def for_engine(
    persistence: Persistence,
    memory: MemoryGeometry,
    model_config,
    ops,
    identity: Callable[[], dict],
) -> PrefixCacheFile | None:
    """The engine's PrefixCacheFile, or None without `persistence.prefix_cache_file`.
    `identity`: a callable returning the model's identity (`path_identity` of the checkpoint
    folder, `model_identity` of an in-memory model), called only when there is a file."""
    if persistence.prefix_cache_file is None:
        return None
    fp = fingerprint(identity(), memory, model_config, type(ops).__name__)
    return PrefixCacheFile(resolve_path(persistence.prefix_cache_file), fp).acquire()
