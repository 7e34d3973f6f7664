"""Host tier eviction through the engine (spec §9.3): the order (dead KV first, then the oldest
superseded snapshot, then GDSF) on a hand-checked 8-slab case, and GDSF keeping a shared system
prompt over stale endpoints in a many-session trace."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from engine_helpers import TINY, assert_idle, greedy, rand_tokens

from ninfer.cache.common import Residency, SnapshotKind
from ninfer.llm import LLM
from ninfer.models.presets import build_random_model

# 4 KV heads x head_dim 64: a 128 KiB block bundle, so a 1 MiB Host tier is 8 slabs; a state
# image (8448 B) takes one slab, an endpoint with a tail two.
WIDE = dataclasses.replace(TINY, num_attention_heads=4, num_key_value_heads=4, head_dim=64)


@pytest.fixture(scope="module")
def wide_model():
    return build_random_model(WIDE, torch.float32, "cpu", seed=2)


def _trace_host_evictions(index) -> list[tuple]:
    """Log every §9.3 step the index takes, in order: ("dead", node), ("superseded", snapshot),
    ("gdsf", snapshot). Wraps the instance's three victim pickers."""
    log: list[tuple] = []
    sweep, oldest, victim = (
        index.liveness.sweep_dead_one,
        index.liveness.oldest_superseded_host,
        index.host_tier.victim,
    )

    def traced_sweep():
        nid = next(iter(index.blocks.dead), None)
        done = sweep()
        if done:
            log.append(("dead", nid))
        return done

    def traced_oldest():
        s = oldest()
        if s is not None:
            log.append(("superseded", s.id))
        return s

    def traced_victim():
        v = victim()
        if v is not None:
            log.append(("gdsf", v.id))
        return v

    index.liveness.sweep_dead_one = traced_sweep
    index.liveness.oldest_superseded_host = traced_oldest
    index.host_tier.victim = traced_victim
    return log


def test_full_host_tier_evicts_in_spec_order(wide_model, demo_text):
    """Endpoints only (no taps), one snapshot slot, one lane, a Device that holds everything:
    only the 8-slab Host tier is under pressure. Snapshot ids count from 1 in publication
    order, node ids from 1 in insertion order; slabs come out lowest first."""
    tok, _ = demo_text
    llm = LLM.from_model(
        wide_model,
        tokenizer=tok,
        device="cpu",
        prefill_chunk=64,
        max_concurrency=1,
        kv_capacity=64 * 64,
        host_cache_mib=1,
        device_snapshot_slots=1,
        cache_taps_per_request=0,
        check_invariants=True,
    )
    try:
        index = llm.engine.kv_state.index
        assert index.host.n_slabs == 8
        log = _trace_host_evictions(index)
        rng = random.Random(3)

        def turn(prompt):
            log.clear()
            return llm.generate([prompt], greedy(1))[0]

        a_prompt = rand_tokens(rng, 130)
        a = turn(a_prompt)  # endpoint 1 (image + tail: slabs 0, 1), blocks n1 n2 (2, 3)
        turn(rand_tokens(rng, 130))  # endpoint 2 (4, 5; takes the slot), blocks n3 n4 (6, 7)
        assert index.host.free_slabs == 0 and log == []
        # A's second turn resumes from endpoint 1 and supersedes it. Its endpoint 3 needs 2
        # slabs: no dead KV (every Host block has a snapshot below) -> the oldest superseded
        # snapshot, endpoint 1, goes. Its new block n5 needs 1: nothing dead or superseded ->
        # GDSF takes endpoint 2 (Host-only: the slot went to endpoint 3), whose path n3 n4 is
        # now dead KV; its 2 freed slabs suffice, so the dead blocks wait.
        a2_prompt = a_prompt + a.token_ids + rand_tokens(rng, 70)
        a2 = turn(a2_prompt)
        assert a2.usage.cached_tokens == 130
        assert log == [("superseded", 1), ("gdsf", 2)]
        # A's third turn supersedes endpoint 3. Endpoint 4 needs 2 slabs (1 free): dead KV
        # first, leaves first (n4). Its new blocks need 1 each: the last dead block (n3), then
        # the oldest superseded snapshot, endpoint 3 -- dead KV before superseded.
        a3 = turn(a2_prompt + a2.token_ids + rand_tokens(rng, 140))
        assert a3.usage.cached_tokens == 201
        assert log == [("dead", 4), ("dead", 3), ("superseded", 3)]
        # A new conversation: nothing dead or superseded, so GDSF takes the only other
        # snapshot, endpoint 4 (Host-only again), and its exclusive path becomes dead KV that
        # the next block allocation reclaims, deepest first (n7).
        turn(rand_tokens(rng, 130))
        assert log == [("gdsf", 4), ("dead", 7)]
        st = llm.cache_stats()
        assert (st.host_dead_kv_reclaimed, st.host_superseded_evicted, st.host_gdsf_evicted) == (
            3,
            2,
            2,
        )
        assert st.host_slabs_free == 0 and st.host_alloc_failures == 0
        assert_idle(llm)
    finally:
        llm.close()


def test_gdsf_keeps_the_shared_system_prompt_over_stale_endpoints(make_llm):
    """20 sessions x 3 turns behind one 640-token system block (a client breakpoint, so a
    Boundary snapshot) with a 64-slab Host tier that holds a fraction of the trace."""
    rng = random.Random(41)
    llm = make_llm(
        host_cache_mib=1, kv_capacity=64 * 64, max_concurrency=2, device_snapshot_slots=3
    )
    system = rand_tokens(rng, 640)
    histories = [system + rand_tokens(rng, 100) for _ in range(20)]
    for _turn in range(3):
        outs = llm.generate(
            [{"prompt_token_ids": h, "cache_breakpoints": [640]} for h in histories], greedy(20)
        )
        assert all(o.usage.cached_tokens >= 640 for o in outs[1:])
        histories = [
            h + o.token_ids + rand_tokens(rng, 60) for h, o in zip(histories, outs, strict=True)
        ]
    st = llm.cache_stats()
    assert st.host_superseded_evicted > 0 and st.host_gdsf_evicted > 0
    index = llm.engine.kv_state.index
    (boundary,) = [s for s in index.snapshots.by_id.values() if s.frontier == 640]
    assert boundary.kind == SnapshotKind.BOUNDARY
    assert boundary.host_state == Residency.RESIDENT  # GDSF kept it
    # every first turn but the first hit it, and so did later turns whose own (stale)
    # endpoint GDSF had evicted
    assert boundary.hits > 19
    endpoints = [s for s in index.snapshots.by_id.values() if s.kind == SnapshotKind.ENDPOINT]
    assert len([s for s in endpoints if s.host_state == Residency.RESIDENT]) < 20
    fresh = llm.generate([system + rand_tokens(rng, 90) for _ in range(2)], greedy(5))
    assert [o.usage.cached_tokens for o in fresh] == [640, 640]
    assert_idle(llm)
