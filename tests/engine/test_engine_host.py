"""The Host tier through the engine (enable_host_tier=True): write-through at release and
publication, and a resume whose blocks, tail and image all come back from the Host."""

from __future__ import annotations

import random

from engine_helpers import assert_idle, rand_tokens, run


def test_host_only_restore_matches_cold(make_llm):
    rng = random.Random(12)
    llm = make_llm(
        enable_host_tier=True,
        host_cache_mib=4,
        device_snapshot_slots=2,
        kv_capacity=24 * 64,
        max_concurrency=2,
    )
    cold = make_llm(prefix_reuse=False, max_concurrency=2)
    ledger = llm.memory_ledger()
    assert ledger["host_tier"] and ledger["host_slabs"] == 256
    prompt = rand_tokens(rng, 200)
    first = run(llm, prompt, 80)
    for _ in range(7):  # other conversations push its blocks and image off the Device
        run(llm, rand_tokens(rng, 300), 20)
    stats = llm.cache_stats()
    assert stats.device_evicted_backed > 0 and stats.slot_displaced > 0
    follow = prompt + first.token_ids + rand_tokens(rng, 40)
    out = run(llm, follow, 20)
    assert out.usage.cached_tokens == 200 + 80 - 1
    # 4 path blocks + the endpoint's tail page (16 KiB bundles) + the 8448-byte state image
    assert out.usage.restored_host_bytes == 5 * 16384 + 8448
    assert out.token_ids == run(cold, follow, 20).token_ids
    stats = llm.cache_stats()
    assert stats.hits_host == 1 and stats.restores == 1
    assert_idle(llm)
