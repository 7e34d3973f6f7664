"""The benchmark entry point runs (small sizes) and CacheStats gauges match the index."""

from __future__ import annotations

from cache_helpers import Driver, make_index, tokens

from ninfer.cache.bookkeeping import run_cache_bench


def test_run_cache_bench_small():
    r = run_cache_bench(n_tokens=20_000, tree_blocks=3_000, snapshots=30, repeats=2)
    assert (r["prompt_blocks"], r["tree_blocks"], r["snapshots"]) == (312, 3_000, 30)
    assert r["matched_blocks"] == 312  # every block below floor((n-1)/64)
    assert r["candidates"] >= 1 and 0 < r["chosen_frontier"] <= 19_999
    for key in ("split_and_hash", "match", "quote_match_and_choice", "hash_match_choice"):
        assert r[key]["min_ms"] > 0


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
