"""The Host tier through the engine (on by default whenever host_cache_mib > 0): write-through
at release and publication, resumes whose blocks, tail and image come back from the Host, the
Device-only mode, and the engine's CacheStats fields."""

from __future__ import annotations

import random

import torch
from engine_helpers import assert_idle, rand_tokens, run

from ninfer.cache.common import Residency, SnapshotKind

BUNDLE = 16384  # one block (or tail) slab of the tiny model: 1 FA layer x 2 x 64 x 32 x fp32
IMAGE = 8448  # one state image: 3 GDN layers' fp32 recurrent + conv state


def _host_llm(make_llm):
    return make_llm(
        host_cache_mib=4, device_snapshot_slots=2, kv_capacity=24 * 64, max_concurrency=2
    )


def _push_off_device(llm, rng) -> None:
    """Other conversations push the earlier one's blocks, tail and image off the Device."""
    for _ in range(7):
        run(llm, rand_tokens(rng, 300), 20)
    stats = llm.cache_stats()
    assert stats.device_evicted_backed > 0 and stats.slot_displaced > 0


def test_host_only_restore_matches_cold(make_llm):
    rng = random.Random(12)
    llm = _host_llm(make_llm)
    cold = make_llm(prefix_reuse=False, max_concurrency=2)
    ledger = llm.memory_ledger()
    assert ledger["host_tier"] and ledger["host_slabs"] == 256
    prompt = rand_tokens(rng, 200)
    first = run(llm, prompt, 80)
    _push_off_device(llm, rng)
    follow = prompt + first.token_ids + rand_tokens(rng, 40)
    out = run(llm, follow, 20)
    assert out.usage.cached_tokens == 200 + 80 - 1
    # 4 path blocks + the endpoint's tail page (16 KiB bundles) + the 8448-byte state image
    assert out.usage.restored_host_bytes == 5 * BUNDLE + IMAGE
    assert out.metrics.restore_s == 0.0  # CPU copies are synchronous: nothing to time
    assert out.token_ids == run(cold, follow, 20).token_ids
    llm.settle()  # every write-through and restore landed and retired
    assert llm.engine.call(lambda: not llm.engine.kv_state.index.batches)  # none in flight
    stats = llm.cache_stats()
    assert stats.hits_host == 1 and stats.restores == 1
    assert stats.restored_host_bytes == 5 * BUNDLE + IMAGE
    assert_idle(llm)


def _written(kv_state, frontier: int):
    """Device copies of the endpoint at `frontier` and of its path blocks (engine thread)."""
    index, kv, states = kv_state.index, kv_state.kv.kv, kv_state.states
    (s,) = [s for s in index.snapshots.by_id.values() if s.frontier == frontier]
    assert s.kind == SnapshotKind.ENDPOINT and s.host_state == Residency.RESIDENT
    blocks, nid = {}, s.anchor
    while nid != 0:
        node = index.node(nid)
        assert node.host_state == Residency.RESIDENT
        blocks[nid] = [layer[node.device_page].clone() for layer in kv]
        nid = node.parent
    phys = states.snap_phys[s.device_slot]
    image = (states.conv[phys].clone(), states.ssm[phys].clone())
    tail = [layer[s.tail_page].clone() for layer in kv]
    return s.id, blocks, image, tail


