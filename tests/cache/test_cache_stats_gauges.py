"""CacheStats gauges and counters match the index they describe."""

from __future__ import annotations

from cache_helpers import Driver, make_index, tokens


def test_stats_gauges_and_counters():
    ix = make_index(host_slabs=32)
    d = Driver(ix)
    d.run(1, tokens(1, 200), taps=[128], endpoint=200)
    s = ix.stats()
    assert (s.nodes, s.nodes_device, s.nodes_host) == (3, 3, 3)
    assert (s.snapshots, s.snapshots_device, s.snapshots_host) == (2, 2, 2)
    assert s.device_cached_pages == 4  # 3 blocks + the endpoint's tail page
    assert s.device_evictable_pages == 4
    assert s.host_slabs_total == 32 and s.host_slabs_free == 32 - 3 - 2 - 3
    assert (s.blocks_inserted, s.snapshots_published, s.hits_root) == (3, 2, 1)
    assert s.write_through_bytes == (3 + 2 + 3) * 4096
    assert s.as_dict()["gdsf_l"] == 0.0
