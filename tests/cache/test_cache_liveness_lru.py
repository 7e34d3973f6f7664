"""Spec §13.1 Liveness and Device LRU: exact counters, exact eviction orders and page ids."""

from __future__ import annotations

from cache_helpers import Driver, make_index, tokens

from ninfer.cache import SnapshotKind, prepare_prompt
from ninfer.cache.device_lru import DeviceEntry, EntryKind


def N(i: int) -> DeviceEntry:
    return DeviceEntry(EntryKind.NODE, i)


def T(i: int) -> DeviceEntry:
    return DeviceEntry(EntryKind.TAIL, i)


def live(ix, *ids):
    return [ix.node(i).live_below for i in ids]


def test_live_snapshots_below_under_publish_evict_and_subtree_deletion():
    ix = make_index(host_slabs=0, slots=8)  # Device only: eviction deletes subtrees
    d = Driver(ix)
    a = tokens(1, 300)
    b = a[:128] + tokens(2, 72)  # 200 tokens, shares nodes 1, 2
    d.run(1, a, taps=[128, 256])  # nodes 1-4, snapshots 1 (anchor 2) and 2 (anchor 4)
    assert live(ix, 0, 1, 2, 3, 4) == [2, 2, 2, 1, 1]
    d.run(2, b, endpoint=200)  # resumes from snapshot 1, adds node 5 and endpoint 3
    assert ix.snapshot(3).anchor == 5 and ix.snapshot(3).tail_len == 8
    assert live(ix, 0, 1, 2, 3, 4, 5) == [3, 3, 3, 1, 1, 1]
    # LRU (unbacked): lane 1 released 4,3,2,1; lane 2 re-pinned 1,2 and released 5,2,1;
    # endpoint 3's tail page went in when published.
    assert list(ix.blocks.lru.order()) == [N(4), N(3), T(3), N(5), N(2), N(1)]
    assert ix.evict_device_pages(1) == [1003]  # node 4 and snapshot 2 go
    assert 2 not in ix.snapshots.by_id and live(ix, 0, 1, 2, 3) == [2, 2, 2, 0]
    ix.check_invariants()
    # the tail of endpoint 3 is its last copy: evicting it deletes snapshot 3 only
    assert ix.evict_device_pages(2) == [1002, 1005]  # node 3, then the tail page
    assert sorted(ix.snapshots.by_id) == [1] and sorted(ix.blocks.tree.nodes) == [0, 1, 2, 5]
    assert live(ix, 0, 1, 2, 5) == [1, 1, 1, 0]
    ix.check_invariants()


def test_losing_the_last_copy_deletes_exactly_the_subtree_snapshots():
    ix = make_index(host_slabs=0, slots=8)
    d = Driver(ix)
    a = tokens(1, 260)
    d.run(1, a, taps=[64, 128, 192])  # nodes 1-4; snapshots 1@node1, 2@node2, 3@node3
    d.run(2, a[:64] + tokens(2, 200), taps=[128])  # resumes from 1: nodes 5-7, snapshot 4@5
    assert sorted(ix.snapshots.by_id) == [1, 2, 3, 4]
    # tail-first LRU: lane 2's path (7, 6, 5, then 1 re-released) is the MRU end
    assert list(ix.blocks.lru.order()) == [N(4), N(3), N(2), N(7), N(6), N(5), N(1)]
    freed = ix.evict_device_pages(3)  # node 4 (no snapshot), node 3 (snapshot 3), node 2
    assert freed == [1003, 1002, 1001]
    assert sorted(ix.snapshots.by_id) == [1, 4]
    ix.check_invariants()
    # lane 3 pins node 1; node 5's subtree is unpinned, so it goes with snapshot 4
    d.admit(3, a[:64] + tokens(3, 100))  # resumes from snapshot 1: pins node 1
    assert ix.lane_path(3) == [1]
    assert ix.evict_device_pages(10) == [1006, 1005, 1004]  # 7, 6, 5 (snapshot 4 deleted)
    assert sorted(ix.snapshots.by_id) == [1] and sorted(ix.blocks.tree.nodes) == [0, 1]
    ix.check_invariants()


