"""Cache-related counters only the engine sees (merged into CacheStats by `KVState.stats()`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EngineCounters:
    """Written by the KV-state collaborators and the loop (prefill tokens); read by stats()."""

    taps_skipped_no_page: int = 0  # a non-aligned tap found no page for its tail copy
    taps_dropped: int = 0  # captured, but the lane ended before its blocks committed
    coalesced_waits: int = 0  # FIFO heads that waited for a prefilling sibling (§12.2)
    prefill_tokens: int = 0  # tokens run through prefill passes
    host_faults: int = 0  # Host copies / slab allocations that raised (entries left Device-only)
    suspensions: int = 0  # lanes the pool could not extend, suspended to resume later (§9.5)
    encoder_cache_hits: int = 0  # images whose tower output was kept from an earlier request
    encoder_cache_misses: int = 0  # images run through the vision tower
