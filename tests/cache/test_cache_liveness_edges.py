"""Edges of the residency bookkeeping (spec §9.3, §9.4): the Boundary rule for a snapshot with a
tail, and what losing a Host copy does when a Host transfer never ran (the engine's containment
calls PrefixIndex.abort_write_through / abort_restore): a snapshot left without a copy is
deleted, and a snapshot whose exclusive blocks lost their Host copy is valued again."""

from __future__ import annotations

import pytest
from cache_helpers import Driver, make_index, tokens

from ninfer.cache import PrefixIndex, QuoteParams, Residency, SnapshotKind, prepare_prompt
from ninfer.cache.device_lru import DeviceEntry, EntryKind

ABSENT, RESIDENT, FILLING = Residency.ABSENT, Residency.RESIDENT, Residency.FILLING
P = tokens(1, 400)


def _boundary_at_136(d: Driver) -> int:
    """Lane 1 publishes a Boundary snapshot at 136 (anchor node 2, an 8-token tail) before the
    block holding its tail is committed (a finishing lane publishes from its own last page)."""
    ix = d.ix
    d.admit(1, P)
    d.commit(1, 128)
    grant = ix.allocate_snapshot_slot(1, 136, SnapshotKind.BOUNDARY)
    res = ix.publish_snapshot(
        1, 136, grant.slot, SnapshotKind.BOUNDARY, P[128:136], d.page(), finishing=True
    )
    assert (res.snapshot, ix.snapshot(res.snapshot).anchor) == (1, 2)
    return res.snapshot


@pytest.mark.parametrize(
    ("continuations", "superseded"),
    [
        ((), True),  # nothing below the tail yet
        ((1,), True),  # one chain: the lane's own blocks
        ((1, 3), True),  # lane 3 left before the tail ended: not a continuation of it
        ((1, 2), False),  # lane 2 resumed from the Boundary snapshot: shared
    ],
)
def test_boundary_with_a_tail_counts_only_blocks_continuing_its_tail(continuations, superseded):
    ix = make_index()
    d = Driver(ix)
    b = _boundary_at_136(d)
    children = []
    if 2 in continuations:
        q, _ = d.admit(2, P[:136] + tokens(2, 100))
        assert (q.source, q.frontier) == (b, 136)
        children += d.commit(2, 192)
    if 3 in continuations:
        d.admit(3, P[:130] + tokens(3, 100))
        children += d.commit(3, 192)[-1:]
    if 1 in continuations:
        children += d.commit(1, 256)[:1]
    assert sorted(ix.node(2).children) == sorted(r.node for r in children)
    frontier = 256 if 1 in continuations else 150
    ix.allocate_snapshot_slot(1, frontier, SnapshotKind.TAP)
    assert ix.snapshot(b).superseded is superseded
    assert list(ix.snapshots.superseded) == ([b] if superseded else [])
    ix.check_invariants()


def _tap_write_in_flight() -> tuple[PrefixIndex, Driver, int]:
    """Lane 1 published a tap at 256 and released; the write-through of its four blocks is in
    flight. The tap alone retains them (retained_below == 1): they are its exclusive bytes."""
    ix = make_index()
    d = Driver(ix, land=False)
    d.admit(1, P)
    d.snapshot(1, 256)
    ix.on_write_through_landed(d.pending.pop())  # the tap's own image and tail
    res = d.release(1)
    assert [b.node for b in res.write.blocks] == [1, 2, 3, 4]
    assert [ix.node(n).retained_below for n in (1, 2, 3, 4)] == [1, 1, 1, 1]
    return ix, d, res.write.batch_id


def test_undone_block_write_revalues_the_snapshot_that_owned_the_blocks():
    ix, d, batch = _tap_write_in_flight()
    ix.check_invariants()  # flushes the dirty set: H counts the four Host slabs being written
    h_before = ix.snapshot(1).h
    assert ix.abort_write_through(batch) == []
    assert [ix.node(n).host_state for n in (1, 2, 3, 4)] == [ABSENT] * 4
    assert [e.id for e in ix.blocks.lru.unbacked] == [4, 3, 2, 1]
    ix.host_tier.flush()
    assert ix.snapshot(1).h > h_before  # fewer exclusive bytes, same saving: worth more
    ix.check_invariants()


