"""CacheStats: what `LLM.cache_stats()` reports (README "Cache statistics" documents every field).

Three kinds of field:
  - gauges `PrefixIndex.stats()` reads in O(1) from the counts its stores keep as they change
    (`check_invariants` compares them with `invariants.recount_gauges`, a recount over the
    records), so a scrape costs the engine thread nothing in proportion to the cache;
  - counters the index bumps as it decides (monotonic since construction);
  - engine fields (marked "engine"), which the index leaves at 0 and `KVState.stats()`
    fills from the memory layer and the engine's own counters: Device bytes and page states
    need the KV page size and the lanes, which the index does not know.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class CacheStats:
    # gauges (PrefixIndex.stats(): the stores' running counts; GAUGES names them)
    nodes: int = 0
    nodes_device: int = 0
    nodes_host: int = 0
    snapshots: int = 0
    snapshots_device: int = 0
    snapshots_host: int = 0
    snapshots_superseded: int = 0
    snapshot_tails_device: int = 0  # snapshot tail pages held on the Device
    device_cached_pages: int = 0  # node pages + snapshot tail pages owned by the cache
    device_evictable_pages: int = 0  # in the Device LRU
    host_slabs_free: int = 0
    host_slabs_total: int = 0
    host_block_bytes: int = 0  # slabs of Host-resident blocks
    host_snapshot_bytes: int = 0  # slabs of Host-resident snapshot images and tails
    gdsf_l: float = 0.0
    # engine gauges (KVState.stats())
    device_block_bytes: int = 0  # Device KV bytes of cached blocks
    device_snapshot_bytes: int = 0  # Device state images in snapshot slots + tail pages
    pages_total: int = 0
    pages_free: int = 0
    pages_active: int = 0  # lanes' private pages and pending tap tails
    pages_cached: int = 0  # owned by the index (cached or Filling)
    # counters
    lookups: int = 0
    hits_device: int = 0
    hits_host: int = 0
    hits_root: int = 0
    reuse_tokens: int = 0
    blocks_inserted: int = 0
    blocks_duplicate: int = 0
    blocks_adopted: int = 0
    snapshots_published: int = 0
    taps_published: int = 0  # Tap and Boundary snapshots (snapshots_published minus endpoints)
    snapshots_duplicate: int = 0
    taps_planned: int = 0
    taps_skipped_no_slot: int = 0
    device_evicted_backed: int = 0
    device_evicted_unbacked: int = 0
    subtree_deletions: int = 0
    nodes_deleted: int = 0
    snapshots_deleted: int = 0
    slot_displaced: int = 0
    host_dead_kv_reclaimed: int = 0
    host_superseded_evicted: int = 0
    host_gdsf_evicted: int = 0
    host_image_writes_refused: int = 0
    host_alloc_failures: int = 0
    write_through_bytes: int = 0
    restores: int = 0
    restored_host_bytes: int = 0  # admission restores and prefetches
    prefetched_blocks: int = 0
    # engine counters (KVState.stats())
    taps_skipped_no_page: int = 0  # a non-aligned tap found no page for its tail copy
    taps_dropped: int = 0  # captured but the lane ended before its blocks committed
    prefetches: int = 0  # prefetch batches issued for a blocked FIFO head (§6.6)
    coalesced_waits: int = 0  # FIFO heads that waited for a prefilling sibling (§12.2)
    prefill_tokens: int = 0  # prompt tokens run through prefill passes (not resumed ones)
    host_faults: int = 0  # Host copies / slab allocations that raised (entries Device-only)
    suspensions: int = 0  # requests suspended because the pool could not extend them (§9.5)
    encoder_cache_hits: int = 0  # images whose vision tower output an earlier request left
    encoder_cache_misses: int = 0  # images run through the vision tower

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)


# The index's gauges a recount can check (`invariants.recount_gauges`). gdsf_l is the GDSF clock
# itself, a running maximum with nothing to recount it from.
GAUGES = (
    "nodes",
    "nodes_device",
    "nodes_host",
    "snapshots",
    "snapshots_device",
    "snapshots_host",
    "snapshots_superseded",
    "snapshot_tails_device",
    "device_cached_pages",
    "device_evictable_pages",
    "host_slabs_free",
    "host_slabs_total",
    "host_block_bytes",
    "host_snapshot_bytes",
)
