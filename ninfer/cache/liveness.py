"""Residency bookkeeping shared by the PrefixIndex: counters along paths, Device LRU and dead-KV
membership, supersession's counters, and deletion when a last copy goes (spec §5.3, §9.4).

A mixin: `PrefixIndex` provides the state (`tree`, `snapshots`, `host_tier`, `lru`, `dead`,
`freed`, `counters`, ...). Every helper keeps the §10 invariants that `check_invariants`
verifies; the policy that calls them lives elsewhere.
"""

from __future__ import annotations

from ninfer.cache.common import ROOT, Residency
from ninfer.cache.device_lru import DeviceEntry, EntryKind
from ninfer.cache.snapshots import Snapshot
from ninfer.cache.tree import BlockNode

_ABSENT, _RESIDENT = Residency.ABSENT, Residency.RESIDENT


class LivenessMixin:
    # ---- Device LRU / dead-KV membership -------------------------------------------------

    def _node_changed(self, node: BlockNode) -> None:
        """Re-derive the node's Device LRU and dead-KV membership from its fields."""
        if node.id == ROOT:
            return
        entry = DeviceEntry(EntryKind.NODE, node.id)
        if node.device_state == _RESIDENT and not node.active_refs and not node.restore_pins:
            self.lru.put(entry, node.host_state == _RESIDENT)
        else:
            self.lru.discard(entry)
        self._refresh_dead(node)

    def _refresh_dead(self, node: BlockNode) -> None:
        # Dead KV (§9.3 step 1): Host-resident, no snapshot below, unpinned. A Host-only node is
        # only reclaimable as a leaf, so the sweep runs leaves first and never deletes a subtree.
        ready = (
            node.host_state == _RESIDENT
            and node.live_below == 0
            and not node.active_refs
            and not node.restore_pins
            and (node.device_state == _RESIDENT or not node.children)
            and node.id != ROOT
        )
        if ready:
            if node.id not in self.dead:
                self.dead[node.id] = None
        else:
            self.dead.pop(node.id, None)

    def _tail_changed(self, s: Snapshot) -> None:
        entry = DeviceEntry(EntryKind.TAIL, s.id)
        if s.tail and s.tail_device == _RESIDENT and not s.restore_pins:
            self.lru.put(entry, s.host_state == _RESIDENT)
        else:
            self.lru.discard(entry)

    def _order_path(self, deepest: int) -> None:
        """§7.7 step 2, §9.1: deeper blocks are evicted before shallower ones on a path. Move
        every Device LRU entry from `deepest` up to the root to its list's MRU end, deepest
        first. Called when nodes enter the LRU late (a write-through or restore landing): a
        released lane's shallower, already backed blocks went in at its release and would
        otherwise be evicted before the deeper blocks that landed after them (O(depth))."""
        nodes, lru = self.tree.nodes, self.lru
        nid = deepest
        while nid != ROOT:
            lru.touch(DeviceEntry(EntryKind.NODE, nid))
            nid = nodes[nid].parent

    # ---- what eviction can free (§6.3, §9.1) -----------------------------------------------

    def _blocked_nodes(self) -> set[int]:
        """Unbacked Device LRU nodes that eviction skips because their subtree holds a pinned
        node or snapshot (losing their last copy would delete it, §9.4).

        A lane's path pins are prefix-closed (its ancestors are pinned with it, so none is in
        the LRU); every other pin is held by an in-flight transfer batch or a staged lane's
        source, so walking up from those finds every blocked node: O(pinned + ancestors)."""
        unbacked = self.lru.unbacked
        if not unbacked:
            return set()
        nodes, snaps = self.tree.nodes, self.snapshots.by_id
        starts: list[int] = []
        for b in self.batches.values():
            starts.extend(b.nodes)
            if b.snapshot is not None:
                starts.append(snaps[b.snapshot].anchor)
        for rec in self.lanes.values():
            if rec.source_pinned:
                starts.append(snaps[rec.source].anchor)
        seen: set[int] = set()
        blocked: set[int] = set()
        for nid in starts:
            while nid != ROOT and nid not in seen:
                seen.add(nid)
                if DeviceEntry(EntryKind.NODE, nid) in unbacked:
                    blocked.add(nid)
                nid = nodes[nid].parent
        return blocked

    def evictable_pages(self) -> int:
        """Device pages eviction can free now (§9.5 `evictable`): every Device LRU entry but
        the unbacked nodes whose subtree is pinned. Evicting them all frees exactly this many
        pages (a subtree deleted with its root is made of LRU entries counted here)."""
        return len(self.lru) - len(self._blocked_nodes())

    # ---- counters along a path -------------------------------------------------------------

    def _walk(self, anchor: int, live_delta: int, retained_delta: int, sid: int) -> None:
        """Add to live_below / retained_below from `anchor` up to the root (O(depth)).

        When a node's retained count crosses 1, the snapshot that owned (or now owns) its
        exclusive bytes changes value: mark it dirty (its xor identifies it, §9.3 Z).
        """
        nodes, mark = self.tree.nodes, self.host_tier.mark
        node = nodes[anchor]
        while True:
            if live_delta:
                before = node.live_below
                node.live_below = before + live_delta
                if (before == 0) != (node.live_below == 0):
                    self._refresh_dead(node)
            if retained_delta:
                before = node.retained_below
                if before == 1:
                    mark(node.retained_xor)
                node.retained_below = before + retained_delta
                node.retained_xor ^= sid
                if node.retained_below == 1:
                    mark(node.retained_xor)
            if node.id == ROOT:
                return
            node = nodes[node.parent]

    # ---- supersession (§9.3): the store's flags, the tree's retained counters -------------

    def _supersede(self, s: Snapshot) -> bool:
        if not self.snapshots.can_supersede(s):
            return False
        self.snapshots.supersede(s, self._tick())
        self._walk(s.anchor, 0, -1, s.id)
        return True

    def _retain(self, s: Snapshot) -> None:
        if self.snapshots.retain(s):
            self._walk(s.anchor, 0, +1, s.id)

    # ---- dropping copies; deletion on the last copy (§9.4) ---------------------------------

    def _delete_snapshot(self, s: Snapshot) -> None:
        assert not s.restore_pins, f"deleting pinned snapshot {s.id}"
        if s.tail_page >= 0:
            self.freed.append(s.tail_page)
            self.lru.discard(DeviceEntry(EntryKind.TAIL, s.id))
        self._free_snapshot_slabs(s)
        self._walk(s.anchor, -1, 0 if s.superseded else -1, s.id)
        self.snapshots.remove(s)
        self.host_tier.forget(s.id)
        self.counters.snapshots_deleted += 1

    def _free_snapshot_slabs(self, s: Snapshot) -> None:
        if s.host_slabs:
            self.host_tier.free(s.host_slabs)
        if s.tail_slab >= 0:
            self.host_tier.free([s.tail_slab])
        s.host_slabs, s.tail_slab, s.host_state = [], -1, _ABSENT

    def _drop_snapshot_host(self, s: Snapshot) -> None:
        self._free_snapshot_slabs(s)
        self.host_tier.mark(s.id)
        if not (s.image_has_copy() and s.tail_has_copy()):
            self._delete_snapshot(s)
        else:
            self._tail_changed(s)

    def _drop_snapshot_image_device(self, s: Snapshot) -> None:
        self.snapshots.slots.release(s.device_slot)
        s.device_slot, s.device_state = -1, _ABSENT
        if not s.image_has_copy():
            self._delete_snapshot(s)

    def _drop_tail_device(self, s: Snapshot) -> None:
        self.freed.append(s.tail_page)
        s.tail_page, s.tail_device = -1, _ABSENT
        self.lru.discard(DeviceEntry(EntryKind.TAIL, s.id))
        if not s.tail_has_copy():
            self._delete_snapshot(s)

    def _drop_node_device(self, node: BlockNode) -> None:
        self.freed.append(node.device_page)
        node.device_page, node.device_state = -1, _ABSENT
        if node.has_copy:
            self._node_changed(node)
        else:
            self._delete_subtree(node)

    def _drop_node_host(self, node: BlockNode) -> None:
        self.host_tier.free([node.host_slab])
        node.host_slab, node.host_state = -1, _ABSENT
        if node.retained_below == 1:
            self.host_tier.mark(node.retained_xor)
        if node.has_copy:
            self._node_changed(node)
        else:
            self._delete_subtree(node)

    def _subtree_pinned(self, node: BlockNode) -> bool:
        for n in self.tree.subtree_postorder(node):
            if n.active_refs or n.restore_pins:
                return True
            if any(self.snapshots.by_id[sid].restore_pins for sid in n.snapshots):
                return True
        return False

    def _delete_subtree(self, node: BlockNode) -> None:
        """§9.4: `node` lost its last copy; delete it, its subtree and every snapshot there."""
        sub = self.tree.subtree_postorder(node)
        for n in sub:
            for sid in list(n.snapshots):
                self._delete_snapshot(self.snapshots.by_id[sid])
        for n in sub:
            assert not n.active_refs and not n.restore_pins, f"deleting pinned node {n.id}"
            if n.device_page >= 0:
                self.freed.append(n.device_page)
            self.lru.discard(DeviceEntry(EntryKind.NODE, n.id))
            if n.host_slab >= 0:
                self.host_tier.free([n.host_slab])
            self.dead.pop(n.id, None)
            self.tree.remove(n)
        self.counters.subtree_deletions += 1
        self.counters.nodes_deleted += len(sub)
        parent = self.tree.nodes[node.parent]
        self._refresh_dead(parent)  # may have become a leaf