def _image_only_on_host(tail_on_device: bool) -> tuple[PrefixIndex, int]:
    """Snapshot 1 (tap at 136) lost its Device image to lane 2's tap (one slot); lane 3 is
    staged on it and the restore of its image (and tail, if the tail lost its page) is in flight
    when the Host transfer fails."""
    ix = make_index(slots=1)
    d = Driver(ix)
    d.run(1, P[:200], taps=[136])
    d.run(2, tokens(2, 200), taps=[128])
    s = ix.snapshot(1)
    assert (s.device_state, s.host_state, s.tail_device) == (ABSENT, RESIDENT, RESIDENT)
    if not tail_on_device:
        while ix.snapshot(1).tail_device == RESIDENT:
            ix.evict_device_pages(1)
    q = ix.quote(prepare_prompt(P[:136] + tokens(3, 50)), QuoteParams(4, 10**6, 10**6))
    st = ix.stage(q, 3, 10**6)
    assert (st.source, st.restore_image) == (1, True)
    rb = ix.begin_restore(3, [d.page() for _ in range(st.restore_pages_needed)])
    assert rb.image.snapshot == 1 and (rb.tail is None) == tail_on_device
    return ix, rb.batch_id


@pytest.mark.parametrize("tail_on_device", [True, False])
def test_undone_restore_deletes_a_snapshot_left_without_an_image(tail_on_device):
    ix, batch = _image_only_on_host(tail_on_device)
    tail_page = ix.snapshot(1).tail_page
    freed = ix.abort_restore(batch)
    assert 3 not in ix.lanes
    with pytest.raises(KeyError):
        ix.snapshot(1)
    assert 1 not in ix.snapshots.by_key.values()
    if tail_on_device:
        assert tail_page in freed  # the tail's page goes with the snapshot
    ix.check_invariants()


def test_a_snapshot_published_above_another_takes_over_only_the_deeper_one():
    """Root dependents: t (64, another prompt) and u (256 on P). s (128 on P), published later
    by a lane that resumed from the root, goes between the root and u; t stays a root dependent
    although its frontier is below s's."""
    ix = make_index()
    d = Driver(ix)
    d.run(1, tokens(9, 100), taps=[64])
    d.run(2, P[:300], taps=[256])
    assert ix.snapshots.root_deps == {1, 2}
    d.run(3, P[:200] + tokens(3, 100), taps=[128])
    t, u, s = ix.snapshot(1), ix.snapshot(2), ix.snapshot(3)
    assert (s.frontier, s.anchor, u.anchor) == (128, 3, 5)
    assert ix.snapshots.root_deps == {1, 3}
    assert (t.ancestor, s.ancestor, u.ancestor) == (None, None, 3)
    assert (t.dependents, s.dependents) == (set(), {2})
    ix.check_invariants()


def test_evicting_unbacked_blocks_deletes_them_one_subtree_at_a_time():
    ix = make_index(host_slabs=0)
    d = Driver(ix)
    d.next_page = 0
    d.run(1, tokens(4, 192))
    assert [ix.node(n).device_page for n in (1, 2, 3)] == [0, 1, 2]
    assert ix.evict_device_pages(2) == [2, 1]  # deepest first: each is a leaf then
    st = ix.stats()
    assert (st.subtree_deletions, st.nodes_deleted, st.nodes) == (2, 2, 1)
    assert ix.evict_device_pages(1) == [0]
    st = ix.stats()
    assert (st.subtree_deletions, st.nodes_deleted, st.nodes) == (3, 3, 0)
    ix.check_invariants()


