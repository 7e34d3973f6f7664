"""A suspended request's resumed admission (`Lane.carry`, spec §9.5): the client sees one request
(its usage reports the first admission's cached figures), while the KV decisions of the new
admission read the new admission's own resume frontier. Carrying the first admission's frontier
into them made a resumed lane that restarted lower (its endpoint evicted meanwhile) skip the
flexible taps of its final chunk and the endpoint of a cancellation, though it had computed
that state afresh."""

from __future__ import annotations

from engine_helpers import greedy
from publisher_helpers import PublisherParts, prefilled_lane

from ninfer.cache.common import SnapshotKind
from ninfer.engine.lane import Lane, PendingTap, PromptHints, Request
from ninfer.engine.outputs import final_output


def _suspended(cached: int, prefix: int) -> Lane:
    job = Request("r", list(range(1000, 1300)), greedy(4), PromptHints(), sink=None)
    old = Lane(job, 1, 0, list(job.prompt), 300, 300)
    old.cached_tokens, old.cached_prefix_tokens = cached, prefix
    return old


def test_carry_keeps_the_new_resume_frontier_and_reports_the_first_admissions_usage():
    new = prefilled_lane(300, [], 64)
    new.cached_tokens, new.cached_prefix_tokens = 64, 64
    new.carry(_suspended(cached=256, prefix=280))
    assert (new.cached_tokens, new.cached_prefix_tokens) == (64, 64)
    again = prefilled_lane(300, [], 0)
    again.carry(new)  # suspended twice: still the first admission's figures
    usage = final_output(again, 0.0).usage
    assert (usage.cached_tokens, usage.cached_prefix_tokens) == (256, 280)


def test_a_lane_resumed_below_its_first_frontier_takes_the_final_chunks_flexible_tap():
    parts = PublisherParts()
    lane = prefilled_lane(300, [(280, False)], 192)
    lane.cached_tokens = lane.last_snapshot = 64  # this admission resumed at 64
    lane.carry(_suspended(cached=256, prefix=256))  # the first one had 256 cached
    parts.pub.before_chunk(lane, 192, 300)
    assert parts.cache.calls == [("allocate", 192, SnapshotKind.TAP, 0)]
    assert lane.pending == [PendingTap(192, 0, SnapshotKind.TAP, None)]
