"""Spec §9.3 Host eviction at its edges: superseded snapshots go before GDSF, restores in flight
are never victims, ties at the write bound, a request for exactly the whole tier, the cost
floor and the new-snapshot estimate of §9.2 step 3.

Cost model (cache_helpers.exact_cost): C(s) = (F_s - F_a) - 1 seconds; image = 2 slabs of
4096 B; Z = 8192 + 4096 * (Host-resident exclusive blocks) [+ 4096 for a tail].
"""

from __future__ import annotations

import pytest
from cache_helpers import IMAGE, Driver, make_index, tokens

from ninfer.cache import CacheCostModel, Residency

RES, ABS = Residency.RESIDENT, Residency.ABSENT


def tap_only(d: Driver, lane: int, toks: list[int], frontier: int):
    """Admit and publish one tap, keeping the lane open (its blocks are not written yet)."""
    d.admit(lane, toks)
    return d.snapshot(lane, frontier)


def slow_restore() -> CacheCostModel:
    """Prefill 1 s per token, but restoring an image takes 10 000 s: every C is floored to 0."""
    return CacheCostModel(
        token_s=1.0,
        pair_s=0.0,
        chunk_s=0.0,
        chunk_tokens=64,
        h2d_bytes_per_s=IMAGE / 10_000,
        batch_latency_s=0.0,
    )


def test_superseded_snapshots_go_before_gdsf_oldest_first():
    # s1 @64 and s2 @128 are superseded by the lane's next taps; s3 @192 is retained. Host:
    # three images (6 slabs) + blocks 0-2 (3 slabs) = 9, full.
    ix = make_index(host_slabs=9, slots=4)
    d = Driver(ix)
    toks = tokens(1, 192)
    d.run(1, toks, taps=[64, 128, 192])
    assert [ix.snapshot(i).superseded for i in (1, 2, 3)] == [True, True, False]
    assert ix.host.free_slabs == 0
    # a tap with a tail needs 3 slabs: s1's image frees 2, then s2's frees 2 more; the
    # retained snapshot s3, GDSF's only candidate, keeps its Host copy
    res = tap_only(d, 2, tokens(2, 300), 200)
    assert 1 not in ix.snapshots.by_id and 2 not in ix.snapshots.by_id
    assert ix.snapshot(3).host_state == RES
    assert ix.snapshot(res.snapshot).host_slabs == [0, 1]
    assert ix.snapshot(res.snapshot).tail_slab == 2
    assert ix.counters.host_superseded_evicted == 2
    assert ix.counters.host_gdsf_evicted == 0
    ix.check_invariants()


def host_only(ix, sid: int) -> None:
    """Take the snapshot's Device image away, as §9.2 step 4 does: restores now read Host."""
    ix.liveness.drop_snapshot_image_device(ix.snapshot(sid))


def test_superseded_snapshot_under_a_restore_is_not_evicted():
    ix = make_index(host_slabs=8, slots=4)
    d = Driver(ix)
    a = tokens(1, 129)
    d.run(1, a, taps=[128])  # s1 @128: image 0,1; blocks 0,1 -> 2,3
    host_only(ix, 1)
    d.land = False
    d.admit(2, a[:128] + [7, 8])  # resumes from s1's Host copy; the restore stays in flight
    d.land = True
    d.admit(3, a[:128] + [9] * 70)  # resumes from s1 too and taps deeper: s1 superseded
    d.snapshot(3, 192)  # s2: image 4,5
    d.release(3)  # block 2 -> slab 6
    s1 = ix.snapshot(1)
    assert s1.superseded and s1.restore_pins == 1 and s1.host_state == RES
    assert ix.host.free_slabs == 1
    # the next image write may not take s1's slabs while lane 2 reads them: GDSF evicts s2
    res = tap_only(d, 4, tokens(4, 400), 384)
    assert ix.snapshot(1).host_state == RES and ix.snapshot(1).host_slabs == [0, 1]
    assert ix.snapshot(2).host_state == ABS and ix.snapshot(2).device_slot >= 0
    assert ix.snapshot(res.snapshot).host_slabs == [4, 5]
    assert ix.counters.host_superseded_evicted == 0
    ix.check_invariants()


