"""Transfers that never ran (spec §6.4, §6.6, §7.6, §9.4; the engine's Host-fault containment
calls PrefixIndex.abort_restore / abort_write_through): what each undo frees and returns, which
copies an entry keeps, the pins it drops, and that an unknown or finished batch is ignored."""

from __future__ import annotations

import pytest
from cache_helpers import Driver, make_index, tokens

from ninfer.cache import PrefixIndex, QuoteParams, Residency, SnapshotKind, prepare_prompt
from ninfer.cache.device_lru import DeviceEntry, EntryKind

ABSENT, RESIDENT, FILLING = Residency.ABSENT, Residency.RESIDENT, Residency.FILLING
P = tokens(1, 400)


def _host_only_tap() -> tuple[PrefixIndex, Driver]:
    """Snapshot 1 (a tap at 136: anchor node 2, an 8-token tail) and its blocks 0-2 (nodes 1-3)
    are Host-only: lane 2's tap took the only Device slot and every cached page was evicted."""
    ix = make_index(slots=1)
    d = Driver(ix)
    d.run(1, P[:200], taps=[136])
    d.run(2, tokens(2, 200), taps=[128])
    assert len(ix.evict_device_pages(100)) == 7  # P's 3 blocks and tail, lane 2's 3 blocks
    s = ix.snapshot(1)
    assert (s.anchor, s.device_state, s.tail_device, s.host_state) == (2, ABSENT, ABSENT, RESIDENT)
    assert [ix.node(n).device_state for n in (1, 2, 3)] == [ABSENT] * 3
    return ix, d


def _stage(ix: PrefixIndex, lane: int) -> None:
    q = ix.quote(prepare_prompt(P[:136] + tokens(lane, 50)), QuoteParams(4, 10**6, 10**6))
    st = ix.stage(q, lane, 10**6)
    assert (st.source, st.path, st.restore_pages_needed, st.restore_image) == (1, [1, 2], 3, True)


def test_failed_restore_keeps_the_entries_another_staged_lane_holds():
    """Lanes 3 and 4 are staged on snapshot 1; lane 3's restore of blocks 0-1, the tail and the
    image fails. Its pages come back, lane 3 is cancelled, and the blocks and the snapshot go
    back to Host-only with their pins dropped; lane 4 still holds them, so their Host copies
    stay and lane 4 restores from them."""
    ix, _ = _host_only_tap()
    _stage(ix, 3)
    _stage(ix, 4)
    rb = ix.begin_restore(3, [7001, 7002, 7003])
    assert [(b.node, b.page) for b in rb.blocks] == [(1, 7001), (2, 7002)]
    assert (rb.tail.snapshot, rb.tail.page) == (1, 7003)
    host_slabs = {n: ix.node(n).host_slab for n in (1, 2)}
    s = ix.snapshot(1)
    image_slabs, tail_slab = list(s.host_slabs), s.tail_slab
    assert s.restore_pins == 3  # the two staged lanes and the batch

    assert ix.abort_restore(rb.batch_id) == [7001, 7002, 7003]

    assert sorted(ix.lanes) == [4]
    for n in (1, 2):
        node = ix.node(n)
        assert (node.device_page, node.device_state) == (-1, ABSENT)
        assert (node.host_slab, node.host_state) == (host_slabs[n], RESIDENT)
        assert (node.active_refs, node.restore_pins) == (1, 0)  # lane 4's path
    s = ix.snapshot(1)
    assert (s.tail_page, s.tail_device, s.device_state) == (-1, ABSENT, ABSENT)
    assert (s.host_slabs, s.tail_slab, s.host_state) == (image_slabs, tail_slab, RESIDENT)
    assert s.restore_pins == 1  # lane 4's stage
    assert ix.stats().snapshots_deleted == 0
    ix.check_invariants()

    rb = ix.begin_restore(4, [8001, 8002, 8003])
    assert [(b.node, b.page, b.slab) for b in rb.blocks] == [
        (1, 8001, host_slabs[1]),
        (2, 8002, host_slabs[2]),
    ]
    assert (rb.tail.page, rb.tail.slab, rb.image.slabs) == (8003, tail_slab, image_slabs)
    ix.on_restore_landed(rb.batch_id)
    ix.activate(4)
    assert (ix.snapshot(1).tail_page, ix.snapshot(1).restore_pins) == (8003, 0)
    ix.check_invariants()


def test_failed_restore_undoes_only_its_own_targets():
    """Lanes 3 and 4 are staged on snapshot 1; lane 3's restore fills blocks 0-1 and the tail,
    so lane 4's restore has only the image left to bring (no pages). Lane 4's restore fails:
    lane 4 is cancelled and drops its pins, while the pages lane 3's batch is filling, and
    the Host copies it reads, stay; lane 3's restore then lands."""
    ix, _ = _host_only_tap()
    _stage(ix, 3)
    _stage(ix, 4)
    rb3 = ix.begin_restore(3, [7001, 7002, 7003])
    rb4 = ix.begin_restore(4, [])
    assert (rb4.blocks, rb4.tail, rb4.image.snapshot) == ([], None, 1)

    assert ix.abort_restore(rb4.batch_id) == []

    assert sorted(ix.lanes) == [3]
    assert [(ix.node(n).device_page, ix.node(n).device_state) for n in (1, 2)] == [
        (7001, FILLING),
        (7002, FILLING),
    ]
    s = ix.snapshot(1)
    assert (s.tail_page, s.tail_device, s.host_state) == (7003, FILLING, RESIDENT)
    assert s.restore_pins == 2  # lane 3's stage and its batch
    ix.check_invariants()
    ix.on_restore_landed(rb3.batch_id)
    ix.activate(3)
    assert (s.tail_page, s.tail_device, s.restore_pins) == (7003, RESIDENT, 0)
    ix.check_invariants()


