"""Rules of the PrefixIndex that span its stores (design §5.3, §9.1, §9.3, §9.4): what eviction
can free, supersession with the tree's retained counters, dropping copies, and deletion when a
last copy goes (a block takes its subtree and the snapshots anchored there, with their slots,
tail pages and slabs).

Built by the PrefixIndex over its three stores and its registry (the lanes' and batches' pins,
the counters); the index's other parts call it. Every helper keeps the §10 invariants that
`check_invariants` verifies; the policy that calls them lives in those parts.
"""

from __future__ import annotations

from ninfer.cache.blocks import BlockStore
from ninfer.cache.common import ROOT, Residency
from ninfer.cache.device_lru import DeviceEntry, EntryKind
from ninfer.cache.host_tier import HostTier
from ninfer.cache.registry import Registry
from ninfer.cache.snapshot_store import SnapshotStore
from ninfer.cache.snapshots import Snapshot
from ninfer.cache.tree import BlockNode

_ABSENT, _RESIDENT = Residency.ABSENT, Residency.RESIDENT


class Liveness:
    def __init__(
        self, blocks: BlockStore, snapshots: SnapshotStore, host_tier: HostTier, registry: Registry
    ) -> None:
        self.blocks, self.snapshots = blocks, snapshots
        self.host_tier, self.registry = host_tier, registry

    # ---- what eviction can free (§6.3, §9.1) -----------------------------------------------

    def blocked_nodes(self) -> set[int]:
        """Unbacked Device LRU nodes that eviction skips because their subtree holds a pinned
        node or snapshot (losing their last copy would delete it, §9.4).

        A lane's path pins are prefix-closed (its ancestors are pinned with it, so none is in
        the LRU); every other pin is held by an in-flight transfer batch or a staged lane's
        source, so walking up from those finds every blocked node: O(pinned + ancestors)."""
        unbacked = self.blocks.lru.unbacked
        if not unbacked:
            return set()
        nodes, snaps = self.blocks.tree.nodes, self.snapshots.by_id
        starts: list[int] = []
        for b in self.registry.batches.values():
            starts.extend(b.nodes)
            if b.snapshot is not None:
                starts.append(snaps[b.snapshot].anchor)
        for rec in self.registry.lanes.values():
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
        return len(self.blocks.lru) - len(self.blocked_nodes())

    # ---- supersession (§9.3): the store's flags, the tree's retained counters -------------

    def supersede(self, s: Snapshot) -> bool:
        if not self.snapshots.can_supersede(s):
            return False
        self.snapshots.supersede(s, self.registry.tick())
        self.blocks.walk(s.anchor, 0, -1, s.id)
        return True

    def retain(self, s: Snapshot) -> None:
        if self.snapshots.retain(s):
            self.blocks.walk(s.anchor, 0, +1, s.id)

    # ---- dropping copies; deletion on the last copy (§9.4) ---------------------------------

    def delete_snapshot(self, s: Snapshot) -> None:
        assert not s.restore_pins, f"deleting pinned snapshot {s.id}"
        if s.tail_page >= 0:
            self.blocks.free_page(s.tail_page)
            self.blocks.forget_tail(s.id)
        self._free_snapshot_slabs(s)
        self.blocks.walk(s.anchor, -1, 0 if s.superseded else -1, s.id)
        self.snapshots.remove(s)
        self.host_tier.forget(s.id)
        self.registry.counters.snapshots_deleted += 1

    def _free_snapshot_slabs(self, s: Snapshot) -> None:
        if s.host_slabs:
            self.host_tier.free(s.host_slabs)
        if s.tail_slab >= 0:
            self.host_tier.free([s.tail_slab])
        self.snapshots.clear_host_copy(s)

    def drop_snapshot_host(self, s: Snapshot) -> None:
        self._free_snapshot_slabs(s)
        self.host_tier.mark(s.id)
        if not (s.image_has_copy() and s.tail_has_copy()):
            self.delete_snapshot(s)
        else:
            self.blocks.tail_changed(s)

    def drop_snapshot_image_device(self, s: Snapshot) -> None:
        self.snapshots.drop_image_device(s)
        if not s.image_has_copy():
            self.delete_snapshot(s)

    def drop_tail_device(self, s: Snapshot) -> None:
        self.blocks.free_page(s.tail_page)
        self.snapshots.clear_tail_device(s)
        self.blocks.forget_tail(s.id)
        if not s.tail_has_copy():
            self.delete_snapshot(s)

    def drop_node_device(self, node: BlockNode) -> None:
        self.blocks.clear_device_copy(node)
        if node.has_copy:
            self.blocks.node_changed(node)
        else:
            self._delete_subtree(node)

    def drop_node_host(self, node: BlockNode) -> None:
        self.host_tier.free([node.host_slab])
        self.blocks.clear_host_copy(node)
        if node.retained_below == 1:
            self.host_tier.mark(node.retained_xor)
        if node.has_copy:
            self.blocks.node_changed(node)
        else:
            self._delete_subtree(node)

    def subtree_pinned(self, node: BlockNode) -> bool:
        for n in self.blocks.tree.subtree_postorder(node):
            if n.active_refs or n.restore_pins:
                return True
            if any(self.snapshots.by_id[sid].restore_pins for sid in n.snapshots):
                return True
        return False

    def _delete_subtree(self, node: BlockNode) -> None:
        """§9.4: `node` lost its last copy; delete it, its subtree and every snapshot there."""
        sub = self.blocks.tree.subtree_postorder(node)
        for n in sub:
            for sid in list(n.snapshots):
                self.delete_snapshot(self.snapshots.by_id[sid])
        for n in sub:
            assert not n.active_refs and not n.restore_pins, f"deleting pinned node {n.id}"
            if n.device_page >= 0:
                self.blocks.free_page(n.device_page)
            if n.host_slab >= 0:
                self.host_tier.free([n.host_slab])
            self.blocks.remove(n)
        self.registry.counters.subtree_deletions += 1
        self.registry.counters.nodes_deleted += len(sub)
        parent = self.blocks.tree.nodes[node.parent]
        self.blocks.refresh_dead(parent)  # may have become a leaf

    # ---- Device eviction (§9.1, §9.5) ------------------------------------------------------

    def _next_lru_victim(self) -> DeviceEntry | None:
        for entry in self.blocks.lru.backed:
            return entry
        for entry in self.blocks.lru.unbacked:
            if entry.kind == EntryKind.TAIL:
                return entry
            if not self.subtree_pinned(self.blocks.tree.nodes[entry.id]):
                return entry  # its subtree goes with it (§9.4): nothing there may be pinned
        return None

    def evict(self, n: int) -> None:
        """Free at least n Device pages into self.blocks.freed (fewer if the LRU runs dry)."""
        target = len(self.blocks.freed) + n
        st = self.registry.counters
        while len(self.blocks.freed) < target:
            entry = self._next_lru_victim()
            if entry is None:
                return
            backed = self.blocks.lru.is_backed(entry)
            if backed:
                st.device_evicted_backed += 1
            else:
                st.device_evicted_unbacked += 1
            if entry.kind == EntryKind.NODE:
                self.drop_node_device(self.blocks.tree.nodes[entry.id])
            else:
                self.drop_tail_device(self.snapshots.by_id[entry.id])

    # ---- Host eviction (§9.3): dead KV, then superseded snapshots, then GDSF ---------------

    def sweep_dead_one(self) -> bool:
        """§9.3 step 1: reclaim one dead-KV slab (leaves first). False when none is dead."""
        nid = next(iter(self.blocks.dead), None)
        if nid is None:
            return False
        self.registry.counters.host_dead_kv_reclaimed += 1
        self.drop_node_host(self.blocks.tree.nodes[nid])
        return True

    def oldest_superseded_host(self) -> Snapshot | None:
        for sid in self.snapshots.superseded:
            s = self.snapshots.by_id[sid]
            if s.host_state == _RESIDENT and not s.restore_pins:
                return s
        return None

    def host_alloc(self, k: int, bound: float | None = None) -> list[int] | None:
        """k Host slabs, evicting as §9.3 orders, or None (and a partial eviction) if impossible.

        `bound`: an image write's own H; GDSF stops at a victim worth more (never inserts what
        it would evict next). Block writes pass None (not bounded).
        """
        tier = self.host_tier
        if tier.pool is None or k > tier.n_slabs:
            return None
        while tier.free_slabs < k:
            if self.sweep_dead_one():
                continue
            s = self.oldest_superseded_host()
            if s is not None:
                self.registry.counters.host_superseded_evicted += 1
                self.delete_snapshot(s)  # both copies; L unchanged
                continue
            tier.flush()
            v = tier.victim()
            if v is None or (bound is not None and v.h > bound):
                if v is not None:
                    self.registry.counters.host_image_writes_refused += 1
                self.registry.counters.host_alloc_failures += 1
                return None
            tier.charge(v.h)
            self.registry.counters.host_gdsf_evicted += 1
            if v.device_complete:
                self.drop_snapshot_host(v)  # still restorable from the Device
            else:
                self.delete_snapshot(v)
        return tier.allocate(k)
