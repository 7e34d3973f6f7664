"""PrefixIndex: the facade the engine drives (docs/cache-api.md, spec §5-§10).

The index decides; the engine's memory layer moves bytes. It answers with ids: pages to free,
slabs and pages to copy between. It never imports torch or knows a KV dtype. One engine loop
is its only caller; every mutating method bumps `cache_epoch`, so a quote made before any
mutation is detectably stale. Its parts:

    snapshots  SnapshotStore (snapshot_store.py): snapshots by id and key, ancestor links,
               supersession order, the Device snapshot slot table
    host_tier  HostTier (host_tier.py): the Host slab pool and the GDSF priorities
    tree, lru, dead, freed   the block tree, the Device LRU, the dead-KV set, the pages freed
               since the last result
    lanes, batches           the lanes' pins and the transfers in flight

The index runs the lane protocol and every rule that spans parts (deleting a block deletes the
snapshots anchored under it and frees their slabs; §9.3's Host eviction order); the stores do
not call each other.

Invariants (spec §10; `check_invariants` checks every one that is checkable without tensors):
  - §10.1 every cached page and every Host slab has exactly one owner (node, image, tail);
  - §10.2 nodes never change identity and are unique per (parent, tokens, extra); §9.4 a node
    without any copy does not exist;
  - §10.3 every node on an activated lane's path has active_refs > 0 and a Device copy;
  - §10.4 a snapshot exists only while valid (path, image and tail each have a copy);
  - §10.5 identity is exact: hashes only select (tested: match never false-hits);
  - §10.6 a Filling copy is pinned, so nothing frees it;
  - counters (live/retained below, active_refs, restore_pins), the Device LRU lists, the dead-KV
    set, the slot table, ancestor links and cached GDSF priorities all match the data.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ninfer.cache.admission import AdmissionMixin
from ninfer.cache.common import (
    ROOT,
    LaneError,
    Residency,
    SnapshotKind,
    Span,
)
from ninfer.cache.cost import CacheCostModel
from ninfer.cache.device_lru import DeviceEntry, DeviceLru, EntryKind
from ninfer.cache.host_pool import HostSlabPool
from ninfer.cache.host_tier import HostTier
from ninfer.cache.invariants import check_index
from ninfer.cache.lanes import LaneMixin
from ninfer.cache.liveness import LivenessMixin
from ninfer.cache.load import LoadMixin
from ninfer.cache.prefetch import PrefetchMixin
from ninfer.cache.publish import PublishMixin
from ninfer.cache.records import (
    CacheConfig,
    Lane,
    TransferRecord,
)
from ninfer.cache.slot_policy import SlotPolicyMixin
from ninfer.cache.snapshot_store import SnapshotStore
from ninfer.cache.snapshots import Snapshot
from ninfer.cache.stats import CacheStats
from ninfer.cache.taps import Tap, TapHint
from ninfer.cache.taps import plan_taps as plan_taps_fn
from ninfer.cache.tree import BlockNode, BlockTree

_ABSENT, _RESIDENT, _FILLING = Residency.ABSENT, Residency.RESIDENT, Residency.FILLING

__all__ = ["PrefixIndex"]


class PrefixIndex(
    LaneMixin,
    PublishMixin,
    SlotPolicyMixin,
    PrefetchMixin,
    LoadMixin,
    AdmissionMixin,
    LivenessMixin,
):
    """The hybrid prefix cache index. See the module docstring for its invariants."""

    def __init__(self, config: CacheConfig, cost: CacheCostModel) -> None:
        if config.slab_bytes <= 0 or config.image_bytes <= 0 or config.host_cache_bytes < 0:
            raise ValueError(f"invalid cache sizes in {config}")
        self.config, self.cost = config, cost
        self.tree = BlockTree()
        self.snapshots = SnapshotStore(config.device_snapshot_slots, self.tree, self._revalue)
        self.host_tier = HostTier(config, cost, self.tree, self.snapshots.by_id)
        self.lru = DeviceLru()
        self.dead: OrderedDict[int, None] = OrderedDict()  # dead-KV sweep order
        self.freed: list[int] = []  # Device pages freed since the last result
        self.lanes: dict[int, Lane] = {}
        self.batches: dict[int, TransferRecord] = {}
        self.counters = CacheStats()
        self.epoch = 0
        self._clock = 0
        self._next_batch = 1

    # ---- small helpers ---------------------------------------------------------------------

    @property
    def cache_epoch(self) -> int:
        return self.epoch

    @property
    def host(self) -> HostSlabPool | None:
        """The Host tier's slab pool over its geometry (None without a Host tier): the memory
        layer reads its geometry, chunks and copy runs. Its slabs are the index's to hand out."""
        return self.host_tier.pool

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _mutated(self) -> int:
        self.epoch += 1
        return self._tick()

    def _revalue(self, sid: int) -> None:
        self.host_tier.mark(sid)

    def _take_freed(self) -> list[int]:
        out, self.freed = self.freed, []
        return out

    def _lane(self, lane: int, activated: bool | None = True) -> Lane:
        rec = self.lanes.get(lane)
        if rec is None:
            raise LaneError(f"lane {lane} is not open")
        if activated is not None and rec.activated != activated:
            raise LaneError(f"lane {lane} is {'' if rec.activated else 'not '}activated")
        return rec

    def _new_batch(self, batch: TransferRecord) -> int:
        bid = self._next_batch
        self._next_batch += 1
        self.batches[bid] = batch
        return bid

    # ---- read-only views -------------------------------------------------------------------

    def node(self, nid: int) -> BlockNode:
        """The node record (read-only for callers). KeyError if it does not exist."""
        return self.tree.nodes[nid]

    def snapshot(self, sid: int) -> Snapshot:
        """The snapshot record (read-only for callers). KeyError if it does not exist."""
        return self.snapshots.by_id[sid]

    def lane_path(self, lane: int) -> list[int]:
        return list(self._lane(lane, None).path)

    def stats(self) -> CacheStats:
        """Counters plus freshly computed gauges (the live object: copy it to keep it).

        The gauges are counted over every node and snapshot (O(tree)): call it on demand, not
        once per engine step."""
        st = self.counters
        nodes = [n for n in self.tree.nodes.values() if n.id != ROOT]
        st.nodes = len(nodes)
        st.nodes_device = sum(n.device_state != _ABSENT for n in nodes)
        st.nodes_host = sum(n.host_state != _ABSENT for n in nodes)
        st.snapshots = len(self.snapshots.by_id)
        st.snapshots_device = sum(s.device_state != _ABSENT for s in self.snapshots.by_id.values())
        st.snapshots_host = sum(s.host_state != _ABSENT for s in self.snapshots.by_id.values())
        st.snapshots_superseded = len(self.snapshots.superseded)
        st.snapshot_tails_device = sum(s.tail_page >= 0 for s in self.snapshots.by_id.values())
        st.device_cached_pages = st.nodes_device + st.snapshot_tails_device
        slab = self.config.slab_bytes
        st.host_block_bytes = st.nodes_host * slab
        st.host_snapshot_bytes = slab * sum(
            len(s.host_slabs) + (s.tail_slab >= 0)
            for s in self.snapshots.by_id.values()
            if s.host_state != _ABSENT
        )
        st.device_evictable_pages = len(self.lru)
        st.host_slabs_free = self.host_tier.free_slabs
        st.host_slabs_total = self.host_tier.n_slabs
        st.gdsf_l = self.host_tier.L
        return st

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (O(everything))."""
        check_index(self)

    # ---- Device eviction (§9.1, §9.5) ------------------------------------------------------

    def _next_lru_victim(self) -> DeviceEntry | None:
        for entry in self.lru.backed:
            return entry
        for entry in self.lru.unbacked:
            if entry.kind == EntryKind.TAIL:
                return entry
            if not self._subtree_pinned(self.tree.nodes[entry.id]):
                return entry  # its subtree goes with it (§9.4): nothing there may be pinned
        return None

    def _evict(self, n: int) -> None:
        """Free at least n Device pages into self.freed (fewer if the LRU runs dry)."""
        target = len(self.freed) + n
        st = self.counters
        while len(self.freed) < target:
            entry = self._next_lru_victim()
            if entry is None:
                return
            backed = self.lru.is_backed(entry)
            if backed:
                st.device_evicted_backed += 1
            else:
                st.device_evicted_unbacked += 1
            if entry.kind == EntryKind.NODE:
                self._drop_node_device(self.tree.nodes[entry.id])
            else:
                self._drop_tail_device(self.snapshots.by_id[entry.id])

    def evict_device_pages(self, n: int) -> list[int]:
        """§9.5: free >= n cached Device pages for active growth (fewer if not enough are
        evictable). Backed entries first; an unbacked victim takes its subtree and snapshots
        with it. Returns the freed page ids; the memory layer returns them to its free list."""
        self._mutated()
        if n > 0:
            self._evict(n)
        return self._take_freed()

    # ---- Host eviction (§9.3): dead KV, then superseded snapshots, then GDSF ---------------

    def _sweep_dead_one(self) -> bool:
        """§9.3 step 1: reclaim one dead-KV slab (leaves first). False when none is dead."""
        nid = next(iter(self.dead), None)
        if nid is None:
            return False
        self.counters.host_dead_kv_reclaimed += 1
        self._drop_node_host(self.tree.nodes[nid])
        return True

    def _oldest_superseded_host(self) -> Snapshot | None:
        for sid in self.snapshots.superseded:
            s = self.snapshots.by_id[sid]
            if s.host_state == _RESIDENT and not s.restore_pins:
                return s
        return None

    def _host_alloc(self, k: int, bound: float | None = None) -> list[int] | None:
        """k Host slabs, evicting as §9.3 orders, or None (and a partial eviction) if impossible.

        `bound`: an image write's own H; GDSF stops at a victim worth more (never inserts what
        it would evict next). Block writes pass None (not bounded).
        """
        tier = self.host_tier
        if tier.pool is None or k > tier.n_slabs:
            return None
        while tier.free_slabs < k:
            if self._sweep_dead_one():
                continue
            s = self._oldest_superseded_host()
            if s is not None:
                self.counters.host_superseded_evicted += 1
                self._delete_snapshot(s)  # both copies; L unchanged
                continue
            tier.flush()
            v = tier.victim()
            if v is None or (bound is not None and v.h > bound):
                if v is not None:
                    self.counters.host_image_writes_refused += 1
                self.counters.host_alloc_failures += 1
                return None
            tier.charge(v.h)
            self.counters.host_gdsf_evicted += 1
            if v.device_complete:
                self._drop_snapshot_host(v)  # still restorable from the Device
            else:
                self._delete_snapshot(v)
        return tier.allocate(k)

    # ---- transfers landing -----------------------------------------------------------------

    def on_restore_landed(self, batch_id: int) -> None:
        """Filling -> Resident for a restore batch's nodes and tail; drops the batch's pins."""
        b = self.batches.pop(batch_id)
        assert b.kind == "restore", f"batch {batch_id} is a {b.kind} batch"
        self._mutated()
        for nid in b.nodes:
            node = self.tree.nodes[nid]
            node.device_state = _RESIDENT
            node.restore_pins -= 1
            self._node_changed(node)
        if b.nodes:
            self._order_path(b.nodes[-1])  # deeper blocks are evicted first (§7.7, §9.1)
        if b.snapshot is not None:
            s = self.snapshots.by_id[b.snapshot]
            if b.tail:
                s.tail_device = _RESIDENT
            s.restore_pins -= 1
            self._tail_changed(s)
        if b.lane is not None and b.lane in self.lanes:
            self.lanes[b.lane].restore_batch = None

    def on_write_through_landed(self, batch_id: int) -> None:
        """Host Filling -> Resident for a write batch; written nodes/tails become evictable
        (backed), nodes in reverse block order."""
        b = self.batches.pop(batch_id)
        assert b.kind in ("blocks", "snapshot"), f"batch {batch_id} is a {b.kind} batch"
        self._mutated()
        for nid in reversed(b.nodes):
            node = self.tree.nodes[nid]
            node.host_state = _RESIDENT
            node.restore_pins -= 1
            self._node_changed(node)
        if b.nodes:
            self._order_path(b.nodes[-1])  # behind the path's shallower blocks (§7.7 step 2)
        if b.snapshot is not None:
            s = self.snapshots.by_id[b.snapshot]
            s.host_state = _RESIDENT
            s.restore_pins -= 1
            self.host_tier.mark(s.id)
            self._tail_changed(s)

    # ---- transfers that never ran (the engine's Host-fault containment) ---------------------

    def abort_write_through(self, batch_id: int) -> list[int]:
        """A write batch (blocks or snapshot) that never ran: its nodes and snapshot lose the
        Host copy they were getting (Filling -> Absent, slabs freed, pins dropped); an entry
        left without a copy is deleted (§9.4). Unknown ids are ignored (already undone).
        Returns the Device pages freed."""
        b = self.batches.pop(batch_id, None)
        if b is None:
            return []
        self._mutated()
        nodes = self.tree.nodes
        for nid in reversed(b.nodes):
            node = nodes.get(nid)
            if node is None or node.host_state != _FILLING:
                continue
            node.restore_pins -= 1
            self._drop_node_host(node)
        if b.snapshot is not None:
            s = self.snapshots.by_id.get(b.snapshot)
            if s is not None and s.host_state == _FILLING:
                s.restore_pins -= 1
                self._drop_snapshot_host(s)
        return self._take_freed()

    def abort_restore(self, batch_id: int) -> list[int]:
        """A restore or prefetch batch that never (fully) ran: its targets go back to
        Device-absent (their pages freed), the staged lane that began it is cancelled, and the
        Host copies it read are dropped (a fault may have left them unreadable; an entry left
        without a copy is deleted, deepest first, never under a pin). Unknown ids are ignored.
        Returns the Device pages freed (the lane's state slot stays the caller's)."""
        b = self.batches.pop(batch_id, None)
        if b is None:
            return []
        self._mutated()
        nodes = self.tree.nodes
        for nid in b.nodes:
            node = nodes[nid]
            if node.device_state == _FILLING:
                self.freed.append(node.device_page)
                node.device_page, node.device_state = -1, _ABSENT
            node.restore_pins -= 1
            self._node_changed(node)
        snap = None
        if b.snapshot is not None:
            snap = self.snapshots.by_id[b.snapshot]
            if b.tail and snap.tail_device == _FILLING:
                self.freed.append(snap.tail_page)
                snap.tail_page, snap.tail_device = -1, _ABSENT
            snap.restore_pins -= 1
            self._tail_changed(snap)
        if b.lane is not None and b.lane in self.lanes:
            self.lanes[b.lane].restore_batch = None
            taken = self.cancel_stage(b.lane)  # it takes the pages freed so far: put them back
            self.freed.extend(taken)
        for nid in reversed(b.nodes):
            node = nodes.get(nid)
            if node is None or node.host_state == _ABSENT or self._subtree_pinned(node):
                continue
            self._drop_node_host(node)
        live = snap is not None and b.snapshot in self.snapshots.by_id and not snap.restore_pins
        if live and snap.host_state != _ABSENT:
            self._drop_snapshot_host(snap)
        return self._take_freed()

    def plan_taps(
        self,
        lane: int,
        n_tokens: int,
        hints: Sequence[TapHint] = (),
        vision_spans: Sequence[Span] = (),
        resumed_from_endpoint: bool | None = None,
    ) -> list[Tap]:
        """§7.1 taps for the lane's prompt (pure; only counts them). See taps.plan_taps."""
        rec = self._lane(lane, None)
        rfe = (
            rec.source_kind == SnapshotKind.ENDPOINT
            if resumed_from_endpoint is None
            else resumed_from_endpoint
        )
        taps = plan_taps_fn(
            n_tokens, rec.base, hints, rec.existing, vision_spans, self.config.taps, rfe
        )
        self.counters.taps_planned += len(taps)
        return taps
