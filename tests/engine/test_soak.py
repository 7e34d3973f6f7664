"""The soak (`python -m ninfer.bench.soak` runs it long), CI-sized: hundreds of requests over
shared prefixes through 8 lanes with random cancellations, a small Device pool and a Host tier
(evictions and restores), invariants checked every few steps; nothing is lost, nothing leaks,
repeats agree."""

from __future__ import annotations

import io

from ninfer.bench.soak import run_soak


def test_soak_ci_sized(make_llm):
    llm = make_llm(
        max_concurrency=8, kv_capacity=48 * 64, host_cache_mib=4, device_snapshot_slots=4,
        check_invariants=False,  # the soak checks every few steps instead
    )  # fmt: skip
    log = io.StringIO()
    report = run_soak(
        llm,
        requests=400,
        clients=4,
        cancel_rate=0.3,
        check_every=7,
        report_every=1.0,
        max_tokens=12,
        prefix_tokens=300,
        seed=3,
        max_growth_mib=256.0,  # a CPU RSS is noisy at this size; the H200 run is the real one
        out=log,
    )
    assert report.ok, report.failures
    assert report.outputs == report.requests == 400
    assert report.reasons["abort"] > 0 and report.reasons["length"] > 0
    assert report.invariant_checks > 10
    stats = llm.cache_stats()
    assert stats.restores > 0 and stats.hits_host > 0  # the Host tier was exercised
    assert stats.device_evicted_backed + stats.device_evicted_unbacked > 0
