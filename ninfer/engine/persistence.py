"""The Host tier across restarts (spec §5.5, `prefix_cache_file`): the engine's glue.

    LLM(...)        resolve_path(): absolute path; anything but a regular file (or nothing), or a
                    missing parent -> ValueError (only stat()ed: a FIFO is never opened)
                    PrefixCacheFile(path, fingerprint(...)).acquire(): the path's lock (an
                    exclusive flock on `.NAME.lock` beside it, deleted at release) for the
                    engine's lifetime -> ValueError when another engine holds it; then the
                    temporary files a killed save left are deleted
    Engine.__init__ load(bridge): before the loop starts, so before any request
                      decode header + tables (ninfer.cache.persist) -> fingerprint / geometry /
                      size checks -> plan (all, or densest snapshots first) -> rebuild entries
                      Host-only in the index -> read only their slabs (ninfer.memory.persist_file)
                      a damaged or foreign file: one warning, nothing restored, index empty
    Engine stop     every lane released ("abort"), every Host write drained, requests answered,
                    then save(bridge): collect -> temp file -> fsync -> os.replace
    abandon()       thread-safe; the save stops before its next slab batch or before the rename
                    and deletes its temporary file (a save not begun never begins)
    release()       LLM.close(): the lock is released (the process's exit releases it too)

Logs go to the "ninfer.cache" logger: "loading prefix cache ...", "prefix cache read | bytes |
time | rate", what was restored (or why not), and the save's "prefix cache saved | ...".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path

from ninfer.cache import persist
from ninfer.memory.persist_file import (
    BATCH_BYTES,
    IoResult,
    check_regular,
    read_payload,
    save_file,
    stale_temps,
)

logger = logging.getLogger("ninfer.cache")


def resolve_path(path: str | os.PathLike) -> Path:
    """The absolute path of `prefix_cache_file`; ValueError for a directory or a missing parent
    directory (an unusable location fails before any caching)."""
    p = Path(path).expanduser().resolve()
    check_regular(p)  # a directory, device, FIFO or socket is refused without opening it
    if not p.parent.is_dir():
        raise ValueError(f"prefix_cache_file: directory {str(p.parent)!r} does not exist")
    return p


def lock_path(path: Path) -> Path:
    """The lock file of `path`: beside it, hidden, present while an engine holds the path."""
    return path.with_name(f".{path.name}.lock")


def _take_lock(path: Path) -> int:
    """An exclusive, non-blocking flock on `path`'s lock file; returns its descriptor.
    ValueError naming the holder when another engine (of this or another process) has it.

    The holder deletes the lock file when it lets go (`_drop_lock`), so a process may lock a
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


def _drop_lock(path: Path, fd: int) -> None:
    """Delete the lock file, then unlock (in this order: see _take_lock)."""
    with contextlib.suppress(OSError):
        os.unlink(lock_path(path))
    with contextlib.suppress(OSError):
        os.close(fd)


# ---- fingerprint ----------------------------------------------------------------------------


def _file_stat(p: Path) -> list:
    st = p.stat()
    return [p.name, st.st_size, st.st_mtime_ns]


def checkpoint_identity(path: str | os.PathLike) -> dict:
    """A checkpoint folder: its absolute path and the size and mtime of config.json and every
    weight file (any rewrite invalidates the file)."""
    from ninfer.models.weights import checkpoint_files

    root = Path(path).expanduser().resolve()
    files = [root / "config.json", *checkpoint_files(root)]
    return {"checkpoint": str(root), "files": [_file_stat(f) for f in files]}


def demo_identity(config_path: Path, seed: int) -> dict:
    """The embedded demo model: a fixed identity, its config's hash and its weights seed."""
    digest = hashlib.sha256(Path(config_path).read_bytes()).hexdigest()
    return {"checkpoint": "ninfer-demo", "config_sha256": digest, "weights_seed": seed}