def test_lru_tail_first_after_release():
    ix = make_index(host_slabs=0)
    d = Driver(ix)
    d.run(1, tokens(1, 300))
    assert list(ix.blocks.lru.order()) == [N(4), N(3), N(2), N(1)]
    assert ix.evict_device_pages(2) == [1003, 1002]  # deepest blocks first
    assert sorted(ix.blocks.tree.nodes) == [0, 1, 2]


def test_hits_move_the_whole_path_to_mru():
    ix = make_index(host_slabs=0)
    d = Driver(ix)
    a, b = tokens(1, 200), tokens(2, 200)
    d.run(1, a)
    d.run(2, b)
    assert list(ix.blocks.lru.order()) == [N(3), N(2), N(1), N(6), N(5), N(4)]
    d.admit(3, a)  # no snapshot: F = 0, the matched path is only touched
    assert list(ix.blocks.lru.order()) == [N(6), N(5), N(4), N(3), N(2), N(1)]
    ix.release(3)
    assert ix.evict_device_pages(1) == [1005]  # node 6: b's tail block


def test_backed_entries_are_consumed_before_unbacked():
    # 4 slabs: the minimum (image 2 + tail 1 + block 1)
    ix = make_index(host_slabs=4)
    d = Driver(ix)
    d.run(1, tokens(1, 130))  # nodes 1, 2 written to slabs 0, 1 (landed: backed)
    assert list(ix.blocks.lru.backed) == [N(2), N(1)]
    d.land = False
    d.run(2, tokens(2, 200))  # nodes 3, 4, 5 need 3 slabs: 2 free + dead KV sweep of node 2
    assert ix.node(2).host_state == 0 and ix.node(1).host_slab == 0
    assert [ix.node(i).host_slab for i in (3, 4, 5)] == [2, 3, 1]
    assert list(ix.blocks.lru.backed) == [N(1)] and list(ix.blocks.lru.unbacked) == [N(2)]
    assert ix.counters.host_dead_kv_reclaimed == 1
    # node 1 (backed) first: it keeps its Host copy; then node 2 (unbacked) is deleted
    assert ix.evict_device_pages(1) == [1000]
    assert ix.node(1).device_state == 0 and ix.node(1).host_state == 1
    assert ix.evict_device_pages(1) == [1001]
    assert 2 not in ix.blocks.tree.nodes
    ix.check_invariants()


def test_pinned_entries_are_never_returned():
    ix = make_index(host_slabs=16)
    d = Driver(ix, land=False)
    d.run(1, tokens(1, 200))  # write-through in flight: nodes 1-3 pinned
    d.admit(2, tokens(2, 200))
    d.commit(2, 192)  # nodes 4-6 pinned by the active lane
    d.snapshot(2, 128, SnapshotKind.TAP)  # image write in flight
    assert len(ix.blocks.lru) == 0
    assert ix.evict_device_pages(100) == []
    for bid in list(d.pending):
        ix.on_write_through_landed(bid)
    assert list(ix.blocks.lru.order()) == [N(3), N(2), N(1)]
    assert ix.evict_device_pages(100) == [1002, 1001, 1000]
    assert [ix.node(i).device_state for i in (4, 5, 6)] == [1, 1, 1]
    ix.check_invariants()


def test_match_after_host_only_keeps_identity():
    ix = make_index(host_slabs=16)
    d = Driver(ix)
    a = tokens(1, 200)
    d.run(1, a, taps=[128])
    ix.evict_device_pages(10)
    m = ix.match(prepare_prompt(a))
    assert m.path == [1, 2, 3] and m.candidates == [1]
    assert all(ix.node(i).device_state == 0 for i in m.path)
