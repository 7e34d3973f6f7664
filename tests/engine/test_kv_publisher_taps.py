"""The Publisher's taps at a chunk boundary and a finishing lane's publication
(ninfer/engine/kv/publisher.py, spec §7.4).

Pinned here, over stand-in index, pools and budget that record what the Publisher asks:
  - `before_chunk` of the prompt's final chunk (s, n] takes a flexible tap in (s, n] at the
    chunk's start s, as a Tap snapshot (a flexible tap at the prompt's end n included); it
    leaves alone a flexible tap at s or before it and an exact tap (the scheduler cut the
    chunk at an exact tap, so it is captured at the chunk's end by `after_advance`);
  - `_publish_finishing` publishes a pending tap exactly when its anchor blocks are committed
    and the lane's state reached its frontier (a tap at the lane's final frontier included),
    with `finishing` and its tail tokens; a tap it cannot publish stays pending, every one of
    them, for `_drop_pending` to free its slot and tail page; a duplicate publication's tail
    page goes back to the pool, and a tap without a tail frees nothing.
"""

from __future__ import annotations

import pytest
from publisher_helpers import PublisherParts, prefilled_lane

from ninfer.cache.common import SnapshotKind
from ninfer.engine.kv.lane import PendingTap

# ---- before_chunk: flexible taps of the final chunk are taken at its start -------------------


@pytest.mark.parametrize("taps", [[(300, False)], [(280, False)], [(257, False), (300, False)]])
def test_a_flexible_tap_in_the_final_chunk_is_captured_at_the_chunks_start(taps):
    """Flexible taps in (s, n], the prompt's end n included, are realized once, at s = 256,
    before the chunk runs: a Tap snapshot of the lane's state there (a page boundary, no tail)."""
    parts = PublisherParts()
    lane = prefilled_lane(300, taps, 256)
    assert parts.pub.before_chunk(lane, 256, 300) == []  # no in-pass slot to write
    assert parts.cache.calls == [("allocate", 256, SnapshotKind.TAP, 0)]
    assert parts.state_taps == [(3, 0)]  # the lane's slot into snapshot slot 0
    assert lane.pending == [PendingTap(256, 0, SnapshotKind.TAP, None)]
    assert lane.last_snapshot == 256 and lane.taps == []
    assert parts.copies == []


@pytest.mark.parametrize(
    "taps",
    [
        [(256, False)],  # at the chunk's start: the state there is not inside the chunk
        [(200, False)],  # before the chunk
        [(300, True)],  # exact at the chunk's end: captured there after the pass
    ],
)
def test_taps_not_strictly_inside_the_final_chunk_or_exact_are_left_for_after_advance(taps):
    parts = PublisherParts()
    lane = prefilled_lane(300, taps, 256)
    assert parts.pub.before_chunk(lane, 256, 300) == []
    assert parts.cache.calls == [] and lane.pending == [] and parts.state_taps == []
    assert lane.taps == taps and lane.last_snapshot == 0


def test_an_exact_tap_at_the_prompt_end_beside_a_flexible_one_is_captured_at_the_end():
    """The flexible tap is taken at the chunk's start; the exact one stays planned and is
    captured at n = 300 after the pass, with its 44-token tail copied into a page of its own."""
    parts = PublisherParts()
    lane = prefilled_lane(300, [(280, False), (300, True)], 256)
    parts.pub.before_chunk(lane, 256, 300)
    assert lane.taps == [(300, True)]
    assert lane.pending == [PendingTap(256, 0, SnapshotKind.TAP, None)]
    lane.computed = 300
    parts.pub.after_advance(lane)
    assert ("allocate", 300, SnapshotKind.TAP, 1) in parts.cache.calls
    assert parts.copies == [(54, 90, 44)]  # block 4's first 44 tokens
    # the tap at 256 publishes (blocks 0..3 committed); the one at 300 waits for block 4
    assert ("publish", 256, 0, SnapshotKind.TAP, (), None, False) in parts.cache.calls
    assert lane.pending == [PendingTap(300, 1, SnapshotKind.TAP, 90)] and lane.taps == []


# ---- a finishing lane publishes what is left from its own pages (§7.4) -----------------------


