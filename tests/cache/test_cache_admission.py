"""Spec §13.1 admission arithmetic: candidate choice and fallback, capacity, Blocked vs
Infeasible, quote staleness, Filling candidates skipped."""

from __future__ import annotations

import pytest
from cache_helpers import IMAGE, SLAB, Driver, make_index, tokens

from ninfer.cache import (
    CacheCostModel,
    QuoteParams,
    Readiness,
    SnapshotKind,
    StaleQuoteError,
    prepare_prompt,
)
from ninfer.cache.device_lru import DeviceEntry, EntryKind


def N(i: int) -> DeviceEntry:
    return DeviceEntry(EntryKind.NODE, i)


A = tokens(1, 400)


def quote(ix, toks, ent=10, free=100, total=1000):
    return ix.quote(prepare_prompt(toks), QuoteParams(ent, free, total))


def test_root_quote_needs_the_whole_entitlement():
    ix = make_index()
    q = quote(ix, A, ent=8)
    assert (q.readiness, q.source, q.frontier, q.need_pages) == (Readiness.READY, None, 0, 8)
    assert q.cached_prefix_tokens == 0 and q.restore_bytes == 0


def test_capacity_arithmetic_with_tail_and_host_only_parts():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], endpoint=300)  # endpoint @300: anchor node 4, tail 44 tokens
    q = quote(ix, A, ent=8)
    # Device-resident: ent - ceil(300/64) = 3 growth pages + 1 private COW of the tail
    assert (q.source, q.frontier, q.need_pages, q.restore_bytes) == (1, 300, 4, 0)
    ix.evict_device_pages(100)  # every block and the tail become Host-only
    q = quote(ix, A, ent=8)
    # + 4 path blocks + 1 tail page to restore; image still in its Device slot
    assert (q.source, q.need_pages, q.restore_blocks, q.restore_tail) == (1, 9, 4, True)
    assert q.restore_bytes == 5 * SLAB and not q.restore_image
    assert q.cached_prefix_tokens == 256


def test_choice_prefers_cheapest_and_falls_back_to_s_dev_then_root():
    # expensive prefill, fast restore: the deepest snapshot wins when it fits
    cost = CacheCostModel(1.0, 0.0, 0.0, 64, 1e12, 0.0)
    ix = make_index(host_slabs=64, slots=4, cost=cost)
    d = Driver(ix)
    d.run(1, A[:300], taps=[128], endpoint=300)  # 1: tap @128, 2: endpoint @300 (tail 44)
    ix.evict_device_pages(100)  # nodes 1-4 and the tail are Host-only; images stay
    d.admit(3, A[:200] + tokens(3, 100))  # resumes from 1: restores nodes 1, 2
    ix.release(3)
    assert list(ix.blocks.lru.order())[-2:] == [N(2), N(1)]
    q = quote(ix, A, ent=10, free=100)
    assert [c.source for c in q.considered] == [None, 2, 1]  # root, s*, s_dev
    # s*: restore nodes 3, 4 and the tail, COW the tail, grow 10 - ceil(300/64)
    assert [c.need_pages for c in q.considered] == [10, 2 + 1 + 1 + 5, 10 - 2]
    assert [c.evictable_pages for c in q.considered] == [2, 0, 0]  # own path excluded
    assert (q.readiness, q.source, q.frontier) == (Readiness.READY, 2, 300)
    q = quote(ix, A, ent=10, free=8)  # s* does not fit: s_dev does
    assert (q.readiness, q.source, q.need_pages) == (Readiness.READY, 1, 8)
    q = quote(ix, A, ent=10, free=7)  # neither; nor the root (10 > 7 + 2)
    assert (q.readiness, q.source) == (Readiness.TEMPORARILY_BLOCKED, None)


def test_blocked_versus_permanently_infeasible():
    ix = make_index()
    q = quote(ix, A, ent=50, free=10, total=60)
    assert q.readiness == Readiness.TEMPORARILY_BLOCKED
    q = quote(ix, A, ent=61, free=10, total=60)
    assert q.readiness == Readiness.PERMANENTLY_INFEASIBLE
    with pytest.raises(ValueError):
        ix.stage(q, 1, 10)


