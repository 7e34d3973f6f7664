"""PrefixIndex: the facade the engine drives (docs/cache-api.md, design §5-§10).

The index decides; the engine's memory layer moves bytes. It answers with ids: pages to free,
slabs and pages to copy between. It never imports torch or knows a KV dtype. One engine loop
is its only caller; every mutating method bumps `cache_epoch`, so a quote made before any
mutation is detectably stale. Its parts:

    blocks     BlockStore (blocks.py): the block tree, the Device LRU, the dead-KV set, the
               Device pages freed since the last result
    snapshots  SnapshotStore (snapshot_store.py): snapshots by id and key, ancestor links,
               supersession order, the Device snapshot slot table
    host_tier  HostTier (host_tier.py): the Host slab pool and the GDSF priorities
    registry   Registry (registry.py): the open lanes, the transfer batches in flight, the
               counters, the epoch and clock (the index's own records)

The index is the facade over the parts that run the lane protocol (part.IndexPart), each built
with the stores, the liveness rules and the registry, and no reference back:

    liveness      Liveness (liveness.py): the rules that span stores (what eviction can free,
                  supersession, dropping copies, deletion cascades, §9.3's Host eviction order)
    lifecycle     LaneLifecycle (lanes.py): stage, begin_restore, activate, cancel_stage, release
    publication   Publication (publish.py): block commits and snapshot publication
    slot_policy   SlotPolicy (slot_policy.py): Device snapshot slots (§9.2)
    prefetch      Prefetch (prefetch.py): the blocked head's prefetch (§6.6)
    transfers     Transfers (transfers.py): batches landing, or undone after a Host fault
    loader        Loader (load.py): Host-only entries rebuilt from a cache file (§5.5)

Matching and quoting are the Admission's (admission.py), tap planning is taps.py's; both only
read. The stores do not call each other or the parts; the parts call the stores, the registry and
the liveness rules, never the index.

Invariants (design §10; `check_invariants` checks every one that is checkable without tensors):
  - §10.1 every cached page and every Host slab has exactly one owner (node, image, tail);
  - §10.2 nodes never change identity and are unique per (parent, tokens, extra); §9.4 a node
    without any copy does not exist;
  - §10.3 every node on an activated lane's path has active_refs > 0 and a Device copy;
  - §10.4 a snapshot exists only while valid (path, image and tail each have a copy);
  - §10.5 identity is exact: hashes only select (tested: match never false-hits);
  - §10.6 a Filling copy is pinned, so nothing frees it;
  - counters (live/retained below, active_refs, restore_pins), the Device LRU lists, the dead-KV
    set, the slot table, ancestor links and cached GDSF priorities all match the data;
  - the stats gauges, kept by the stores as they change, equal a recount over the records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ninfer.cache.admission import Admission
from ninfer.cache.blocks import BlockStore
from ninfer.cache.common import SnapshotKind, Span
from ninfer.cache.cost import CacheCostModel
from ninfer.cache.host_pool import HostSlabPool, SlabGeometry
from ninfer.cache.host_tier import HostTier
from ninfer.cache.invariants import check_index
from ninfer.cache.keys import PromptBlocks
from ninfer.cache.lanes import LaneLifecycle
from ninfer.cache.liveness import Liveness
from ninfer.cache.load import Loader
from ninfer.cache.prefetch import Prefetch, PrefetchPlan
from ninfer.cache.publish import Publication
from ninfer.cache.records import (
    CacheConfig,
    CommitResult,
    MatchResult,
    PublishResult,
    Quote,
    QuoteParams,
    ReleaseResult,
    RestoreBatch,
    SlotGrant,
    Staged,
)
from ninfer.cache.registry import Registry
from ninfer.cache.slot_policy import SlotPolicy
from ninfer.cache.snapshot_store import SnapshotStore
from ninfer.cache.snapshots import Snapshot
from ninfer.cache.stats import CacheStats
from ninfer.cache.taps import Tap, TapHint
from ninfer.cache.taps import plan_taps as plan_taps_fn
from ninfer.cache.transfers import Transfers
from ninfer.cache.tree import BlockNode

__all__ = ["PrefixIndex"]


class PrefixIndex:
    """The hybrid prefix cache index. See the module docstring for its parts and invariants."""

    def __init__(
        self,
        config: CacheConfig,
        cost: CacheCostModel,
        host_pool: Callable[[SlabGeometry], HostSlabPool] = HostSlabPool,
    ) -> None:
        """`host_pool` builds the Host tier's slab pool over its geometry (the engine passes
        one whose `allocate` contains its faults)."""
        if config.slab_bytes <= 0 or config.image_bytes <= 0 or config.host_cache_bytes < 0:
            raise ValueError(f"invalid cache sizes in {config}")
        self.config, self._cost = config, cost
        self.blocks = BlockStore(self._revalue)
        tree = self.blocks.tree
        self.snapshots = SnapshotStore(config.device_snapshot_slots, tree, self._revalue)
        self.host_tier = HostTier(config, cost, tree, self.snapshots.by_id, host_pool)
        self.registry = Registry()
        stores = (self.blocks, self.snapshots, self.host_tier)
        self.liveness = Liveness(*stores, self.registry)
        parts = (config, *stores, self.liveness, self.registry)
        self.lifecycle = LaneLifecycle(*parts)
        self.publication = Publication(*parts)
        self.slot_policy = SlotPolicy(*parts)
        self.prefetch = Prefetch(*parts)
        self.transfers = Transfers(*parts, cancel_stage=self.lifecycle.cancel_stage)
        self.loader = Loader(*parts)
        self._admission = Admission(config, cost, self.blocks, self.snapshots)

        # the registry's records, read by the engine, the persistence and the tests (the
        # registry edits them in place and never rebinds them)
        self.lanes, self.batches = self.registry.lanes, self.registry.batches
        self.counters = self.registry.counters

    @property
    def cache_epoch(self) -> int:
        return self.registry.epoch

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

    def _revalue(self, sid: int) -> None:
        self.host_tier.mark(sid)

    # ---- read-only views -------------------------------------------------------------------

    def node(self, nid: int) -> BlockNode:
        """The node record (read-only for callers). KeyError if it does not exist."""
        return self.blocks.tree.nodes[nid]

    def snapshot(self, sid: int) -> Snapshot:
        """The snapshot record (read-only for callers). KeyError if it does not exist."""
        return self.snapshots.by_id[sid]

    def lane_path(self, lane: int) -> list[int]:
        return list(self.registry.lane(lane, None).path)

    def match(self, prompt: PromptBlocks) -> MatchResult:
        """§6.1 lookup. Mutates nothing."""
        return self._admission.match(prompt)

    def quote(self, prompt: PromptBlocks, params: QuoteParams) -> Quote:
        """§6.2-§6.3: choose the source and classify readiness. Mutates nothing, pins nothing
        (admission.py)."""
        return self._admission.quote(
            prompt, params, self.liveness.blocked_nodes(), self.registry.epoch
        )

    def evictable_pages(self) -> int:
        """Device pages eviction can free now (§9.5; Liveness.evictable_pages)."""
        return self.liveness.evictable_pages()

    def stats(self) -> CacheStats:
        """Counters plus the gauges (the live object: copy it to keep it). O(1): the gauges
        are the stores' running counts, which `check_invariants` compares with a recount
        (`invariants.recount_gauges`)."""
        st = self.counters
        blocks, snaps, slab = self.blocks, self.snapshots, self.config.slab_bytes
        st.nodes = len(blocks.tree)
        st.nodes_device = blocks.device_copies
        st.nodes_host = blocks.host_copies
        st.snapshots = len(snaps)
        st.snapshots_device = snaps.slots.snapshot_count
        st.snapshots_host = snaps.host_copies
        st.snapshots_superseded = len(snaps.superseded)
        st.snapshot_tails_device = snaps.tail_pages
        st.device_cached_pages = blocks.device_copies + snaps.tail_pages
        st.device_evictable_pages = len(blocks.lru)
        st.host_slabs_free = self.host_tier.free_slabs
        st.host_slabs_total = self.host_tier.n_slabs
        st.host_block_bytes = blocks.host_copies * slab
        st.host_snapshot_bytes = snaps.host_slabs * slab
        st.gdsf_l = self.host_tier.L
        return st

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (O(everything)); last, the
        gauges `stats()` reports against a recount."""
        check_index(self)

    def revalue_host(self) -> None:
        """Recompute every retained snapshot's cached GDSF value H now, instead of when next
        marked (a soak that tolerates a stale H repairs it with this)."""
        self.host_tier.revalue_all()

    # ---- the lane protocol (docs/cache-api.md): each call answered by the part that owns it -

    def stage(self, quote: Quote, lane: int, free_pages: int) -> Staged:
        """Open `lane` on the quoted source (§6.4; LaneLifecycle.stage)."""
        return self.lifecycle.stage(quote, lane, free_pages)

    def begin_restore(self, lane: int, pages: Sequence[int]) -> RestoreBatch | None:
        """Copy the staged lane's Host-only parts into `pages` (LaneLifecycle.begin_restore)."""
        return self.lifecycle.begin_restore(lane, pages)

    def activate(self, lane: int) -> None:
        """The staged lane starts (LaneLifecycle.activate)."""
        self.lifecycle.activate(lane)

    def cancel_stage(self, lane: int) -> list[int]:
        """Undo stage before activate (LaneLifecycle.cancel_stage)."""
        return self.lifecycle.cancel_stage(lane)

    def release(self, lane: int) -> ReleaseResult:
        """Unpin the lane's path and write it through (§7.6, §7.7; LaneLifecycle.release)."""
        return self.lifecycle.release(lane)

    def plan_taps(
        self,
        lane: int,
        n_tokens: int,
        hints: Sequence[TapHint] = (),
        vision_spans: Sequence[Span] = (),
        resumed_from_endpoint: bool | None = None,
    ) -> list[Tap]:
        """§7.1 taps for the lane's prompt (pure; only counts them). See taps.plan_taps."""
        rec = self.registry.lane(lane, None)
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

    def commit_block(
        self,
        lane: int,
        block_index: int,
        tokens: Sequence[int] | bytes,
        page: int,
        extra: int = 0,
        lookup_hash: int | None = None,
    ) -> CommitResult:
        """Publish the lane's next committed block (§7.6; Publication.commit_block)."""
        return self.publication.commit_block(lane, block_index, tokens, page, extra, lookup_hash)

    def endpoint_worthwhile(self, lane: int, frontier: int) -> bool:
        """§7.7's 64-token rule (Publication.endpoint_worthwhile)."""
        return self.publication.endpoint_worthwhile(lane, frontier)

    def has_snapshot(self, lane: int, frontier: int, tail_tokens: Sequence[int] | bytes) -> bool:
        """A snapshot at `frontier` on the lane's committed path exists (Publication)."""
        return self.publication.has_snapshot(lane, frontier, tail_tokens)

    def allocate_snapshot_slot(
        self, lane: int, frontier: int, kind: SnapshotKind
    ) -> SlotGrant | None:
        """A staging Device slot for a tap or endpoint (§9.2; SlotPolicy)."""
        return self.slot_policy.allocate_snapshot_slot(lane, frontier, kind)

    def free_snapshot_slot(self, lane: int, slot: int) -> None:
        """Return a staging slot the lane will not publish (SlotPolicy)."""
        self.slot_policy.free_snapshot_slot(lane, slot)

    def publish_snapshot(
        self,
        lane: int,
        frontier: int,
        slot: int,
        kind: SnapshotKind,
        tail_tokens: Sequence[int] | bytes = (),
        tail_page: int | None = None,
        finishing: bool = False,
    ) -> PublishResult:
        """Publish the image in staging `slot` (§7.4; Publication.publish_snapshot)."""
        return self.publication.publish_snapshot(
            lane, frontier, slot, kind, tail_tokens, tail_page, finishing
        )

    # ---- Device eviction (§9.5) and prefetch (§6.6) ----------------------------------------

    def evict_device_pages(self, n: int) -> list[int]:
        """§9.5: free >= n cached Device pages for active growth (fewer if not enough are
        evictable). Backed entries first; an unbacked victim takes its subtree and snapshots
        with it. Returns the freed page ids; the memory layer returns them to its free list."""
        self.registry.mutated()
        if n > 0:
            self.liveness.evict(n)
        return self.blocks.take_freed()

    def prefetch_room(self) -> int:
        """Pages a prefetch could use besides the free ones (Prefetch.prefetch_room)."""
        return self.prefetch.prefetch_room()

    def plan_prefetch(self, quote: Quote, free_pages: int, max_blocks: int = 256) -> PrefetchPlan:
        """The blocked head's Host-only path blocks, and room for them (Prefetch)."""
        return self.prefetch.plan_prefetch(quote, free_pages, max_blocks)

    def begin_prefetch(self, nodes: Sequence[int], pages: Sequence[int]) -> RestoreBatch | None:
        """Copy planned prefetch blocks into `pages` (Prefetch.begin_prefetch)."""
        return self.prefetch.begin_prefetch(nodes, pages)

    # ---- transfers landing or undone -------------------------------------------------------

    def on_restore_landed(self, batch_id: int) -> None:
        """A restore or prefetch batch landed (Transfers.on_restore_landed)."""
        self.transfers.on_restore_landed(batch_id)

    def on_write_through_landed(self, batch_id: int) -> None:
        """A write-through batch landed (Transfers.on_write_through_landed)."""
        self.transfers.on_write_through_landed(batch_id)

    def abort_write_through(self, batch_id: int) -> list[int]:
        """A write batch that never ran is undone (Transfers.abort_write_through)."""
        return self.transfers.abort_write_through(batch_id)

    def abort_restore(self, batch_id: int) -> list[int]:
        """A restore or prefetch batch that never (fully) ran is undone (Transfers)."""
        return self.transfers.abort_restore(batch_id)

    # ---- persistence load (§5.5) -----------------------------------------------------------

    def load_block(
        self,
        parent: int,
        tokens: Sequence[int] | bytes,
        extra: int = 0,
        lookup_hash: int | None = None,
    ) -> int:
        """A Host-resident child of `parent` (Loader.load_block)."""
        return self.loader.load_block(parent, tokens, extra, lookup_hash)

    def load_snapshot(
        self,
        anchor: int,
        tail: Sequence[int] | bytes,
        kind: SnapshotKind = SnapshotKind.TAP,
        hits: int = 0,
        superseded: bool = False,
    ) -> int:
        """A Host-only snapshot at `anchor` + `tail` (Loader.load_snapshot)."""
        return self.loader.load_snapshot(anchor, tail, kind, hits, superseded)