@pytest.mark.parametrize("duplicate", [False, True])
def test_a_finishing_lane_publishes_the_tap_at_its_final_frontier(duplicate):
    """An exact tap at the prompt's end n = 300 is captured; the reply ends at once (computed
    stays 300), so block 4 never fills: the finishing lane publishes the tap from its own last
    page with its 44 tail tokens. A duplicate leaves the tail page to the engine, which frees
    it; a new snapshot owns it."""
    parts = PublisherParts()
    if duplicate:
        parts.cache.duplicates = {300}
    lane = prefilled_lane(300, [(300, True)], 0)
    lane.computed = 300
    parts.pub.after_advance(lane)
    assert lane.pending == [PendingTap(300, 0, SnapshotKind.TAP, 90)]
    parts.pub._publish_finishing(lane)
    assert parts.cache.calls[-1] == (
        "publish", 300, 0, SnapshotKind.TAP, tuple(range(1256, 1300)), 90, True
    )  # fmt: skip
    assert lane.pending == []
    assert parts.freed == ([90] if duplicate else [])


@pytest.mark.parametrize(
    ("committed", "computed", "published"),
    [
        (2, 150, True),  # anchor blocks 0, 1 committed, the state is at the frontier
        (2, 170, True),  # a short reply ended inside the tail block
        (1, 150, False),  # anchor block 1 not committed
        (2, 149, False),  # the state never reached the frontier
    ],
)
def test_a_finishing_tap_publishes_only_with_its_anchor_blocks_and_frontier(
    committed, computed, published
):
    parts = PublisherParts()
    lane = prefilled_lane(300, [], 0)
    lane.committed_blocks, lane.computed = committed, computed
    tap = PendingTap(150, 2, SnapshotKind.BOUNDARY, 91)
    lane.pending = [tap]
    parts.pub._publish_finishing(lane)
    publishes = [c for c in parts.cache.calls if c[0] == "publish"]
    if published:
        tail = tuple(range(1128, 1150))
        assert publishes == [("publish", 150, 2, SnapshotKind.BOUNDARY, tail, 91, True)]
        assert lane.pending == []
    else:
        assert publishes == [] and lane.pending == [tap]


def test_every_tap_a_finishing_lane_cannot_publish_stays_pending_to_be_dropped():
    """Neither tap's frontier was reached: both stay pending, in order, and dropping them
    frees both snapshot slots and both tail pages."""
    parts = PublisherParts()
    lane = prefilled_lane(300, [], 0)
    lane.committed_blocks, lane.computed = 2, 140
    taps = [PendingTap(150, 0, SnapshotKind.TAP, 90), PendingTap(170, 1, SnapshotKind.TAP, 91)]
    lane.pending = list(taps)
    parts.pub._publish_finishing(lane)
    assert parts.cache.calls == [] and lane.pending == taps
    parts.pub._drop_pending(lane)
    assert parts.cache.calls == [("free_slot", 0), ("free_slot", 1)]
    assert parts.freed == [90, 91] and parts.counters.taps_dropped == 2


def test_an_in_pass_tap_whose_pass_never_ran_stays_pending():
    """A tap reserved at 640 inside the pass (512, 700): the lane ends before that pass runs."""
    parts = PublisherParts()
    lane = prefilled_lane(1000, [(640, False)], 512)
    assert parts.pub.before_chunk(lane, 512, 700, in_pass=True) == [(640, 10)]
    parts.pub._publish_finishing(lane)
    assert lane.pending == [PendingTap(640, 0, SnapshotKind.TAP, None)]
    parts.pub._drop_pending(lane)
    assert parts.cache.calls[-1] == ("free_slot", 0) and parts.freed == []


def test_duplicate_finishing_publications_free_only_real_tail_pages():
    """Two duplicates: the aligned tap at 256 has no tail page (nothing to free), the one at
    300 hands its tail page 93 back to the pool."""
    parts = PublisherParts()
    parts.cache.duplicates = {256, 300}
    lane = prefilled_lane(300, [], 0)
    lane.committed_blocks, lane.computed = 4, 300
    lane.pending = [
        PendingTap(256, 0, SnapshotKind.TAP, None),
        PendingTap(300, 1, SnapshotKind.TAP, 93),
    ]
    parts.pub._publish_finishing(lane)
    assert [c[1] for c in parts.cache.calls] == [256, 300]
    assert parts.freed == [93] and lane.pending == []
