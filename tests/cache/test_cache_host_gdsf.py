"""Spec §13.1 Host GDSF: hand-computed priorities, dead KV first, exclusive path, monotonic L.

Cost model (cache_helpers.exact_cost): C(s) = (F_s - F_a) - 1 seconds exactly; image = 2 slabs
of 4096 B, so Z = 8192 + 4096 * (Host-resident exclusive blocks) [+ 4096 for a tail].
"""

from __future__ import annotations

import pytest
from cache_helpers import Driver, make_index, tokens

from ninfer.cache import Residency, SnapshotKind

A = tokens(1, 129)
B = A[:64] + tokens(2, 129)  # shares block 0 (node 1) with A


def tap_only(d: Driver, lane: int, toks: list[int], frontier: int):
    """Admit and publish one tap, keeping the lane open (its blocks are not written yet)."""
    d.admit(lane, toks)
    return d.snapshot(lane, frontier)


def _siblings(host_slabs: int, slots: int = 4):
    ix = make_index(host_slabs=host_slabs, slots=slots)
    d = Driver(ix)
    d.run(1, A, taps=[128])  # snapshot 1 @ node 2: image slabs 0,1; nodes 1,2 -> slabs 2,3
    d.run(2, B, taps=[192])  # snapshot 2 @ node 4: image slabs 4,5; nodes 3,4 -> slabs 6,7
    return ix, d


def test_two_siblings_lower_density_loses_host_copy():
    ix, d = _siblings(host_slabs=8)
    assert ix.host.free_slabs == 0
    ix.host_tier.flush()
    # s1: C = 128 - 1, Z = image + node 2 (node 1 is shared with s2)
    assert ix.snapshot(1).h == pytest.approx(127 / 12288, rel=1e-12)
    # s2: C = 192 - 1, Z = image + nodes 3, 4
    assert ix.snapshot(2).h == pytest.approx(191 / 16384, rel=1e-12)
    tap_only(d, 3, tokens(3, 257), 256)  # H3 = 255 / 8192 needs 2 slabs
    s1 = ix.snapshot(1)
    assert s1.host_state == Residency.ABSENT and s1.device_slot == 0  # still restorable
    assert ix.snapshot(2).host_state == Residency.RESIDENT
    assert ix.snapshot(3).host_slabs == [0, 1]  # lowest free slabs, ascending
    assert pytest.approx(127 / 12288, rel=1e-12) == ix.host_tier.L
    assert ix.counters.host_gdsf_evicted == 1
    ix.check_invariants()


def test_nested_descendant_is_valued_against_its_ancestor():
    ix = make_index(host_slabs=8)
    d = Driver(ix)
    d.run(1, tokens(1, 257), taps=[128], endpoint=256)  # s1 tap @128, s2 endpoint @256
    assert not ix.snapshot(1).superseded  # the endpoint leaves the last tap retained
    assert ix.snapshot(2).ancestor == 1
    ix.host_tier.flush()
    # s1 shares all its blocks with s2: Z = image only; s2 owns nodes 3, 4 and recomputes
    # only from s1: C = prefill(128 -> 256) - 1
    assert ix.snapshot(1).h == pytest.approx(127 / 8192, rel=1e-12)
    assert ix.snapshot(2).h == pytest.approx(127 / 16384, rel=1e-12)
    tap_only(d, 2, tokens(2, 257), 256)
    assert ix.snapshot(2).host_state == Residency.ABSENT
    assert ix.snapshot(1).host_state == Residency.RESIDENT
    assert ix.snapshot(3).host_slabs == [2, 3]  # lowest free slabs, ascending
    ix.check_invariants()


@pytest.mark.parametrize("hit", [False, True], ids=["no-hit", "hit-on-1"])
def test_frequency_doubles_priority(hit):
    ix = make_index(host_slabs=7)
    d = Driver(ix)
    d.run(1, A, taps=[128])  # s1: image 0,1; nodes 1,2 -> 2,3
    d.run(2, A[:64] + tokens(2, 65), taps=[128])  # s2: image 4,5; node 3 -> 6
    if hit:
        d.admit(3, A[:128] + [5, 6])  # resumes from s1: hits = 1
        assert ix.lane_path(3) == [1, 2] and ix.snapshot(1).hits == 1
        ix.release(3)
    ix.host_tier.flush()
    assert ix.snapshot(1).h == pytest.approx((2 if hit else 1) * 127 / 12288, rel=1e-12)
    assert ix.snapshot(2).h == pytest.approx(127 / 12288, rel=1e-12)
    tap_only(d, 4, tokens(4, 257), 256)
    victim, kept = (2, 1) if hit else (1, 2)  # a tie goes to the least recently hit
    assert ix.snapshot(victim).host_state == Residency.ABSENT
    assert ix.snapshot(kept).host_state == Residency.RESIDENT


def test_dead_kv_is_reclaimed_before_any_snapshot():
    ix = make_index(host_slabs=8)
    d = Driver(ix)
    d.run(1, A, taps=[128])  # s1: 0,1; nodes 1,2: 2,3
    d.run(2, tokens(2, 256))  # no snapshot: nodes 3-6 -> slabs 4-7 are dead KV at once
    assert list(ix.blocks.dead) == [6, 5, 4, 3]  # landed in reverse block order: leaves first
    tap_only(d, 3, tokens(3, 257), 256)
    assert ix.counters.host_dead_kv_reclaimed == 2
    assert ix.snapshot(2).host_slabs == [6, 7]  # node 5's then node 6's slab
    assert ix.snapshot(1).host_state == Residency.RESIDENT
    assert [ix.node(i).host_slab for i in (3, 4, 5, 6)] == [4, 5, -1, -1]
    assert ix.counters.host_gdsf_evicted == 0 and ix.counters.host_superseded_evicted == 0
    ix.check_invariants()


def test_victim_exclusive_path_becomes_dead_and_goes_first():
    ix, d = _siblings(host_slabs=8, slots=2)
    d.admit(3, tokens(3, 257))
    d.commit(3, 256)
    grant = ix.allocate_snapshot_slot(3, 256, SnapshotKind.TAP)
    # no free slot, nothing superseded, no Device-only owner: the least recently hit
    # Host-backed owner (s1) gives up its Device image
    assert grant.slot == 0 and grant.displaced == 1 and not grant.displaced_deleted
    res = ix.publish_snapshot(3, 256, 0, SnapshotKind.TAP)
    ix.on_write_through_landed(res.write.batch_id)
    # s1 was Host-only, so GDSF deleted it; node 2 (its exclusive path) is now dead KV
    assert 1 not in ix.snapshots.by_id and res.write.slabs == [0, 1]
    assert list(ix.blocks.dead) == [2]
    rel = d.release(3)  # 4 blocks to write: dead KV first (node 2's slab 3)
    assert rel.write.blocks[0].slab == 3 and ix.node(2).host_state == Residency.ABSENT
    assert ix.counters.host_dead_kv_reclaimed == 1
    ix.check_invariants()


def test_l_is_monotonic_over_evictions():
    ix, d = _siblings(host_slabs=8)
    seen = [ix.host_tier.L]
    for k in range(3, 9):
        d.run(k, tokens(k, 257), taps=[256])
        seen.append(ix.host_tier.L)
        ix.check_invariants()
    assert seen == sorted(seen) and seen[-1] > 0
    assert ix.counters.host_gdsf_evicted >= 3
