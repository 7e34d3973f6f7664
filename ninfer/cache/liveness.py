"""Residency bookkeeping shared by the PrefixIndex: counters along paths, Device LRU and dead-KV
membership, snapshot links, and deletion when a last copy goes (spec §5.3, §9.4).

A mixin: `PrefixIndex` provides the state (`tree`, `snaps`, `lru`, `slots`, `host`, `dead`,
`superseded`, `root_deps`, `dirty`, `freed`, `counters`, ...). Every helper keeps the §10
invariants that `check_invariants` verifies; the policy that calls them lives elsewhere.
"""

from __future__ import annotations

from ninfer.cache.common import ROOT, Residency, SnapshotKind
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
        nodes, snaps = self.tree.nodes, self.snaps
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
        nodes, dirty = self.tree.nodes, self.dirty
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
                    dirty.add(node.retained_xor)
                node.retained_below = before + retained_delta
                node.retained_xor ^= sid
                if node.retained_below == 1:
                    dirty.add(node.retained_xor)
            if node.id == ROOT:
                return
            node = nodes[node.parent]

    # ---- snapshot ancestry (§9.3: nearest snapshot above, and its dependents) ---------------

    def _deps(self, sid: int | None) -> set[int]:
        return self.root_deps if sid is None else self.snaps[sid].dependents

    def _find_ancestor(self, s: Snapshot) -> int | None:
        """The deepest other snapshot whose tokens are a prefix of s's, or None (root)."""
        nodes, snaps = self.tree.nodes, self.snaps
        anchor = nodes[s.anchor]
        best = None
        for sid in anchor.snapshots:
            t = snaps[sid]
            if (
                t is not s
                and t.frontier < s.frontier
                and s.tail.startswith(t.tail)
                and (best is None or t.frontier > best.frontier)
            ):
                best = t
        child = anchor
        while best is None and child.id != ROOT:
            node = nodes[child.parent]
            for sid in node.snapshots:
                t = snaps[sid]
                if child.tokens.startswith(t.tail) and (best is None or t.frontier > best.frontier):
                    best = t
            child = node
        return None if best is None else best.id

    def _is_below(self, t: Snapshot, s: Snapshot) -> bool:
        """True when s's tokens are a strict prefix of t's."""
        if t.frontier <= s.frontier:
            return False
        if t.anchor == s.anchor:
            return t.tail.startswith(s.tail)
        # t's path block just below s's anchor: its parent must be the anchor, and its tokens
        # must start with s's tail (trivially true without a tail).
        y = self.tree.at_depth(self.tree.nodes[t.anchor], s.anchor_depth + 1)
        return y is not None and y.parent == s.anchor and y.tokens.startswith(s.tail)

    def _link(self, s: Snapshot) -> None:
        """Insert s between its nearest ancestor and the ancestor's dependents below s."""
        a = self._find_ancestor(s)
        s.ancestor = a
        deps = self._deps(a)
        # Only snapshots in the anchor's subtree can lie below s; none there (other than s,
        # already counted) means nothing to take over, without scanning a's dependents.
        below = [] if self.tree.nodes[s.anchor].live_below <= 1 else deps
        for tid in [tid for tid in below if self._is_below(self.snaps[tid], s)]:
            deps.discard(tid)
            s.dependents.add(tid)
            self.snaps[tid].ancestor = s.id
        deps.add(s.id)
        # The taken-over snapshots now value against s, and so do the retained ones below a
        # superseded one among them (their nearest retained ancestor was above s): all of them
        # change C, however deep below s they hang.
        self._mark_dependents_dirty(s)

    def _unlink(self, s: Snapshot) -> None:
        deps = self._deps(s.ancestor)
        deps.discard(s.id)
        for tid in s.dependents:
            self.snaps[tid].ancestor = s.ancestor
            deps.add(tid)
        s.dependents = set()

    def _retained_ancestor(self, s: Snapshot) -> Snapshot | None:
        a = s.ancestor
        while a is not None and self.snaps[a].superseded:
            a = self.snaps[a].ancestor
        return None if a is None else self.snaps[a]

    def _mark_dependents_dirty(self, s: Snapshot) -> None:
        """Snapshots whose nearest *retained* ancestor is s change C when s changes."""
        stack = list(s.dependents)
        while stack:
            t = self.snaps[stack.pop()]
            self.dirty.add(t.id)
            if t.superseded:
                stack.extend(t.dependents)

    # ---- supersession (§9.3) ---------------------------------------------------------------

    def _single_chain_below(self, s: Snapshot) -> bool:
        """True while no other conversation continued from s: the tree below it is one chain."""
        nodes = self.tree.nodes
        node = nodes[s.anchor]
        if s.tail:
            kids = [c for c in node.children if nodes[c].tokens.startswith(s.tail)]
            if len(kids) != 1:
                return len(kids) == 0
            node = nodes[kids[0]]
        while node.children:
            if len(node.children) > 1:
                return False
            node = nodes[node.children[0]]
        return True

    def _supersede(self, s: Snapshot) -> bool:
        if s.superseded:
            return False
        if s.kind == SnapshotKind.BOUNDARY and not self._single_chain_below(s):
            return False
        s.superseded = True
        s.superseded_tick = self._tick()
        self.superseded[s.id] = None
        self._walk(s.anchor, 0, -1, s.id)
        self._mark_dependents_dirty(s)
        return True

    def _retain(self, s: Snapshot) -> None:
        if not s.superseded:
            return
        s.superseded = False
        del self.superseded[s.id]
        self._walk(s.anchor, 0, +1, s.id)
        self.dirty.add(s.id)
        self._mark_dependents_dirty(s)

    # ---- dropping copies; deletion on the last copy (§9.4) ---------------------------------

    def _delete_snapshot(self, s: Snapshot) -> None:
        assert not s.restore_pins, f"deleting pinned snapshot {s.id}"
        if s.device_slot >= 0:
            self.slots.release(s.device_slot)
        if s.tail_page >= 0:
            self.freed.append(s.tail_page)
            self.lru.discard(DeviceEntry(EntryKind.TAIL, s.id))
        self._free_snapshot_slabs(s)
        self._mark_dependents_dirty(s)
        self._unlink(s)
        self._walk(s.anchor, -1, 0 if s.superseded else -1, s.id)
        self.tree.nodes[s.anchor].snapshots.remove(s.id)
        del self.snap_by_key[(s.anchor, s.tail)]
        self.superseded.pop(s.id, None)
        del self.snaps[s.id]
        self.dirty.discard(s.id)
        self.counters.snapshots_deleted += 1

    def _free_snapshot_slabs(self, s: Snapshot) -> None:
        if s.host_slabs:
            self.host.free(s.host_slabs)
        if s.tail_slab >= 0:
            self.host.free([s.tail_slab])
        s.host_slabs, s.tail_slab, s.host_state = [], -1, _ABSENT

    def _drop_snapshot_host(self, s: Snapshot) -> None:
        self._free_snapshot_slabs(s)
        self.dirty.add(s.id)
        if not (s.image_has_copy() and s.tail_has_copy()):
            self._delete_snapshot(s)
        else:
            self._tail_changed(s)

    def _drop_snapshot_image_device(self, s: Snapshot) -> None:
        self.slots.release(s.device_slot)
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
        self.host.free([node.host_slab])
        node.host_slab, node.host_state = -1, _ABSENT
        if node.retained_below == 1:
            self.dirty.add(node.retained_xor)
        if node.has_copy:
            self._node_changed(node)
        else:
            self._delete_subtree(node)

    def _subtree_pinned(self, node: BlockNode) -> bool:
        for n in self.tree.subtree_postorder(node):
            if n.active_refs or n.restore_pins:
                return True
            if any(self.snaps[sid].restore_pins for sid in n.snapshots):
                return True
        return False

    def _delete_subtree(self, node: BlockNode) -> None:
        """§9.4: `node` lost its last copy; delete it, its subtree and every snapshot there."""
        sub = self.tree.subtree_postorder(node)
        for n in sub:
            for sid in list(n.snapshots):
                self._delete_snapshot(self.snaps[sid])
        for n in sub:
            assert not n.active_refs and not n.restore_pins, f"deleting pinned node {n.id}"
            if n.device_page >= 0:
                self.freed.append(n.device_page)
            self.lru.discard(DeviceEntry(EntryKind.NODE, n.id))
            if n.host_slab >= 0:
                self.host.free([n.host_slab])
            self.dead.pop(n.id, None)
            self.tree.remove(n)
        self.counters.subtree_deletions += 1
        self.counters.nodes_deleted += len(sub)
        parent = self.tree.nodes[node.parent]
        self._refresh_dead(parent)  # may have become a leaf
