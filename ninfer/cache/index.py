"""PrefixIndex: the facade the engine drives (docs/cache-api.md, spec §5-§10).

The index decides; the engine's memory layer moves bytes. It holds the block tree, the
snapshots, the Device LRU, the Device snapshot slot table, the Host slab allocator and the
lanes' pins, and answers with ids: pages to free, slabs and pages to copy between. It never
imports torch or knows a KV dtype. One engine loop is its only caller; every mutating method
bumps `cache_epoch`, so a quote made before any mutation is detectably stale.

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
from ninfer.cache.device_slots import DeviceSlots
from ninfer.cache.gdsf import GdsfMixin
from ninfer.cache.host_pool import HostSlabPool, check_host_budget
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
from ninfer.cache.snapshots import Snapshot
from ninfer.cache.stats import CacheStats
from ninfer.cache.taps import Tap, TapHint
from ninfer.cache.taps import plan_taps as plan_taps_fn
from ninfer.cache.tree import BlockNode, BlockTree

_ABSENT, _RESIDENT = Residency.ABSENT, Residency.RESIDENT

__all__ = ["PrefixIndex"]


class PrefixIndex(
    LaneMixin,
    PublishMixin,
    SlotPolicyMixin,
    PrefetchMixin,
    LoadMixin,
    AdmissionMixin,
    GdsfMixin,
    LivenessMixin,
):
    """The hybrid prefix cache index. See the module docstring for its invariants."""

    def __init__(self, config: CacheConfig, cost: CacheCostModel) -> None:
        if config.slab_bytes <= 0 or config.image_bytes <= 0 or config.host_cache_bytes < 0:
            raise ValueError(f"invalid cache sizes in {config}")
        self.config, self.cost = config, cost
        self.host: HostSlabPool | None = None
        geometry = config.host_geometry()
        if geometry is not None:
            check_host_budget(geometry, "host_cache_bytes", config.host_cache_bytes)
            self.host = HostSlabPool(geometry)
        self.tree = BlockTree()
        self.snaps: dict[int, Snapshot] = {}
        self.snap_by_key: dict[tuple[int, bytes], int] = {}
        self.lru = DeviceLru()
        self.slots = DeviceSlots(config.device_snapshot_slots)
        self.dead: OrderedDict[int, None] = OrderedDict()  # dead-KV sweep order
        self.superseded: OrderedDict[int, None] = OrderedDict()  # supersession order
        self.root_deps: set[int] = set()  # snapshots with no snapshot above them
        self.dirty: set[int] = set()  # snapshots whose cached H is stale
        self.freed: list[int] = []  # Device pages freed since the last result
        self.L = 0.0
        self.lanes: dict[int, Lane] = {}
        self.batches: dict[int, TransferRecord] = {}
        self.counters = CacheStats()
        self.epoch = 0
        self._clock = 0
        self._next_sid = 1
        self._next_batch = 1

    # ---- small helpers ---------------------------------------------------------------------

    @property
    def cache_epoch(self) -> int:
        return self.epoch

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _mutated(self) -> int:
        self.epoch += 1
        return self._tick()

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
        return self.snaps[sid]

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
        st.snapshots = len(self.snaps)
        st.snapshots_device = sum(s.device_state != _ABSENT for s in self.snaps.values())
        st.snapshots_host = sum(s.host_state != _ABSENT for s in self.snaps.values())
        st.snapshots_superseded = len(self.superseded)
        st.snapshot_tails_device = sum(s.tail_page >= 0 for s in self.snaps.values())
        st.device_cached_pages = st.nodes_device + st.snapshot_tails_device
        slab = self.config.slab_bytes
        st.host_block_bytes = st.nodes_host * slab
        st.host_snapshot_bytes = slab * sum(
            len(s.host_slabs) + (s.tail_slab >= 0)
            for s in self.snaps.values()
            if s.host_state != _ABSENT
        )
        st.device_evictable_pages = len(self.lru)
        st.host_slabs_free = self.host.free_slabs if self.host else 0
        st.host_slabs_total = self.host.n_slabs if self.host else 0
        st.gdsf_l = self.L
        return st

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (O(everything))."""
        from ninfer.cache.invariants import check_index

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
                self._drop_tail_device(self.snaps[entry.id])

    def evict_device_pages(self, n: int) -> list[int]:
        """§9.5: free >= n cached Device pages for active growth (fewer if not enough are
        evictable). Backed entries first; an unbacked victim takes its subtree and snapshots
        with it. Returns the freed page ids; the memory layer returns them to its free list."""
        self._mutated()
        if n > 0:
            self._evict(n)
        return self._take_freed()

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
            s = self.snaps[b.snapshot]
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
            s = self.snaps[b.snapshot]
            s.host_state = _RESIDENT
            s.restore_pins -= 1
            self.dirty.add(s.id)
            self._tail_changed(s)

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
