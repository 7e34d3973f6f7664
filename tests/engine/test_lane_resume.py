"""A suspended request's resumed admission (spec §9.5): the client sees one request (its usage
reports the first admission's cached figures, `Request.usage`), while the KV decisions of the
new admission read the new lane's own resume frontier (`KVLane.cached_tokens`). Taking the
first admission's frontier for them made a resumed lane that restarted lower (its endpoint
evicted meanwhile) skip the flexible taps of its final chunk and the endpoint of a
cancellation, though it had computed that state afresh."""

from __future__ import annotations

from publisher_helpers import PublisherParts, prefilled_lane

from ninfer.cache.common import SnapshotKind
from ninfer.engine.kv.lane import PendingTap
from ninfer.engine.outputs import final_output


def _resumed_lane(n: int, taps, computed: int, cached: int, first: tuple[int, int]):
    """A lane of this admission (resumed at `cached`) of a request suspended once, whose first
    admission had `first` = (cached_tokens, cached_prefix_tokens)."""
    lane = prefilled_lane(n, taps, computed)
    lane.cached_tokens = lane.cached_prefix_tokens = lane.last_snapshot = cached
    req = lane.request
    req.usage.cached_tokens, req.usage.cached_prefix_tokens = first
    req.suspensions = 1
    return lane


def test_usage_reports_the_first_admissions_cached_figures():
    lane = _resumed_lane(300, [], 64, cached=64, first=(256, 280))
    usage = final_output(lane.request, 0.0).usage
    assert (usage.cached_tokens, usage.cached_prefix_tokens) == (256, 280)
    assert (lane.cached_tokens, lane.cached_prefix_tokens) == (64, 64)


def test_a_lane_resumed_below_its_first_frontier_takes_the_final_chunks_flexible_tap():
    parts = PublisherParts()
    lane = _resumed_lane(300, [(280, False)], 192, cached=64, first=(256, 256))
    parts.pub.before_chunk(lane, 192, 300)
    assert parts.cache.calls == [("allocate", 192, SnapshotKind.TAP, 0)]
    assert lane.pending == [PendingTap(192, 0, SnapshotKind.TAP, None)]
