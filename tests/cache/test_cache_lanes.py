"""Lane protocol: commit kinds, publication rules and errors, restores of tails and images,
endpoint worthiness, prefetching the blocked head (§6.6)."""

from __future__ import annotations

import pytest
from cache_helpers import SLAB, Driver, make_index, tokens

from ninfer.cache import (
    CommitKind,
    LaneError,
    QuoteParams,
    Readiness,
    Residency,
    SnapshotKind,
    prepare_prompt,
)
from ninfer.cache.device_lru import DeviceEntry, EntryKind

A = tokens(1, 400)


def N(i: int) -> DeviceEntry:
    return DeviceEntry(EntryKind.NODE, i)


def test_commit_kinds_inserted_duplicate_adopted():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:200])  # nodes 1-3, written to Host
    assert ix.evict_device_pages(1) == [1002]  # node 3 becomes Host-only
    d.admit(2, A)  # no snapshot: F = 0, recomputes everything
    kinds = [(r.kind, r.node) for r in d.commit(2, 256)]
    assert kinds == [
        (CommitKind.DUPLICATE, 1),
        (CommitKind.DUPLICATE, 2),
        (CommitKind.ADOPTED, 3),  # takes the lane's page 1005 as its Device copy
        (CommitKind.INSERTED, 4),
    ]
    assert ix.node(3).device_page == 1005 and ix.node(4).device_page == 1006
    assert [ix.node(i).active_refs for i in (1, 2, 3, 4)] == [1, 1, 1, 1]
    ix.check_invariants()


def test_lane_protocol_errors():
    ix = make_index()
    d = Driver(ix)
    d.admit(1, A)
    with pytest.raises(LaneError):
        ix.commit_block(1, 1, A[64:128], 5)  # block 0 first
    with pytest.raises(LaneError):
        ix.commit_block(9, 0, A[:64], 5)  # unknown lane
    with pytest.raises(ValueError):
        ix.commit_block(1, 0, A[:63], 5)  # partial block
    d.commit(1, 64)
    grant = ix.allocate_snapshot_slot(1, 128, SnapshotKind.TAP)
    with pytest.raises(LaneError):
        ix.publish_snapshot(1, 128, grant.slot, SnapshotKind.TAP)  # block 1 not committed
    with pytest.raises(LaneError):
        ix.publish_snapshot(1, 100, grant.slot, SnapshotKind.TAP, A[64:100], 7)  # needs block 1
    with pytest.raises(ValueError):
        ix.publish_snapshot(1, 64, grant.slot, SnapshotKind.TAP, (), 7)  # no tail: no page
    with pytest.raises(LaneError):
        ix.publish_snapshot(1, 64, grant.slot + 1, SnapshotKind.TAP)  # not its slot
    ix.free_snapshot_slot(1, grant.slot)
    assert ix.snapshots.slots.free_count == len(ix.snapshots.slots)
    q = ix.quote(prepare_prompt(A), QuoteParams(8, 100, 100))
    with pytest.raises(LaneError):
        ix.stage(q, 1, 100)  # lane 1 is open
    ix.check_invariants()


def test_tail_and_image_restored_from_host():
    ix = make_index(slots=1)
    d = Driver(ix)
    d.run(1, A[:300], endpoint=300)  # snapshot 1: anchor node 4, tail 44 tokens
    d.admit(2, tokens(2, 200))
    d.commit(2, 128)
    assert ix.allocate_snapshot_slot(2, 128, SnapshotKind.TAP).displaced == 1
    ix.evict_device_pages(100)  # path and tail Host-only too
    q = ix.quote(prepare_prompt(A), QuoteParams(8, 100, 100))
    assert (q.source, q.restore_blocks, q.restore_tail, q.restore_image) == (1, 4, True, True)
    st = ix.stage(q, 3, 100)
    assert (st.restore_pages_needed, st.restore_image, st.source_slot) == (5, True, -1)
    with pytest.raises(LaneError):
        ix.activate(3)  # Host-only parts need begin_restore first
    rb = ix.begin_restore(3, [21, 22, 23, 24, 25])
    assert [b.page for b in rb.blocks] == [21, 22, 23, 24]
    assert rb.tail == (1, 25, 2) and rb.image.slabs == [0, 1]  # published before release
    assert rb.bytes == 5 * SLAB + 2 * SLAB
    ix.activate(3)
    assert ix.snapshot(1).tail_device == Residency.FILLING and ix.snapshot(1).restore_pins == 1
    ix.check_invariants()
    ix.on_restore_landed(rb.batch_id)
    assert ix.snapshot(1).tail_device == Residency.RESIDENT and ix.snapshot(1).restore_pins == 0
    assert DeviceEntry(EntryKind.TAIL, 1) in ix.blocks.lru
    ix.check_invariants()


def test_endpoint_worthwhile_needs_64_tokens_past_the_deepest_snapshot():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], taps=[256])
    d.admit(2, A[:300] + [7] * 50)  # resumes from @256 (existing also lists it)
    assert not ix.endpoint_worthwhile(2, 300)
    assert ix.endpoint_worthwhile(2, 320)
    d.commit(2, 320)
    d.snapshot(2, 320)
    assert not ix.endpoint_worthwhile(2, 350)


def test_prefetch_copies_the_heads_host_only_path_into_spare_pages():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A, taps=[256])  # nodes 1-6, snapshot 1 @256
    ix.evict_device_pages(100)  # all Host-only
    d.run(2, tokens(2, 200))  # nodes 7-9: Host-backed LRU entries
    assert list(ix.blocks.lru.order()) == [N(9), N(8), N(7)]
    q = ix.quote(prepare_prompt(A), QuoteParams(12, 1, 100))
    assert q.readiness == Readiness.TEMPORARILY_BLOCKED  # 4 restores + 8 growth > 1 + 3
    assert [(c.source, c.restore_blocks) for c in q.considered] == [(None, 0), (1, 4)]
    assert ix.prefetch_room() == 3
    plan = ix.plan_prefetch(q, free_pages=1)
    assert plan.evicted_pages == [1008, 1007, 1006]  # nodes 9, 8, 7: Host copies kept
    assert plan.nodes == [1, 2, 3, 4]
    rb = ix.begin_prefetch(plan.nodes, [31, 32, 33, 34])
    assert [(b.node, b.page) for b in rb.blocks] == [(1, 31), (2, 32), (3, 33), (4, 34)]
    assert len(ix.blocks.lru) == 0  # Filling nodes are pinned
    ix.on_restore_landed(rb.batch_id)
    assert list(ix.blocks.lru.order()) == [N(4), N(3), N(2), N(1)]  # deeper blocks go first
    q = ix.quote(prepare_prompt(A), QuoteParams(12, 20, 100))
    assert (q.readiness, q.source, q.restore_blocks) == (Readiness.READY, 1, 0)
    assert ix.counters.prefetched_blocks == 4
    ix.check_invariants()
