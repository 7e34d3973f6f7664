"""The cache-index benchmark (`ninfer bench cache`, ninfer.bench.cache_index) runs at small sizes
and reports the prompt, tree and match it was asked for."""

from __future__ import annotations

from ninfer.bench.cache_index import run_cache_bench


def test_run_cache_bench_small():
    r = run_cache_bench(n_tokens=20_000, tree_blocks=3_000, snapshots=30, repeats=2)
    assert (r["prompt_blocks"], r["tree_blocks"], r["snapshots"]) == (312, 3_000, 30)
    assert r["matched_blocks"] == 312  # every block below floor((n-1)/64)
    assert r["candidates"] >= 1 and 0 < r["chosen_frontier"] <= 19_999
    for key in ("split_and_hash", "match", "quote_match_and_choice", "hash_match_choice"):
        assert r[key]["min_ms"] > 0
