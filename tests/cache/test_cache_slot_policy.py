"""Spec §9.2 Device snapshot slot policy: which owner each step displaces, when the intended
victim is not the lowest slot number, the "worth as much" tie of step 3, the tail term of the
estimate, and the lineage a skipped or dropped tap leaves retained.

Cost model (cache_helpers.exact_cost): C(s) = (F_s - F_a) - 1 seconds; image = 2 slabs of
4096 B. With no Host tier every snapshot is Device-only and Z = 8192 [+ 4096 for a tail]; the
estimate of a new snapshot adds 4096 per block it owns (§9.2 step 3).
"""

from __future__ import annotations

from cache_helpers import IMAGE, Driver, make_index, tokens

from ninfer.cache import CacheCostModel, Residency, SlotGrant, SnapshotKind

RES, ABS = Residency.RESIDENT, Residency.ABSENT


def tap_only(d: Driver, lane: int, toks: list[int], frontier: int):
    d.admit(lane, toks)
    return d.snapshot(lane, frontier)


def grant_at(d: Driver, lane: int, toks: list[int], frontier: int) -> SlotGrant | None:
    """Admit, commit the blocks below `frontier` and ask for a tap slot."""
    d.admit(lane, toks)
    d.commit(lane, frontier)
    return d.ix.allocate_snapshot_slot(lane, frontier, SnapshotKind.TAP)


def test_a_free_slot_displaces_nothing():
    ix = make_index(host_slabs=0, slots=2)
    d = Driver(ix)
    assert grant_at(d, 1, tokens(1, 200), 128) == SlotGrant(0, None, False, [])


def test_step2_takes_the_oldest_supersession_not_the_lowest_slot():
    ix = make_index(host_slabs=0, slots=3)
    d = Driver(ix)
    a, b = tokens(1, 300), tokens(2, 300)
    tap_only(d, 1, a, 64)  # s1 in slot 0
    tap_only(d, 2, b, 64)  # s2 in slot 1
    d.snapshot(2, 128)  # s3 in slot 2 supersedes s2 (its lane's previous tap)
    assert ix.snapshot(2).superseded and not ix.snapshot(1).superseded
    d.commit(1, 128)
    grant = ix.allocate_snapshot_slot(1, 128, SnapshotKind.TAP)  # supersedes s1 now
    # both superseded, both Device-only: s2's supersession is the older one
    assert grant == SlotGrant(1, 2, True, [])
    assert 2 not in ix.snapshots.by_id and ix.snapshot(1).superseded
    assert ix.counters.slot_displaced == 1


def test_step3_takes_the_lowest_h_not_the_lowest_slot():
    ix = make_index(host_slabs=0, slots=2)
    d = Driver(ix)
    tap_only(d, 1, tokens(1, 200), 128)  # slot 0, H = 127/8192
    tap_only(d, 2, tokens(2, 200), 64)  # slot 1, H = 63/8192
    # estimate of a tap at 640: 639 / (8192 + 10 * 4096) = 0.0120, above 63/8192 = 0.0077 but
    # below 127/8192 = 0.0155: only slot 1's owner may go
    grant = grant_at(d, 3, tokens(3, 700), 640)
    assert grant == SlotGrant(1, 2, True, [])
    assert ix.host_tier.L == 63 / 8192
    # again: L rose to 63/8192, so the estimate is 0.0197 and s1 (0.0155) goes as well
    grant = grant_at(d, 4, tokens(4, 700), 640)
    assert grant == SlotGrant(0, 1, True, [])
    assert ix.counters.slot_displaced == 2


def test_step3_tail_makes_the_estimate_lower():
    ix = make_index(host_slabs=0, slots=1)
    d = Driver(ix)
    tap_only(d, 1, tokens(1, 200), 64)  # H = 63/8192 = 0.00769
    # a tap at 100 (36-token tail): 99 / (8192 + 4096 + 4096) = 0.00604 < 0.00769: skipped;
    # without the tail term it would be 99 / 12288 = 0.00806 and displace s1
    assert grant_at(d, 2, tokens(2, 200), 100) is None
    assert ix.snapshot(1).device_slot == 0


def slow_restore() -> CacheCostModel:
    return CacheCostModel(
        token_s=1.0,
        pair_s=0.0,
        chunk_s=0.0,
        chunk_tokens=64,
        h2d_bytes_per_s=IMAGE / 10_000,
        batch_latency_s=0.0,
    )


def test_step3_worth_as_much_displaces():
    # restoring costs more than recomputing: every H and every estimate is exactly L = 0, a tie
    ix = make_index(host_slabs=0, slots=1, cost=slow_restore())
    d = Driver(ix)
    tap_only(d, 1, tokens(1, 200), 128)
    grant = grant_at(d, 2, tokens(2, 200), 128)
    assert grant == SlotGrant(0, 1, True, [])
    assert 1 not in ix.snapshots.by_id


def test_step4_takes_the_least_recently_hit_not_the_lowest_slot():
    ix = make_index(host_slabs=64, slots=2)
    d = Driver(ix)
    a, b = tokens(1, 129), tokens(2, 129)
    d.run(1, a, taps=[128])  # s1 in slot 0
    d.run(2, b, taps=[128])  # s2 in slot 1
    d.admit(3, a[:128] + [5])  # a hit on s1: s2 is now the least recently hit
    d.release(3)
    assert ix.snapshot(1).host_state == RES and ix.snapshot(2).host_state == RES
    grant = grant_at(d, 4, tokens(4, 200), 128)
    assert grant == SlotGrant(1, 2, False, [])
    assert ix.snapshot(2).device_slot == -1 and ix.snapshot(2).host_state == RES
    assert ix.snapshot(1).device_slot == 0
    grant = grant_at(d, 5, tokens(5, 200), 128)  # then s1, the next least recently hit
    assert grant == SlotGrant(0, 1, False, [])
    assert ix.counters.slot_displaced == 2


def test_an_allocation_at_the_base_does_not_supersede_the_source():
    ix = make_index(host_slabs=64, slots=4)
    d = Driver(ix)
    a = tokens(1, 200)
    d.run(1, a, taps=[128])
    d.admit(2, a[:128] + [5, 6])  # resumes from s1 at 128
    assert ix.lane_path(2) == [1, 2]
    grant = ix.allocate_snapshot_slot(2, 128, SnapshotKind.ENDPOINT)
    assert not ix.snapshot(1).superseded
    res = ix.publish_snapshot(2, 128, grant.slot, SnapshotKind.ENDPOINT)
    assert res.snapshot == 1 and res.duplicate
    assert not ix.snapshot(1).superseded
    ix.check_invariants()


def test_a_tap_at_the_previous_taps_frontier_does_not_supersede_it():
    ix = make_index(host_slabs=64, slots=4)
    d = Driver(ix)
    d.admit(1, tokens(1, 300))
    d.snapshot(1, 128)
    grant = ix.allocate_snapshot_slot(1, 128, SnapshotKind.TAP)
    assert not ix.snapshot(1).superseded
    res = ix.publish_snapshot(1, 128, grant.slot, SnapshotKind.TAP)
    assert res.snapshot == 1 and res.duplicate and not ix.snapshot(1).superseded
