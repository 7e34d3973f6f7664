"""Spec §13.1 Supersession and admission-side slot policy: lineage, Boundary rule, §9.2 order,
image-write bound."""

from __future__ import annotations

import pytest
from cache_helpers import Driver, make_index, tokens

from ninfer.cache import QuoteParams, Residency, SlotGrant, SnapshotKind, prepare_prompt

P = [tokens(k, 300) for k in range(6)]


def test_lineage_previous_tap_superseded_and_a_hit_retains_it():
    ix = make_index()
    d = Driver(ix)
    d.admit(1, P[1])
    d.snapshot(1, 128)
    d.snapshot(1, 256)  # the lane moves past its previous tap
    assert ix.snapshot(1).superseded and not ix.snapshot(2).superseded
    assert list(ix.snapshots.superseded) == [1]
    d.snapshot(1, 290, SnapshotKind.ENDPOINT)
    assert not ix.snapshot(2).superseded  # the endpoint leaves the last tap retained
    d.release(1)
    d.admit(2, P[1][:130] + tokens(7, 70))  # diverges after 128: resumes from snapshot 1
    assert ix.lane_path(2) == [1, 2] and not ix.snapshot(1).superseded
    d.snapshot(2, 200, SnapshotKind.ENDPOINT)  # this lineage moves on
    assert ix.snapshot(1).superseded
    ix.check_invariants()


@pytest.mark.parametrize("deeper_first", [False, True])
def test_a_deferred_tap_is_superseded_by_the_deeper_tap_of_its_prompt(deeper_first):
    """§9.3 when taps publish out of slot order: the tap at 150 (tail 22) waits for block 2,
    and the lane allocates the slot of its tap at 170 before publishing it. Whichever of the
    two publishes first, the shallower ends superseded and the deeper retained."""
    ix = make_index()
    d = Driver(ix)
    toks = P[1]
    d.admit(1, toks)
    d.commit(1, 128)
    g150 = ix.allocate_snapshot_slot(1, 150, SnapshotKind.TAP)
    g170 = ix.allocate_snapshot_slot(1, 170, SnapshotKind.TAP)
    assert not ix.snapshots.superseded  # nothing of the lane is published yet
    d.commit(1, 192)
    order = [(170, g170), (150, g150)] if deeper_first else [(150, g150), (170, g170)]
    sid = {}
    for f, g in order:
        res = ix.publish_snapshot(1, f, g.slot, SnapshotKind.TAP, toks[128:f], d.page())
        sid[f] = res.snapshot
    assert sid == ({170: 1, 150: 2} if deeper_first else {150: 1, 170: 2})
    assert ix.snapshot(sid[150]).superseded and not ix.snapshot(sid[170]).superseded
    assert list(ix.snapshots.superseded) == [sid[150]]
    d.snapshot(1, 290, SnapshotKind.ENDPOINT)  # the endpoint leaves the last tap retained
    assert list(ix.snapshots.superseded) == [sid[150]] and not ix.snapshot(sid[170]).superseded
    ix.check_invariants()


def test_boundary_superseded_only_while_the_tree_below_is_one_chain():
    ix = make_index()
    d = Driver(ix)
    d.admit(1, P[1])
    d.snapshot(1, 128, SnapshotKind.BOUNDARY)
    d.snapshot(1, 256)  # nodes 3, 4 form a single chain below the boundary
    assert ix.snapshot(1).superseded
    ix2 = make_index()
    d2 = Driver(ix2)
    d2.admit(1, P[1])
    d2.snapshot(1, 128, SnapshotKind.BOUNDARY)
    d2.admit(2, P[1][:128] + tokens(7, 100))  # another conversation continues from it
    assert ix2.lane_path(2) == [1, 2]
    d2.commit(2, 192)
    d2.snapshot(1, 256)
    assert not ix2.snapshot(1).superseded  # shared: it stays retained
    d2.snapshot(2, 200, SnapshotKind.ENDPOINT)  # lane 2's own source is not superseded either
    assert not ix2.snapshot(1).superseded
    ix2.check_invariants()


