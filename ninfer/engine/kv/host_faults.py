"""Host-tier fault containment: a Host copy or slab allocation that raised is undone, and the
entries it hit lose their Host copy (they stay Device-only; engine/faults.py has the whole rule).

The undo functions edit the prefix index's records the way its own transitions do
(Filling -> Absent instead of Filling -> Resident); they run on the engine thread only.
"""

from __future__ import annotations

import weakref

from ninfer.cache.common import Residency
from ninfer.cache.host_pool import HostSlabPool
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
        try:
            return self.inner.write_blocks(batch)
        except Exception as e:
            if is_fatal(e):
                raise
            self._quiesce()
            self._on_write_failed(batch.batch_id, e)
            return None

    def write_snapshot(self, write, phys_slot: int) -> None:
        try:
            return self.inner.write_snapshot(write, phys_slot)
        except Exception as e:
            if is_fatal(e):
                raise
            self._quiesce()
            self._on_write_failed(write.batch_id, e)
            return None

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
    "no slabs" (the entry stays Device-only) and calls `on_fault`. Installed by switching the
    pool's class (`guard_host_pool`): the index keeps its object."""

    __slots__ = ()

    def allocate(self, k: int) -> list[int] | None:
        try:
            return super().allocate(k)
        except Exception as e:
            if is_fatal(e):
                raise
            ref = _POOL_FAULTS.get(id(self))
            on_fault = ref() if ref is not None else None
            if on_fault is not None:
                on_fault(e)
            return None


# id(pool) -> a weak reference to its fault callback (a bound method of the KV-state owner: a
# strong one would keep a closed engine's pools, Device memory included, alive)
_POOL_FAULTS: dict[int, weakref.WeakMethod] = {}


def guard_host_pool(pool: HostSlabPool, on_fault) -> None:
    """Make `pool.allocate` contain its faults (see GuardedHostPool)."""
    pool.__class__ = GuardedHostPool
    _POOL_FAULTS[id(pool)] = weakref.WeakMethod(on_fault)  # (a later pool at that id replaces it)


_ABSENT, _FILLING = Residency.ABSENT, Residency.FILLING


def undo_host_write(index, batch_id: int) -> list[int]:
    """A write-through batch that never ran: its nodes and snapshot lose the Host copy they
    were getting (Filling -> Absent, slabs freed, pins dropped); an entry left with no copy is
    deleted as the index deletes it. Returns Device pages freed."""
    b = index.batches.pop(batch_id, None)
    if b is None:
        return []
    index._mutated()
    nodes = index.tree.nodes
    for nid in reversed(b.nodes):
        node = nodes.get(nid)
        if node is None or node.host_state != _FILLING:
            continue
        node.restore_pins -= 1
        index._drop_node_host(node)
    if b.snapshot is not None:
        s = index.snaps.get(b.snapshot)
        if s is not None and s.host_state == _FILLING:
            s.restore_pins -= 1
            index._drop_snapshot_host(s)
    return index._take_freed()


def undo_host_restore(index, batch_id: int) -> list[int]:
    """A restore batch that never (fully) ran: its targets go back to Device-absent (their pages
    freed), the admission that began it is un-staged, and the Host copies it read are dropped
    (the fault may have left them unreadable; an entry without a copy is deleted). Returns
    Device pages freed (the caller also frees the lane's state slot)."""
    b = index.batches.pop(batch_id, None)
    if b is None:
        return []
    index._mutated()
    freed: list[int] = []
    nodes = index.tree.nodes
    for nid in b.nodes:
        node = nodes[nid]
        if node.device_state == _FILLING:
            freed.append(node.device_page)
            node.device_page, node.device_state = -1, _ABSENT
        node.restore_pins -= 1
        index._node_changed(node)
    snap = None
    if b.snapshot is not None:
        snap = index.snaps[b.snapshot]
        if b.tail and snap.tail_device == _FILLING:
            freed.append(snap.tail_page)
            snap.tail_page, snap.tail_device = -1, _ABSENT
        snap.restore_pins -= 1
        index._tail_changed(snap)
    if b.lane is not None and b.lane in index.lanes:
        index.lanes[b.lane].restore_batch = None
        freed += index.cancel_stage(b.lane)
    # Drop the Host copies read (deepest first, so a parent is never deleted under a child).
    for nid in reversed(b.nodes):
        node = nodes.get(nid)
        if node is None or node.host_state == _ABSENT or index._subtree_pinned(node):
            continue
        index._drop_node_host(node)
    live = snap is not None and b.snapshot in index.snaps and not snap.restore_pins
    if live and snap.host_state != _ABSENT:
        index._drop_snapshot_host(snap)
    return freed + index._take_freed()