def test_restore_in_flight_is_never_the_gdsf_victim():
    ix = make_index(host_slabs=6, slots=4)
    d = Driver(ix)
    a = tokens(1, 129)
    d.run(1, a, taps=[128])  # s1: image 0,1; blocks 0,1 (exclusive) -> 2,3
    host_only(ix, 1)
    tap_only(d, 2, tokens(2, 257), 256)  # s2: H = 255/8192 (its blocks not written yet)
    d.land = False
    d.admit(3, a[:128] + [7, 8])  # restore from s1's Host copy in flight: pinned, one hit
    d.land = True
    ix.host_tier.flush()
    s1 = ix.snapshot(1)
    assert s1.restore_pins == 1
    assert s1.h == pytest.approx(2 * 127 / 16384, rel=1e-12) and s1.h < ix.snapshot(2).h
    assert ix.host.free_slabs == 0
    res = tap_only(d, 4, tokens(4, 321), 320)  # H = 319/8192: evicts s2, the only candidate
    assert ix.snapshot(1).host_state == RES and ix.snapshot(1).host_slabs == [0, 1]
    assert ix.snapshot(2).host_state == ABS and ix.snapshot(2).device_slot >= 0
    assert ix.snapshot(res.snapshot).host_slabs == [4, 5]
    assert pytest.approx(255 / 8192, rel=1e-12) == ix.host_tier.L
    ix.check_invariants()


def test_a_victim_worth_exactly_the_bound_is_evicted():
    # two identical tail taps (3 slabs each, 4 in the tier): the second one's H equals the
    # first's; GDSF stops only at a victim worth *more* than the write, so the tie is evicted
    ix = make_index(host_slabs=4, slots=4)
    d = Driver(ix)
    tap_only(d, 1, tokens(1, 200), 130)
    assert ix.snapshot(1).host_slabs == [0, 1] and ix.snapshot(1).tail_slab == 2
    tap_only(d, 2, tokens(2, 200), 130)
    assert ix.snapshot(1).host_state == ABS and ix.snapshot(1).device_slot == 0
    assert ix.snapshot(2).host_slabs == [0, 1] and ix.snapshot(2).tail_slab == 2
    assert ix.host_tier.L == 129 / 12288
    assert ix.counters.host_gdsf_evicted == 1
    assert ix.counters.host_image_writes_refused == 0


def test_writes_worth_less_than_every_victim_are_refused_each_time():
    ix = make_index(host_slabs=4, slots=4)
    d = Driver(ix)
    tap_only(d, 1, tokens(1, 400), 330)  # H = 329/12288, 3 slabs
    tap_only(d, 2, tokens(2, 200), 130)  # H = 129/12288: refused
    tap_only(d, 3, tokens(3, 200), 130)  # refused again
    assert ix.snapshot(1).host_slabs == [0, 1] and ix.snapshot(1).tail_slab == 2
    assert ix.snapshot(2).host_state == ABS and ix.snapshot(3).host_state == ABS
    assert ix.counters.host_image_writes_refused == 2
    assert ix.counters.host_alloc_failures == 2
    assert ix.host_tier.L == 0.0
    ix.check_invariants()


def test_the_cost_floor_leaves_h_at_l():
    # restoring costs more than recomputing: C = 0, so H = L exactly (not L + something / Z)
    ix = make_index(host_slabs=64, slots=4, cost=slow_restore())
    d = Driver(ix)
    d.run(1, tokens(1, 129), taps=[128])
    ix.host_tier.flush()
    assert ix.snapshot(1).h == 0.0
    # the §9.2 estimate of a new snapshot is floored the same way
    d.admit(2, tokens(2, 300))
    assert ix.host_tier.estimate_new(ix.registry.lane(2).latest_frontier, 256, False) == 0.0


@pytest.mark.parametrize(
    ("frontier", "tail", "expected"),
    [
        # C = (F - 100) - 1; owned blocks F // 64 - 100 // 64; Z = image + tail slab + blocks
        (300, True, 199 / (8192 + 4096 + 3 * 4096)),
        (320, False, 219 / (8192 + 4 * 4096)),
    ],
)
def test_new_snapshot_estimate_counts_from_the_lanes_previous_tap(frontier, tail, expected):
    """§9.2 step 3: the estimate owns the blocks since the lane's previous snapshot (a tap at
    100, not 64-aligned) and recomputes only from there."""
    ix = make_index(host_slabs=64, slots=4)
    d = Driver(ix)
    toks = tokens(1, 400)
    d.admit(1, toks)
    d.snapshot(1, 100)
    assert ix.registry.lane(1).latest_frontier == 100
    latest = ix.registry.lane(1).latest_frontier
    assert ix.host_tier.estimate_new(latest, frontier, tail) == pytest.approx(expected, rel=1e-12)
