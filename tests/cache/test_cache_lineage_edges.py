"""The lineage a skipped or dropped tap leaves retained (spec §9.3) and the final generation
opener's own tap candidate (§7.1): edges of the supersession rollback and opener planning."""

from __future__ import annotations

import pytest
from cache_helpers import Driver, make_index, tokens

from ninfer.cache import (
    HintKind,
    LaneError,
    Placement,
    QuoteParams,
    SlotGrant,
    SnapshotKind,
    TapConfig,
    TapHint,
    plan_taps,
    prepare_prompt,
)

E = Placement.EXACT
S, OP = HintKind.STRUCTURAL, HintKind.OPENER


def plan(n, hints, config):
    taps = plan_taps(n, 0, [TapHint(p, k) for p, k in hints], config=config)
    return [(t.position, t.placement, t.priority, t.boundary, t.target) for t in taps]


def grant_at(d: Driver, lane: int, toks: list[int], frontier: int) -> SlotGrant | None:
    d.admit(lane, toks)
    d.commit(lane, frontier)
    return d.ix.allocate_snapshot_slot(lane, frontier, SnapshotKind.TAP)


def test_opener_wins_a_short_budget_over_a_structural_end():
    one = TapConfig(max_new_taps=1, ladder_tokens=4096, min_gap_tokens=1024)
    assert plan(1000, hints=[(500, S), (980, OP)], config=one) == [(980, E, 2, False, 980)]
    two = TapConfig(max_new_taps=2, ladder_tokens=4096, min_gap_tokens=1024)
    assert plan(1000, hints=[(500, S), (980, OP)], config=two) == [
        (500, E, 3, True, 500),
        (980, E, 2, False, 980),
    ]
    # the latest opener is the final generation's
    assert plan(1000, hints=[(700, OP), (980, OP)], config=one) == [(980, E, 2, False, 980)]


def test_a_skipped_or_dropped_tap_leaves_its_lineage_retained():
    ix = make_index(host_slabs=64, slots=2)
    d = Driver(ix)
    a = tokens(1, 300)
    d.run(1, a, taps=[128])  # s1, then Host-only: it holds no slot
    ix.liveness.drop_snapshot_image_device(ix.snapshot(1))
    d.admit(2, a[:128] + tokens(2, 172))  # resumes from s1's Host copy
    d.land = False
    d.snapshot(2, 192)  # s2 in slot 0 supersedes s1; its Host write in flight pins it
    d.land = True
    assert ix.snapshot(1).superseded and ix.snapshot(2).restore_pins == 1
    g3 = grant_at(d, 3, tokens(3, 300), 128)  # lane 3 stages slot 1
    assert g3.slot == 1
    d.commit(2, 256)
    # lane 2's next tap supersedes s2, finds no slot (s2 pinned, slot 1 staged): skipped, and
    # s2 stays the lineage's resume point
    assert ix.allocate_snapshot_slot(2, 256, SnapshotKind.TAP) is None
    assert not ix.snapshot(2).superseded and ix.snapshot(1).superseded
    assert ix.counters.taps_skipped_no_slot == 1
    assert ix.allocate_snapshot_slot(2, 256, SnapshotKind.TAP) is None
    assert ix.counters.taps_skipped_no_slot == 2
    # lane 3 drops its tap; lane 2 gets that slot (superseding s2), then drops it too
    ix.free_snapshot_slot(3, 1)
    grant = ix.allocate_snapshot_slot(2, 256, SnapshotKind.TAP)
    assert grant == SlotGrant(1, None, False, []) and ix.snapshot(2).superseded
    ix.free_snapshot_slot(2, 1)
    assert not ix.snapshot(2).superseded
    with pytest.raises(LaneError, match="slot 1 is not staged by lane 2"):
        ix.free_snapshot_slot(2, 1)
    ix.check_invariants()


def test_a_dropped_first_tap_leaves_the_source_retained():
    ix = make_index(host_slabs=64, slots=4)
    d = Driver(ix)
    a = tokens(1, 300)
    d.run(1, a, taps=[128])
    d.admit(2, a[:128] + tokens(2, 172))  # resumes from s1
    d.commit(2, 192)
    grant = ix.allocate_snapshot_slot(2, 192, SnapshotKind.TAP)
    assert ix.snapshot(1).superseded
    ix.free_snapshot_slot(2, grant.slot)
    assert not ix.snapshot(1).superseded
    # the next tap of the lane supersedes the source again
    grant = ix.allocate_snapshot_slot(2, 192, SnapshotKind.TAP)
    assert ix.snapshot(1).superseded
    ix.publish_snapshot(2, 192, grant.slot, SnapshotKind.TAP)
    assert ix.snapshot(1).superseded
    ix.check_invariants()


def test_freeing_a_slot_a_staged_lane_never_had_names_the_slot():
    ix = make_index(host_slabs=64, slots=2)
    toks = tokens(1, 200)
    q = ix.quote(prepare_prompt(toks), QuoteParams(5, 10**6, 10**6))
    ix.stage(q, 1, 10**6)  # staged, not activated yet
    with pytest.raises(LaneError, match=r"^slot 0 is not staged by lane 1$"):
        ix.free_snapshot_slot(1, 0)
    with pytest.raises(LaneError, match=r"^lane 2 is not open$"):
        ix.free_snapshot_slot(2, 0)