def test_eviction_skips_unbacked_blocks_above_a_prefetch_in_flight():
    """Blocks 0-1 lost their Host copy (their write-through never ran) while blocks 2-3 are
    Host-only under a tap at 256: a prefetch of 2-3 pins them, so evicting 0-1 (which would
    delete the subtree with them) must wait until it lands."""
    ix = make_index()
    first = Driver(ix, land=False)
    first.admit(1, P[:128])
    first.commit(1, 128)
    write = first.release(1).write
    Driver(ix).run(2, P[:300], taps=[256])  # blocks 0-3 (2-3 new)
    assert ix.abort_write_through(write.batch_id) == []
    backed = [ix.node(n).device_page for n in (4, 3)]
    assert ix.evict_device_pages(2) == backed  # blocks 3, 2: Host-backed
    assert list(ix.blocks.lru.unbacked) == [DeviceEntry(EntryKind.NODE, n) for n in (2, 1)]
    q = ix.quote(prepare_prompt(P[:300]), QuoteParams(6, 0, 10**6))
    plan = ix.plan_prefetch(q, 10)
    assert (plan.nodes, plan.evicted_pages) == ([3, 4], [])
    rb = ix.begin_prefetch(plan.nodes, [7, 8])
    assert ix.evictable_pages() == 0
    assert ix.evict_device_pages(10) == []
    ix.check_invariants()
    ix.on_restore_landed(rb.batch_id)
    assert ix.evictable_pages() == 4
    block_1 = ix.node(2).device_page
    assert ix.evict_device_pages(3) == [8, 7, block_1]  # backed first, then unbacked block 1
    assert sorted(ix.blocks.tree.nodes) == [0, 1]
    ix.check_invariants()


def test_a_failed_restore_deletes_the_block_with_its_subtree_and_frees_every_copy():
    """Blocks 0-2 on pages 5, 6, 0 under a tap at 64; the Host (4 slabs: the tap's image and
    two blocks) takes blocks 0-1 only, so block 2 stays unbacked. Blocks 1 and 0 are evicted
    to the Host; lane 2 resumes from the tap and the restore of block 0 fails: block 0 loses
    its last copy, and its subtree (block 1 Host-only, block 2 on Device page 0, the tap) goes
    with it."""
    ix = make_index(host_slabs=4)
    q = ix.quote(prepare_prompt(P[:192]), QuoteParams(4, 10**6, 10**6))
    ix.stage(q, 1, 10**6)
    ix.activate(1)
    for b, page in ((0, 5), (1, 6), (2, 0)):
        ix.commit_block(1, b, P[64 * b : 64 * b + 64], page)
    grant = ix.allocate_snapshot_slot(1, 64, SnapshotKind.TAP)
    pub = ix.publish_snapshot(1, 64, grant.slot, SnapshotKind.TAP)
    rel = ix.release(1)  # the tap's Host write is in flight: GDSF cannot evict it for block 2
    assert [(b.node, b.slab) for b in rel.write.blocks] == [(1, 2), (2, 3)]
    ix.on_write_through_landed(pub.write.batch_id)
    ix.on_write_through_landed(rel.write.batch_id)
    assert ix.evict_device_pages(2) == [6, 5]
    assert list(ix.blocks.lru.unbacked) == [DeviceEntry(EntryKind.NODE, 3)]
    q = ix.quote(prepare_prompt(P[:64] + tokens(2, 30)), QuoteParams(3, 10**6, 10**6))
    st = ix.stage(q, 2, 10**6)
    assert (st.source, st.path, st.restore_pages_needed) == (1, [1], 1)
    rb = ix.begin_restore(2, [9])
    assert ix.abort_restore(rb.batch_id) == [9, 0]
    assert sorted(ix.blocks.tree.nodes) == [0] and not ix.snapshots.by_id and not ix.lanes
    assert ix.host.free_slabs == 4 and ix.snapshots.slots.free_count == 4
    st = ix.stats()
    assert (st.subtree_deletions, st.nodes_deleted, st.snapshots_deleted) == (1, 3, 1)
    ix.check_invariants()