def _slot_setup():
    """slot 0: s1 (Host-backed), slot 1: s2 (Host-backed), slot 2: s3 (Device-only)."""
    ix = make_index(host_slabs=4, slots=3)
    d = Driver(ix)
    for lane, f in ((1, 128), (2, 128), (3, 64)):
        d.admit(lane, P[lane])
        d.snapshot(lane, f)
    assert [ix.snapshot(i).device_slot for i in (1, 2, 3)] == [0, 1, 2]
    assert ix.snapshot(1).host_slabs == [0, 1] and ix.snapshot(2).host_slabs == [2, 3]
    # s3 (H = 63/8192) would have to evict s1 (127/8192): an image write never displaces a
    # snapshot worth more than itself, so s3 stays Device-only
    assert ix.snapshot(3).host_state == Residency.ABSENT
    assert ix.counters.host_image_writes_refused == 1
    return ix, d


def test_slot_from_superseded_owner_first():
    ix, d = _slot_setup()
    d.commit(1, 192)
    grant = ix.allocate_snapshot_slot(1, 192, SnapshotKind.TAP)  # supersedes s1 first
    assert grant == SlotGrant(0, 1, False, [])
    s1 = ix.snapshot(1)
    assert s1.superseded and s1.device_state == Residency.ABSENT and s1.host_slabs == [0, 1]
    ix.check_invariants()


def test_superseded_device_only_owner_is_deleted():
    ix, d = _slot_setup()
    d.commit(3, 128)
    assert ix.allocate_snapshot_slot(3, 128, SnapshotKind.TAP) == SlotGrant(2, 3, True, [])
    assert 3 not in ix.snapshots.by_id


def test_slot_from_least_valuable_device_only_owner_when_worth_as_much():
    ix, d = _slot_setup()
    d.admit(4, P[4])
    d.commit(4, 128)
    # estimate: 127 / (8192 + 2 blocks) = 127/16384 >= H(s3) = 63/8192
    assert ix.allocate_snapshot_slot(4, 128, SnapshotKind.TAP) == SlotGrant(2, 3, True, [])
    assert 3 not in ix.snapshots.by_id
    assert pytest.approx(63 / 8192, rel=1e-12) == ix.host_tier.L
    ix.check_invariants()


def test_slot_from_least_recently_hit_host_backed_owner_otherwise():
    ix, d = _slot_setup()
    d.admit(4, P[4])
    d.commit(4, 64)
    # estimate 63 / 12288 < H(s3): s3 keeps its slot; s1 (least recently hit) loses its image
    assert ix.allocate_snapshot_slot(4, 64, SnapshotKind.TAP) == SlotGrant(0, 1, False, [])
    assert ix.snapshot(1).device_state == Residency.ABSENT
    assert ix.snapshot(1).host_state == Residency.RESIDENT
    assert ix.snapshot(3).device_slot == 2
    ix.check_invariants()


def test_no_slot_means_the_tap_is_skipped():
    ix = make_index(slots=0)
    d = Driver(ix)
    d.admit(1, P[1])
    d.commit(1, 128)
    assert ix.allocate_snapshot_slot(1, 128, SnapshotKind.TAP) is None
    assert ix.counters.taps_skipped_no_slot == 1


def test_pinned_owner_is_never_displaced():
    ix = make_index(host_slabs=0, slots=1)
    d = Driver(ix)
    d.run(1, P[1], taps=[128])
    q = ix.quote(prepare_prompt(P[1][:200]), QuoteParams(5, 100, 100))
    ix.stage(q, 9, 100)  # pins snapshot 1 until activate
    d.admit(3, P[3])
    d.commit(3, 256)
    assert ix.allocate_snapshot_slot(3, 256, SnapshotKind.TAP) is None
    ix.activate(9)
    # unpinned now, but worth more than lane 3's estimate (127/8192 > 255/24576): kept
    assert ix.allocate_snapshot_slot(3, 256, SnapshotKind.TAP) is None
    ix.commit_block(9, 2, P[1][128:192], d.page())
    # lane 9 moves past its source: superseded, and a Device-only superseded owner is deleted
    assert ix.allocate_snapshot_slot(9, 192, SnapshotKind.TAP) == SlotGrant(0, 1, True, [])
    ix.check_invariants()
