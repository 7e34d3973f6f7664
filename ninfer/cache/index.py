"""PrefixIndex: the facade the engine drives (docs/cache-api.md, spec §5-§10).

The index decides; the engine's memory layer moves bytes. It answers with ids: pages to free,
slabs and pages to copy between. It never imports torch or knows a KV dtype. One engine loop
is its only caller; every mutating method bumps `cache_epoch`, so a quote made before any
mutation is detectably stale. Its parts:

    blocks     BlockStore (blocks.py): the block tree, the Device LRU, the dead-KV set, the
               Device pages freed since the last result
    snapshots  SnapshotStore (snapshot_store.py): snapshots by id and key, ancestor links,
               supersession order, the Device snapshot slot table
    host_tier  HostTier (host_tier.py): the Host slab pool and the GDSF priorities
    lanes, batches   the lanes' pins and the transfers in flight (the index's own)

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

from collections.abc import Sequence

from ninfer.cache.admission import Admission
from ninfer.cache.blocks import BlockStore
from ninfer.cache.common import (
    ROOT,
    LaneError,
    Residency,
    SnapshotKind,
    Span,
)
from ninfer.cache.cost import CacheCostModel
from ninfer.cache.host_pool import HostSlabPool
from ninfer.cache.host_tier import HostTier
from ninfer.cache.invariants import check_index
from ninfer.cache.keys import PromptBlocks
from ninfer.cache.lanes import LaneMixin
from ninfer.cache.liveness import LivenessMixin
from ninfer.cache.load import LoadMixin
from ninfer.cache.prefetch import PrefetchMixin
from ninfer.cache.publish import PublishMixin
from ninfer.cache.records import (
    CacheConfig,
    LaneRecord,
    MatchResult,
    Quote,
    QuoteParams,
    TransferRecord,
)
from ninfer.cache.slot_policy import SlotPolicyMixin
from ninfer.cache.snapshot_store import SnapshotStore
from ninfer.cache.snapshots import Snapshot
from ninfer.cache.stats import CacheStats
from ninfer.cache.taps import Tap, TapHint
from ninfer.cache.taps import plan_taps as plan_taps_fn
from ninfer.cache.transfers import TransferMixin
from ninfer.cache.tree import BlockNode

_ABSENT, _RESIDENT, _FILLING = Residency.ABSENT, Residency.RESIDENT, Residency.FILLING

__all__ = ["PrefixIndex"]


class PrefixIndex(
    LaneMixin,
    PublishMixin,
    SlotPolicyMixin,
    PrefetchMixin,
    LoadMixin,
    TransferMixin,
    LivenessMixin,
):
    """The hybrid prefix cache index. See the module docstring for its invariants."""

    def __init__(self, config: CacheConfig, cost: CacheCostModel) -> None:
        if config.slab_bytes <= 0 or config.image_bytes <= 0 or config.host_cache_bytes < 0:
            raise ValueError(f"invalid cache sizes in {config}")
        self.config, self._cost = config, cost
        self.blocks = BlockStore(self._revalue)
        tree = self.blocks.tree
        self.snapshots = SnapshotStore(config.device_snapshot_slots, tree, self._revalue)
        self.host_tier = HostTier(config, cost, tree, self.snapshots.by_id)
        self._admission = Admission(config, cost, self.blocks, self.snapshots)
        self.lanes: dict[int, LaneRecord] = {}
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
    def cost(self) -> CacheCostModel:
        """The cost model that prices admission sources and GDSF values."""
        return self._cost

    @cost.setter
    def cost(self, cost: CacheCostModel) -> None:
        # Every later decision uses the new model; cached H values stay until next revalued.
        self._cost = self._admission.cost = cost
        self.host_tier.set_cost(cost)

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

    def _lane(self, lane: int, activated: bool | None = True) -> LaneRecord:
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
        return self.blocks.tree.nodes[nid]

    def snapshot(self, sid: int) -> Snapshot:
        """The snapshot record (read-only for callers). KeyError if it does not exist."""
        return self.snapshots.by_id[sid]

    def lane_path(self, lane: int) -> list[int]:
        return list(self._lane(lane, None).path)

    def match(self, prompt: PromptBlocks) -> MatchResult:
        """§6.1 lookup. Mutates nothing."""
        return self._admission.match(prompt)

    def quote(self, prompt: PromptBlocks, params: QuoteParams) -> Quote:
        """§6.2-§6.3: choose the source and classify readiness. Mutates nothing, pins nothing
        (admission.py)."""
        return self._admission.quote(prompt, params, self._blocked_nodes(), self.epoch)

    def stats(self) -> CacheStats:
        """Counters plus freshly computed gauges (the live object: copy it to keep it).

        The gauges are counted over every node and snapshot (O(tree)): call it on demand, not
        once per engine step."""
        st = self.counters
        nodes = [n for n in self.blocks.tree.nodes.values() if n.id != ROOT]
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
        st.device_evictable_pages = len(self.blocks.lru)
        st.host_slabs_free = self.host_tier.free_slabs
        st.host_slabs_total = self.host_tier.n_slabs
        st.gdsf_l = self.host_tier.L
        return st

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (O(everything))."""
        check_index(self)

    # ---- Device eviction (§9.5) --------------------------------------------------------------

    def evict_device_pages(self, n: int) -> list[int]:
        """§9.5: free >= n cached Device pages for active growth (fewer if not enough are
        evictable). Backed entries first; an unbacked victim takes its subtree and snapshots
        with it. Returns the freed page ids; the memory layer returns them to its free list."""
        self._mutated()
        if n > 0:
            self._evict(n)
        return self.blocks.take_freed()

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
