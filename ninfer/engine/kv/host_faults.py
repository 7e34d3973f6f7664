"""Host-tier fault containment: a Host copy or slab allocation that raised is undone, and the
entries it hit lose their Host copy (they stay Device-only; engine/faults.py has the whole rule).

The undo itself is the prefix index's (`PrefixIndex.abort_write_through`, `abort_restore`:
Filling -> Absent instead of Filling -> Resident); it runs on the engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable

from ninfer.cache.host_pool import HostSlabPool, SlabGeometry
from ninfer.engine.faults import is_fatal


class HostRestoreFault(Exception):
    """A Host->Device restore call raised; the batch was not (fully) issued."""

    def __init__(self, batch_id: int, lane_slot: int, cause: BaseException) -> None:
        super().__init__(f"Host restore of batch {batch_id} failed: {cause!r}")
        self.batch_id = batch_id
        self.lane_slot = lane_slot
        self.cause = cause


class GuardedTransfer:
    """A Host-tier `memory.transfer.Transfer` whose raising copy calls are contained.

    A write (Device->Host) that raises is undone at once through `on_write_failed(batch_id)`
    (the entries stay Device-only); a restore (Host->Device) that raises becomes a
    `HostRestoreFault` for the engine to undo (it knows the lane). Before either, the copy
    streams are drained so that no half-issued copy still writes a page or slab that is about
    to be reused. A fatal fault is re-raised as it is."""

    def __init__(self, inner, on_write_failed, streams) -> None:
        self.inner = inner
        self.host_bytes = inner.host_bytes
        self._on_write_failed = on_write_failed
        self._streams = streams

    def restore(self, batch, lane_slot: int):
        try:
            return self.inner.restore(batch, lane_slot)
        except Exception as e:
            if is_fatal(e):
                raise
            self._quiesce()
            raise HostRestoreFault(batch.batch_id, lane_slot, e) from e

    def write_blocks(self, batch) -> None:
        self._write(lambda: self.inner.write_blocks(batch), batch.batch_id)

    def write_snapshot(self, write, phys_slot: int) -> None:
        self._write(lambda: self.inner.write_snapshot(write, phys_slot), write.batch_id)

    def _write(self, start: Callable[[], object], batch_id: int) -> None:
        """Start a write-through; if it raises (not fatally), the streams are quiesced and the
        batch is reported failed, for the index to undo."""
        try:
            start()
        except Exception as e:
            if is_fatal(e):
                raise
            self._quiesce()
            self._on_write_failed(batch_id, e)

    def poll(self):
        return self.inner.poll()

    def drain(self):
        return self.inner.drain()

    def _quiesce(self) -> None:
        for stream in (self._streams.restore, self._streams.transfer):
            if stream is not None:
                stream.synchronize()


class GuardedHostPool(HostSlabPool):
    """The index's HostSlabPool whose `allocate` never raises: a raising allocation reports
    "no slabs" (the entry stays Device-only) and calls `on_fault`. The KV state hands it to
    the index it builds (`PrefixIndex(host_pool=...)`), so the guard is there from the start."""

    __slots__ = ("_on_fault",)

    def __init__(self, geometry: SlabGeometry, on_fault: Callable[[BaseException], None]) -> None:
        super().__init__(geometry)
        self._on_fault = on_fault

    def allocate(self, k: int) -> list[int] | None:
        try:
            return super().allocate(k)
        except Exception as e:
            if is_fatal(e):
                raise
            self._on_fault(e)
            return None