def model_identity(model) -> dict:
    """An in-memory model (`LLM.from_model`): parameter names, shapes, dtypes and a hash of each
    parameter's first and last 64 KiB (cheap, and tells random seeds apart)."""
    import xxhash

    h = xxhash.xxh3_64()
    for name, p in model.state_dict().items():
        flat = p.detach().reshape(-1)
        h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        n = max(1, 65536 // max(1, flat.element_size()))
        for part in (flat[:n], flat[-n:]):
            h.update(part.float().cpu().numpy().tobytes())
    return {"checkpoint": "in-memory model", "params_xxh3": h.hexdigest()}


def fingerprint(identity: dict, cfg, model_config, ops_name: str) -> dict:
    """What a file must share with the running engine to be used (spec §5.5)."""
    from ninfer import __version__

    config = json.dumps(model_config.to_dict(), sort_keys=True, default=str)
    return {
        "model": identity,
        "model_config_sha256": hashlib.sha256(config.encode()).hexdigest(),
        "dtype": cfg.dtype,
        "kv_dtype": cfg.kv_dtype,
        "rope": [model_config.rope_theta, model_config.partial_rotary_factor],
        "device_type": cfg.device.split(":")[0],
        "ops": ops_name,
        "ninfer_version": __version__,
        "format_version": persist.FORMAT_VERSION,
    }


def _geometry(slabs) -> persist.Geometry:
    g = slabs.geometry
    return persist.Geometry(g.n_fa_layers, g.cell_bytes, g.slab_bytes, g.image_bytes, g.image_slabs)


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
            self._lock_fd = _take_lock(self.path)
        for tmp in stale_temps(self.path):  # the lock is ours: no save of this path runs
            with contextlib.suppress(OSError):
                tmp.unlink()
                logger.info("removed %s, left by an interrupted save", tmp)
        return self

    def release(self) -> None:
        """Release the path's lock (idempotent; LLM.close after the save)."""
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None  # (a failed __init__)
        if fd is not None:
            _drop_lock(self.path, fd)

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
    def load(self, bridge) -> int:
        """Restore what fits of the file into the empty Host tier; returns snapshots restored.
        Never raises for a bad file: it logs one warning and restores nothing."""
        index, slabs = bridge.index, bridge.host_slabs
        if index is None or index.host is None or slabs is None:
            logger.warning(
                "prefix_cache_file %s: no Host tier is running, the file is neither read nor saved",
                self.path,
            )
            return 0
        if not self.path.exists():
            logger.info(
                "prefix cache file %s does not exist yet: it is saved at shutdown", self.path
            )
            return 0
        try:
            check_regular(self.path)  # replaced since construction: never open a FIFO
        except ValueError as e:
            logger.warning("%s; it is neither read nor saved", e)
            self.abandon()
            return 0
        size = self.path.stat().st_size
        logger.info("loading prefix cache %s (%s)", self.path, _gb(size))
        t0 = time.perf_counter()
        changed = False
        try:
            with open(self.path, "rb") as f:
                tables = persist.decode(f, size)
                geometry = _geometry(slabs)
                persist.check_compatible(tables, self.fingerprint, geometry)
                plan = persist.plan_restore(
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
                pairs = persist.rebuild(index, tables, plan)
                nbytes = read_payload(
                    f, tables.payload_offset, slabs, pairs, tables.slab_sums, self.batch_bytes
                )
        except (ValueError, OSError, KeyError, TypeError) as e:
            if changed:
                bridge.index = type(index)(index.config, index.cost)  # nothing half-restored
            logger.warning(
                "prefix cache file %s not used: %s; the save at shutdown replaces it",
                self.path,
                e,
            )
            return 0
        dt = time.perf_counter() - t0
        self.last_load = IoResult(nbytes, dt)
        logger.info(
            "prefix cache read | %s | %.3f s | %.2f GB/s", _gb(nbytes), dt, self.last_load.gb_per_s
        )
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
                persist.describe_plan(plan, tables, geometry.slab_bytes),
                persist.needed_mib(index.host.n_slabs, geometry.slab_bytes),
            )
        return len(plan.snapshots)

    def _none_fit(self, plan, tables, geometry, n_slabs: int) -> None:
        logger.warning(
            "prefix cache not restored: the Host tier (%d MiB) holds none of the file's %d "
            "snapshots (the smallest needs %d MiB, the whole file %d MiB); the save at "
            "shutdown replaces the file",
            persist.needed_mib(n_slabs, geometry.slab_bytes),
            len(tables.snapshots),
            persist.needed_mib(plan.min_slabs, geometry.slab_bytes),
            persist.needed_mib(plan.file_slabs, geometry.slab_bytes),
        )

    # ---- save (the engine's orderly stop, on the engine thread) ---------------------------
    def save(self, bridge) -> IoResult | None:
        """Write every retained Host-resident snapshot with its Host-resident path (call after
        every lane was released and every Host write drained). None when there is no Host tier,
        the save was abandoned, or it failed (logged; the previous file stays)."""
        index, slabs = bridge.index, bridge.host_slabs
        if index is None or index.host is None or slabs is None:
            return None
        if self.abandoned:
            logger.warning("prefix cache save abandoned before it began; %s unchanged", self.path)
            return None
        meta = {"fingerprint": self.fingerprint, "geometry": _geometry(slabs).as_dict()}
        chosen = persist.collect(index, meta)
        tables = chosen.tables

        def head(sums: list[int]) -> bytes:
            tables.slab_sums = sums
            return persist.encode(tables)

        logger.info(
            "saving prefix cache %s: %d snapshots, %d blocks",
            self.path,
            len(tables.snapshots),
            len(tables.blocks),
        )
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


def for_engine(cfg, model_config, ops, identity=None) -> PrefixCacheFile | None:
    """The engine's PrefixCacheFile, or None without `prefix_cache_file`. `identity`: a callable
    returning the model's identity (`LLM.from_model`); None = `cfg.model`'s checkpoint folder,
    or the demo model when that is None."""
    if cfg.prefix_cache_file is None:
        return None
    if identity is not None:
        ident = identity()
    elif cfg.model is None:
        from ninfer.demo import DEMO_DIR, demo_weights_seed

        ident = demo_identity(DEMO_DIR / "config.json", demo_weights_seed)
    else:
        ident = checkpoint_identity(cfg.model)
    fp = fingerprint(ident, cfg, model_config, type(ops).__name__)
    return PrefixCacheFile(resolve_path(cfg.prefix_cache_file), fp).acquire()
