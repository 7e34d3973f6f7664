"""Transfer batches of the PrefixIndex ending (design §7.6, §6.4, §6.6): a restore, prefetch or
write-through batch lands, or never (fully) ran and is undone (the engine's Host-fault
containment). Each drops the pins its batch held.
"""

from __future__ import annotations

from collections.abc import Callable

from ninfer.cache.common import Residency
from ninfer.cache.part import IndexPart

_ABSENT, _RESIDENT, _FILLING = Residency.ABSENT, Residency.RESIDENT, Residency.FILLING


class Transfers(IndexPart):
    """on_restore_landed, on_write_through_landed, abort_write_through and abort_restore of the
    PrefixIndex. `parts` are IndexPart's; `cancel_stage` is the lane lifecycle's (an aborted
    restore cancels the lane it began)."""

    def __init__(self, *parts, cancel_stage: Callable[[int], list[int]]) -> None:
        super().__init__(*parts)
        self._cancel_stage = cancel_stage

    # ---- transfers landing -----------------------------------------------------------------

    def on_restore_landed(self, batch_id: int) -> None:
        """Filling -> Resident for a restore batch's nodes and tail; drops the batch's pins."""
        b = self.registry.batches.pop(batch_id)
        assert b.kind == "restore", f"batch {batch_id} is a {b.kind} batch"
        self.registry.mutated()
        for nid in b.nodes:
            node = self.blocks.tree.nodes[nid]
            node.device_state = _RESIDENT
            node.restore_pins -= 1
            self.blocks.node_changed(node)
        if b.nodes:
            self.blocks.order_path(b.nodes[-1])  # deeper blocks are evicted first (§7.7, §9.1)
        if b.snapshot is not None:
            s = self.snapshots.by_id[b.snapshot]
            if b.tail:
                s.tail_device = _RESIDENT
            s.restore_pins -= 1
            self.blocks.tail_changed(s)
        if b.lane is not None and b.lane in self.registry.lanes:
            self.registry.lanes[b.lane].restore_batch = None

    def on_write_through_landed(self, batch_id: int) -> None:
        """Host Filling -> Resident for a write batch; written nodes/tails become evictable
        (backed), nodes in reverse block order."""
        b = self.registry.batches.pop(batch_id)
        assert b.kind in ("blocks", "snapshot"), f"batch {batch_id} is a {b.kind} batch"
        self.registry.mutated()
        for nid in reversed(b.nodes):
            node = self.blocks.tree.nodes[nid]
            node.host_state = _RESIDENT
            node.restore_pins -= 1
            self.blocks.node_changed(node)
        if b.nodes:
            self.blocks.order_path(b.nodes[-1])  # behind the path's shallower blocks (§7.7 step 2)
        if b.snapshot is not None:
            s = self.snapshots.by_id[b.snapshot]
            s.host_state = _RESIDENT
            s.restore_pins -= 1
            self.host_tier.mark(s.id)
            self.blocks.tail_changed(s)

    # ---- transfers that never ran (the engine's Host-fault containment) ---------------------

    def abort_write_through(self, batch_id: int) -> list[int]:
        """A write batch (blocks or snapshot) that never ran: its nodes and snapshot lose the
        Host copy they were getting (Filling -> Absent, slabs freed, pins dropped); an entry
        left without a copy is deleted (§9.4). Unknown ids are ignored (already undone).
        Returns the Device pages freed."""
        b = self.registry.batches.pop(batch_id, None)
        if b is None:
            return []
        self.registry.mutated()
        nodes = self.blocks.tree.nodes
        for nid in reversed(b.nodes):
            node = nodes.get(nid)
            if node is None or node.host_state != _FILLING:
                continue
            node.restore_pins -= 1
            self.liveness.drop_node_host(node)
        if b.snapshot is not None:
            s = self.snapshots.by_id.get(b.snapshot)
            if s is not None and s.host_state == _FILLING:
                s.restore_pins -= 1
                self.liveness.drop_snapshot_host(s)
        return self.blocks.take_freed()

    def abort_restore(self, batch_id: int) -> list[int]:
        """A restore or prefetch batch that never (fully) ran: its targets go back to
        Device-absent (their pages freed), the staged lane that began it is cancelled, and the
        Host copies it read are dropped (a fault may have left them unreadable; an entry left
        without a copy is deleted, deepest first, never under a pin). Unknown ids are ignored.
        Returns the Device pages freed (the lane's state slot stays the caller's)."""
        b = self.registry.batches.pop(batch_id, None)
        if b is None:
            return []
        self.registry.mutated()
        nodes = self.blocks.tree.nodes
        for nid in b.nodes:
            node = nodes[nid]
            if node.device_state == _FILLING:
                self.blocks.clear_device_copy(node)
            node.restore_pins -= 1
            self.blocks.node_changed(node)
        snap = None
        if b.snapshot is not None:
            snap = self.snapshots.by_id[b.snapshot]
            if b.tail and snap.tail_device == _FILLING:
                self.blocks.free_page(snap.tail_page)
                self.snapshots.clear_tail_device(snap)
            snap.restore_pins -= 1
            self.blocks.tail_changed(snap)
        if b.lane is not None and b.lane in self.registry.lanes:
            self.registry.lanes[b.lane].restore_batch = None
            taken = self._cancel_stage(b.lane)  # it takes the pages freed so far: put them back
            for page in taken:
                self.blocks.free_page(page)
        for nid in reversed(b.nodes):
            node = nodes.get(nid)
            if node is None or node.host_state == _ABSENT or self.liveness.subtree_pinned(node):
                continue
            self.liveness.drop_node_host(node)
        live = snap is not None and b.snapshot in self.snapshots.by_id and not snap.restore_pins
        if live and snap.host_state != _ABSENT:
            self.liveness.drop_snapshot_host(snap)
        return self.blocks.take_freed()