def test_failed_restore_of_a_lane_that_already_ended_drops_what_it_read():
    """Lane 3 activated and was released while its restore was in flight; the restore then
    fails. The pages it was filling come back, and the Host copies it read are dropped: blocks
    0-1 are left without a copy and go, with block 2 and the snapshot below them."""
    ix, d = _host_only_tap()
    d.land, d.next_page = False, 7001
    d.admit(3, P[:136] + tokens(3, 50))
    (batch,) = d.pending
    assert d.release(3).write is None
    free_slabs = ix.host.free_slabs

    assert ix.abort_restore(batch) == [7001, 7002, 7003]

    assert not ix.lanes and not ix.batches
    assert sorted(ix.blocks.tree.nodes) == [0, 4, 5, 6]  # lane 2's blocks stay
    assert sorted(ix.snapshots.by_id) == [2]
    # blocks 0-2, snapshot 1's two image slabs and its tail slab
    assert ix.host.free_slabs == free_slabs + 6
    st = ix.stats()
    assert (st.subtree_deletions, st.nodes_deleted, st.snapshots_deleted) == (2, 3, 1)
    ix.check_invariants()


def test_failed_prefetch_drops_the_blocks_it_read():
    """A prefetch of the Host-only blocks 0-1 fails: their pages come back and, no lane holding
    them, the blocks lose their Host copy and go with block 2 and the snapshot below them."""
    ix, _ = _host_only_tap()
    q = ix.quote(prepare_prompt(P[:200]), QuoteParams(5, 0, 10**6))
    plan = ix.plan_prefetch(q, 10)
    assert plan.nodes == [1, 2]
    rb = ix.begin_prefetch(plan.nodes, [7001, 7002])
    assert ix.abort_restore(rb.batch_id) == [7001, 7002]
    assert sorted(ix.blocks.tree.nodes) == [0, 4, 5, 6]
    assert sorted(ix.snapshots.by_id) == [2]
    assert ix.stats().nodes_deleted == 3
    ix.check_invariants()


def test_failed_snapshot_write_leaves_the_snapshot_device_only():
    """The write-through of a tap's image and tail never ran: the snapshot keeps its Device
    slot and tail page, loses the Host slabs it was getting, and is no longer pinned."""
    ix = make_index()
    d = Driver(ix, land=False)
    d.admit(1, P)
    free_slabs = ix.host.free_slabs
    res = d.snapshot(1, 136)
    assert (res.write.snapshot, len(res.write.slabs), res.write.tail_slab >= 0) == (1, 2, True)
    s = ix.snapshot(1)
    slot, tail_page = s.device_slot, s.tail_page
    assert (s.host_state, s.restore_pins, ix.host.free_slabs) == (FILLING, 1, free_slabs - 3)

    assert ix.abort_write_through(res.write.batch_id) == []

    s = ix.snapshot(1)
    assert (s.host_slabs, s.tail_slab, s.host_state) == ([], -1, ABSENT)
    assert (s.device_slot, s.device_state) == (slot, RESIDENT)
    assert (s.tail_page, s.tail_device) == (tail_page, RESIDENT)
    assert s.restore_pins == 0
    assert ix.host.free_slabs == free_slabs
    assert ix.stats().snapshots_deleted == 0
    ix.check_invariants()
    # the lane holds the blocks; the tail, unpinned now, is evictable and its only copy
    assert list(ix.blocks.lru.unbacked) == [DeviceEntry(EntryKind.TAIL, 1)]


def _finished_batches() -> tuple[PrefixIndex, dict[str, int]]:
    """A restore batch and a write batch that landed (ids no longer in flight)."""
    ix, d = _host_only_tap()
    d.land = False
    d.admit(3, P[:136] + tokens(3, 100))
    res = d.snapshot(3, 150, SnapshotKind.TAP)
    restore, write = d.pending
    ix.on_restore_landed(restore)
    ix.on_write_through_landed(write)
    assert res.write.batch_id == write
    return ix, {"restore": restore, "write": write}


@pytest.mark.parametrize("undo", ["abort_restore", "abort_write_through"])
@pytest.mark.parametrize("batch", ["restore", "write", "unknown"])
def test_undoing_a_batch_not_in_flight_changes_nothing(undo, batch):
    ix, ids = _finished_batches()
    before = ix.stats()
    epoch = ix.cache_epoch
    assert getattr(ix, undo)(ids.get(batch, 10**6)) == []
    assert ix.stats() == before and ix.cache_epoch == epoch
    ix.check_invariants()