def test_evictable_pages_count_but_not_the_admission_own_path():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A, taps=[256])  # nodes 1-6 in the LRU
    assert len(ix.blocks.lru) == 6
    # resuming from @256 pins nodes 1-4: only 5, 6 are evictable for it
    q = quote(ix, A, ent=10, free=4)
    assert (q.source, q.need_pages, q.considered[1].evictable_pages) == (1, 6, 2)
    assert q.readiness == Readiness.READY
    st = ix.stage(q, 2, free_pages=4)
    assert st.evicted_pages == [1005, 1004]  # nodes 6, 5: tail first
    ix.check_invariants()


def test_quote_staleness_via_cache_epoch():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A, taps=[128])
    q = quote(ix, A)
    e = ix.cache_epoch
    ix.evict_device_pages(0)  # any mutation moves the epoch
    assert ix.cache_epoch > e
    with pytest.raises(StaleQuoteError):
        ix.stage(q, 2, 100)
    assert 2 not in ix.lanes
    q = quote(ix, A)
    assert q.epoch == ix.cache_epoch and ix.stage(q, 2, 100).source == 1


def test_candidates_being_filled_are_skipped():
    ix = make_index()
    d = Driver(ix, land=False)
    d.land = True
    d.run(1, A, taps=[128, 256])  # 1 superseded by 2, both Host-backed
    ix.evict_device_pages(100)
    d.land = False
    d.admit(2, A[:300])  # restores nodes 1-4 (Filling: not landed)
    assert ix.node(1).device_state == 2
    q = quote(ix, A)
    assert q.source is None  # both snapshots sit on Filling blocks
    ix.on_restore_landed(d.pending.pop())
    assert quote(ix, A).source == 2
    ix.check_invariants()


def test_stage_restore_activate_and_cancel():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A, taps=[256])
    ix.evict_device_pages(100)
    q = quote(ix, A)
    st = ix.stage(q, 7, 100)
    assert (st.source, st.frontier, st.path, st.restore_pages_needed) == (1, 256, [1, 2, 3, 4], 4)
    assert st.hit_tier == "host" and st.source_slot == 0
    with pytest.raises(ValueError):
        ix.begin_restore(7, [1, 2, 3])
    rb = ix.begin_restore(7, [11, 12, 13, 14])
    assert [(b.node, b.page, b.slab) for b in rb.blocks] == [
        (1, 11, 2),
        (2, 12, 3),
        (3, 13, 4),
        (4, 14, 5),
    ]
    assert rb.image is None and rb.tail is None and rb.bytes == 4 * SLAB
    with pytest.raises(Exception, match="has not landed"):
        ix.cancel_stage(7)
    ix.on_restore_landed(rb.batch_id)
    assert ix.cancel_stage(7) == []
    assert list(ix.blocks.lru.order()) == [N(4), N(3), N(2), N(1)]  # restored pages stay cached
    assert ix.snapshot(1).restore_pins == 0 and all(ix.node(i).active_refs == 0 for i in (1, 2))
    ix.check_invariants()


def test_host_only_image_is_restored_into_the_lane_slot():
    ix = make_index(slots=1)
    d = Driver(ix)
    d.run(1, A, taps=[128])
    d.admit(2, tokens(2, 300))
    d.commit(2, 192)
    grant = ix.allocate_snapshot_slot(2, 192, SnapshotKind.TAP)
    assert grant.slot == 0 and grant.displaced == 1  # 1 keeps only its Host image
    q = quote(ix, A)
    assert q.source == 1 and q.restore_image and q.restore_bytes == IMAGE
    st = ix.stage(q, 3, 100)
    assert st.source_slot == -1 and st.hit_tier == "host"
    rb = ix.begin_restore(3, [])
    assert rb.image.slabs == [0, 1] and rb.blocks == []
    ix.activate(3)
    ix.check_invariants()
