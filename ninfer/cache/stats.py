"""CacheStats: counters of the prefix-cache index plus gauges filled in by PrefixIndex.stats()."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class CacheStats:
    # gauges (recomputed by PrefixIndex.stats())
    nodes: int = 0
    nodes_device: int = 0
    nodes_host: int = 0
    snapshots: int = 0
    snapshots_device: int = 0
    snapshots_host: int = 0
    snapshots_superseded: int = 0
    device_cached_pages: int = 0  # node pages + snapshot tail pages owned by the cache
    device_evictable_pages: int = 0  # in the Device LRU
    host_slabs_free: int = 0
    host_slabs_total: int = 0
    gdsf_l: float = 0.0
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
    restored_host_bytes: int = 0
    prefetched_blocks: int = 0

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)