def test_host_restore_is_bit_identical_to_what_was_written(make_llm):
    rng = random.Random(13)
    llm = _host_llm(make_llm)
    engine = llm.engine
    kv_state = engine.kv_state
    prompt = rand_tokens(rng, 200)
    first = run(llm, prompt, 80)
    sid, blocks, image, tail = engine.call(lambda: _written(kv_state, 279))
    assert len(blocks) == 4
    _push_off_device(llm, rng)
    restored = {}
    transfer = kv_state.transfer
    original = transfer.restore

    def spy(batch, lane_slot):  # what the restore put on the Device, before any pass runs
        ticket = original(batch, lane_slot)
        ticket.wait_all()
        kv, states = kv_state.kv.kv, kv_state.states
        restored["blocks"] = {b.node: [layer[b.page].clone() for layer in kv] for b in batch.blocks}
        restored["tail"] = [layer[batch.tail.page].clone() for layer in kv]
        restored["image"] = (states.conv[lane_slot].clone(), states.ssm[lane_slot].clone())
        return ticket

    transfer.restore = spy
    out = run(llm, prompt + first.token_ids + rand_tokens(rng, 40), 5)
    assert out.usage.cached_tokens == 279 and out.usage.restored_host_bytes == 5 * BUNDLE + IMAGE
    assert restored["blocks"].keys() == blocks.keys()
    for nid, pages in blocks.items():
        assert all(torch.equal(a, b) for a, b in zip(pages, restored["blocks"][nid], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(tail, restored["tail"], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(image, restored["image"], strict=True))
    assert_idle(llm)


def test_host_cache_zero_is_device_only(make_llm):
    rng = random.Random(14)
    llm = make_llm(host_cache_mib=0, kv_capacity=24 * 64, max_concurrency=2)
    cold = make_llm(prefix_reuse=False, max_concurrency=2)
    cfg, ledger = llm.engine_config, llm.memory_ledger()
    assert not cfg.memory.host_tier and cfg.memory.device_snapshot_slots == 2 + 2
    assert cfg.cache.cache_taps_per_request == 2
    assert ledger["host_tier"] is False and ledger["host_bytes"] == ledger["host_slabs"] == 0
    prompt = rand_tokens(rng, 200)
    first = run(llm, prompt, 80)
    follow = prompt + first.token_ids + rand_tokens(rng, 40)
    out = run(llm, follow, 10)
    assert out.usage.cached_tokens == 279 and out.usage.restored_host_bytes == 0
    assert out.token_ids == run(cold, follow, 10).token_ids
    for _ in range(4):  # unbacked eviction deletes whole subtrees (§9.4)
        run(llm, rand_tokens(rng, 400), 10)
    stats = llm.cache_stats()
    assert stats.device_evicted_unbacked > 0 and stats.subtree_deletions > 0
    assert stats.nodes_host == stats.snapshots_host == stats.host_slabs_total == 0
    assert stats.write_through_bytes == stats.restores == stats.hits_host == 0
    assert_idle(llm)


def test_cache_stats_fields(make_llm):
    rng = random.Random(15)
    llm = _host_llm(make_llm)
    prompts, outs = [], []
    prompt = rand_tokens(rng, 200)
    first = run(llm, prompt, 80)
    prompts.append(prompt)
    outs.append(first)
    _push_off_device(llm, rng)
    follow = prompt + first.token_ids + rand_tokens(rng, 40)
    outs.append(run(llm, follow, 20))
    prompts.append(follow)
    st = llm.cache_stats()
    cfg = llm.engine_config
    assert st.pages_total == cfg.memory.kv_pages
    assert st.pages_free + st.pages_active + st.pages_cached == st.pages_total
    assert st.pages_active == 0 and st.pages_cached == st.device_cached_pages  # idle
    assert st.device_block_bytes == st.nodes_device * cfg.memory.kv_page_bytes
    assert st.device_snapshot_bytes == (
        st.snapshots_device * IMAGE + st.snapshot_tails_device * cfg.memory.kv_page_bytes
    )
    assert st.host_block_bytes == st.nodes_host * BUNDLE
    assert st.host_slabs_total == 256
    used = (st.host_block_bytes + st.host_snapshot_bytes) // BUNDLE
    assert st.host_slabs_free == 256 - used
    assert st.hits_root + st.hits_device + st.hits_host == st.lookups == 9
    assert st.taps_published <= st.snapshots_published
    assert st.write_through_bytes > 0 and st.restores == 1
    # every prompt token either resumed from the cache or went through a prefill pass
    expect = sum(len(p) for p in prompts) - sum(o.usage.cached_tokens for o in outs)
    expect += 7 * 300  # the conversations of _push_off_device (no reuse between them)
    assert st.prefill_tokens == expect
    assert_idle(llm)


def test_write_through_and_restore_move_long_runs(make_llm):
    """Lowest-first ascending page and slab ids: a lane's blocks are written through, and
    restored, as one run of consecutive pages and slabs (one copy per layer)."""
    from ninfer.memory.copy_runs import coalesce_pages

    rng = random.Random(16)
    llm = _host_llm(make_llm)
    kv_state = llm.engine.kv_state
    transfer, runs = kv_state.transfer, []
    geometry = kv_state.host_slabs.geometry
    write_blocks, restore = transfer.write_blocks, transfer.restore

    def spy_write(batch):
        runs.append(("write", len(batch.blocks), coalesce_pages(_pairs(batch), geometry)))
        return write_blocks(batch)

    def spy_restore(batch, lane_slot):
        runs.append(("restore", len(batch.blocks), coalesce_pages(_pairs(batch), geometry)))
        return restore(batch, lane_slot)

    transfer.write_blocks, transfer.restore = spy_write, spy_restore
    prompt = rand_tokens(rng, 600)
    first = run(llm, prompt, 20)
    _push_off_device(llm, rng)
    run(llm, prompt + first.token_ids + rand_tokens(rng, 30), 5)
    writes = [r for r in runs if r[0] == "write"]
    restores = [r for r in runs if r[0] == "restore"]
    assert writes[0][1] == 9 and len(writes[0][2]) == 1  # 9 blocks, one run
    # the restore's slabs are those 9 consecutive slabs; its pages are what the Device LRU
    # evicted just before, in a full 24-page pool (snapshot tail pages among the cached ones):
    # no 9-page run is free, so a few runs remain
    assert len(restores) == 1 and restores[0][1] == 9 and 1 < len(restores[0][2]) <= 4
    assert_idle(llm)


def _pairs(batch):
    return [(b.page, b.slab) for b in batch.blocks]


def test_idle_check_lands_copies_still_in_flight(make_llm):
    """A write-through the last step queued lands after the engine went idle (a GPU copy
    still running when the loop polled): the idle check waits for it, it is not a leak."""
    from ninfer.memory.transfer import Landed

    llm = _host_llm(make_llm)
    inner = llm.engine.kv_state.transfer.inner
    landed_later, poll = [], inner.poll

    def slow_poll() -> Landed:  # every copy is still running when the loop polls
        landed_later.append(poll())
        return Landed()

    def drain() -> Landed:
        done = Landed()
        for got in [*landed_later, poll()]:
            done.restores += got.restores
            done.writes += got.writes
        landed_later.clear()
        return done

    inner.poll, inner.drain = slow_poll, drain
    run(llm, rand_tokens(random.Random(15), 300), 20)
    assert any(got.writes for got in landed_later)  # the request's write-through is in flight
    assert_idle(llm)
    assert llm.cache_stats().nodes_host > 0
