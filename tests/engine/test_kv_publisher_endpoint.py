"""The Publisher's terminal settlement (ninfer/engine/kv/publisher.py, `release`, spec §7.7,
§9.5). A finishing lane publishes what is pending from its own last page, then its endpoint
snapshot at its frontier: the lane's state slot becomes the snapshot's image (the snapshot's
old physical slot goes back), its partial last page is the snapshot's tail, which the index
keeps unless it already held that snapshot (then the page stays the lane's and is freed with
its private pages). The endpoint follows §7.7's 64-token rule (the index's
`endpoint_worthwhile`), except for a suspended lane, which publishes any frontier past its
deepest snapshot; a cancelled lane with nothing computed past what it resumed from publishes
none; a failed lane publishes nothing, its pending taps are dropped. A Host restore still in
flight is waited for before the slot and pages go back. Stand-in index, pools, budget and
transfer record every call in one log, in order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from engine_helpers import greedy

from ninfer.cache.common import SnapshotKind
from ninfer.cache.records import PublishResult, ReleaseResult, SlotGrant
from ninfer.engine.kv.counters import EngineCounters
from ninfer.engine.kv.lane import KVLane, PendingTap
from ninfer.engine.kv.publisher import Publisher
from ninfer.engine.request import PromptHints, Request

LANE_ID = 7
LANE_SLOT = 3  # the lane's physical state slot
SNAP_PHYS = [10, 11, 12, 13]  # physical state slot of each logical snapshot slot
ENDPOINT = SnapshotKind.ENDPOINT


class _Index:
    """Stand-in prefix index of lane 7: grants snapshot slots 0, 1, ... (the grant's displaced
    snapshots leave tail page 40), publishes (page 41 freed by Host eviction) unless the
    frontier is in `duplicates`, and releases the lane's path (page 70 freed, a write-through
    batch "blocks")."""

    def __init__(self, log: list, worthwhile: bool, duplicates=(), free_slots=(0, 1, 2)):
        self.log = log
        self.worthwhile = worthwhile
        self.duplicates = set(duplicates)
        self._slots = iter(free_slots)

    def endpoint_worthwhile(self, lane, f):
        assert lane == LANE_ID
        self.log.append(("worthwhile", f))
        return self.worthwhile

    def allocate_snapshot_slot(self, lane, f, kind):
        assert lane == LANE_ID
        slot = next(self._slots, None)
        self.log.append(("allocate", f, kind, slot))
        return None if slot is None else SlotGrant(slot, None, False, [40])

    def free_snapshot_slot(self, lane, slot):
        assert lane == LANE_ID
        self.log.append(("free_slot", slot))

    def publish_snapshot(self, lane, f, slot, kind, tail_tokens, tail_page, finishing):
        assert lane == LANE_ID
        self.log.append(("publish", f, slot, kind, tuple(tail_tokens), tail_page, finishing))
        if f in self.duplicates:  # the slot is freed by the index, the tail page stays ours
            return PublishResult(5, True, None, [])
        return PublishResult(5, False, f"write@{f}", [41])

    def release(self, lane):
        assert lane == LANE_ID
        self.log.append(("release",))
        return ReleaseResult("blocks", [], [70])


class _Parts:
    def __init__(self, index_kwargs: dict | None):
        self.log: list[tuple] = []
        log = self.log
        self.index = None if index_kwargs is None else _Index(log, **index_kwargs)
        self.snap_phys = list(SNAP_PHYS)

        def free(pages):
            if pages:
                log.append(("free", list(pages)))

        def adopt_endpoint(lane_phys, snap):  # StatePool.adopt_endpoint: a swap, no copy
            old, self.snap_phys[snap] = self.snap_phys[snap], lane_phys
            return old

        kv = SimpleNamespace(free=free)
        states = SimpleNamespace(
            snap_phys=self.snap_phys,
            adopt_endpoint=adopt_endpoint,
            release=lambda slot: log.append(("release_slot", slot)),
        )
        budget = SimpleNamespace(unreserve=lambda lane: log.append(("unreserve", lane.lane_id)))
        transfer = SimpleNamespace(
            write_snapshot=lambda w, phys: log.append(("write_snapshot", w, phys)),
            write_blocks=lambda w: log.append(("write_blocks", w)),
        )
        self.counters = EngineCounters()
        self.pub = Publisher(self.index, kv, states, budget, transfer, self.counters)


def _lane(
    computed: int,
    pages: int,
    committed: int,
    reason: str = "stop",
    prompt_len: int = 140,
    cached: int = 0,
) -> KVLane:
    """A lane whose tokens are 0, 1, ... (the last sampled one not computed), pages 50, 51, ...
    of which the first `committed` blocks are the index's and the rest the lane's own."""
    job = Request("r", list(range(prompt_len)), greedy(64), PromptHints(), sink=None)
    job.tokens = list(range(computed + 1))
    lane = KVLane(job, LANE_ID, LANE_SLOT, prompt_len, computed)
    lane.pages = [50 + i for i in range(pages)]
    lane.private = [i >= committed for i in range(pages)]
    lane.committed_blocks = committed
    lane.cached_tokens = cached
    job.finish_reason = reason
    return lane


def _endpoint_calls(f: int, slot: int, tail: int | None, taken: bool) -> list[tuple]:
    """The calls of an endpoint published at frontier f (lane state slot 3) into `slot`."""
    r = f % 64
    calls = [
        ("allocate", f, ENDPOINT, slot),
        ("free", [40]),
        ("publish", f, slot, ENDPOINT, tuple(range(f - r, f)), tail, False),
    ]
    if taken:  # the new snapshot is written through from the lane's own image, slot 3
        calls += [("free", [41]), ("write_snapshot", f"write@{f}", LANE_SLOT)]
    return calls


def _settled(freed: list[int], slot: int) -> list[tuple]:
    """What follows the endpoint: the path's release, the lane's own pages, its slot."""
    calls = [("release",), ("free", [70]), ("write_blocks", "blocks")]
    if freed:
        calls.append(("free", freed))
    return calls + [("unreserve", LANE_ID), ("release_slot", slot)]


# ---- a finishing lane's endpoint ---------------------------------------------------------


@pytest.mark.parametrize("duplicate", [False, True])
def test_a_finishing_lane_publishes_its_endpoint_with_its_partial_last_page_as_tail(duplicate):
    """Frontier 150: blocks 0-1 are committed, page 52 holds tokens 128..149 and becomes the
    endpoint's tail; page 53 is a growth page of the lane. The lane's slot 3 becomes snapshot
    slot 0's image and the lane leaves with the snapshot's old slot 10, which is released. A
    new snapshot keeps page 52 (the index's now); a duplicate leaves it with the lane, which
    frees it with its other private page."""
    parts = _Parts(dict(worthwhile=True, duplicates={150} if duplicate else ()))
    lane = _lane(150, pages=4, committed=2)
    parts.pub.release(lane)
    assert parts.log == [
        ("worthwhile", 150),
        *_endpoint_calls(150, 0, tail=52, taken=not duplicate),
        *_settled([52, 53] if duplicate else [53], slot=10),
    ]
    assert parts.snap_phys == [LANE_SLOT, 11, 12, 13]
    assert lane.last_snapshot == 150  # the lane's deepest snapshot is now its endpoint
    assert lane.pages == [] and lane.private == []


@pytest.mark.parametrize("duplicate", [False, True])
def test_an_endpoint_at_a_page_boundary_has_no_tail_and_the_lane_frees_its_next_page(duplicate):
    parts = _Parts(dict(worthwhile=True, duplicates={128} if duplicate else ()))
    lane = _lane(128, pages=3, committed=2)  # page 52 is for token 128, never computed
    parts.pub.release(lane)
    assert parts.log == [
        ("worthwhile", 128),
        *_endpoint_calls(128, 0, tail=None, taken=not duplicate),
        *_settled([52], slot=10),
    ]
    assert lane.last_snapshot == 128


def test_a_finishing_lane_without_the_64_token_gain_publishes_no_endpoint():
    """§7.7: the index says the frontier is not 64 tokens past the deepest snapshot on the
    path; the lane's partial last page stays private and is freed, its slot released."""
    parts = _Parts(dict(worthwhile=False))
    lane = _lane(150, pages=3, committed=2)
    lane.last_snapshot = 100
    parts.pub.release(lane)
    assert parts.log == [("worthwhile", 150), *_settled([52], slot=LANE_SLOT)]
    assert parts.snap_phys == SNAP_PHYS and lane.last_snapshot == 100


def test_an_endpoint_without_a_free_snapshot_slot_is_skipped():
    parts = _Parts(dict(worthwhile=True, free_slots=()))
    lane = _lane(150, pages=3, committed=2)
    parts.pub.release(lane)
    assert parts.log == [
        ("worthwhile", 150),
        ("allocate", 150, ENDPOINT, None),
        *_settled([52], slot=LANE_SLOT),
    ]
    assert lane.last_snapshot == 0


# ---- a suspended lane (§9.5) ----------------------------------------------------------------


@pytest.mark.parametrize(("last", "published"), [(100, True), (149, True), (150, False)])
def test_a_suspended_lane_publishes_its_endpoint_at_any_frontier_past_its_last_snapshot(
    last, published
):
    """The lane resumes from its endpoint, so the snapshot is published even 1 token past its
    deepest one (the index's 64-token rule says no here); at that frontier itself, not."""
    parts = _Parts(dict(worthwhile=False))
    lane = _lane(150, pages=3, committed=2)
    lane.last_snapshot = last
    parts.pub.release(lane, suspend=True)
    if published:  # the index's rule is not asked
        assert parts.log == [
            *_endpoint_calls(150, 0, tail=52, taken=True),
            *_settled([], slot=10),
        ]
    else:
        assert parts.log == [("worthwhile", 150), *_settled([52], slot=LANE_SLOT)]
    assert lane.last_snapshot == 150  # the suspended lane records its endpoint


def test_a_suspended_lane_still_publishes_when_the_index_finds_it_worthwhile():
    parts = _Parts(dict(worthwhile=True))
    lane = _lane(150, pages=3, committed=2)
    lane.last_snapshot = 150  # not past its deepest snapshot, but the index says worth it
    parts.pub.release(lane, suspend=True)
    assert parts.log == [
        ("worthwhile", 150),
        *_endpoint_calls(150, 0, tail=52, taken=True),
        *_settled([], slot=10),
    ]


# ---- a cancelled lane --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cached", "published"),
    [(150, False), (151, False), (149, True), (64, True)],
)
def test_a_cancelled_lane_publishes_an_endpoint_only_past_its_resume_frontier(cached, published):
    """A lane cancelled before computing anything past the frontier it resumed from (its
    cached tokens) has nothing new to publish, even where the index would take it."""
    parts = _Parts(dict(worthwhile=True))
    lane = _lane(150, pages=3, committed=2, reason="abort", cached=cached)
    parts.pub.release(lane)
    if published:
        assert parts.log == [
            ("worthwhile", 150),
            *_endpoint_calls(150, 0, tail=52, taken=True),
            *_settled([], slot=10),
        ]
        assert lane.last_snapshot == 150
    else:
        assert parts.log == [("worthwhile", 150), *_settled([52], slot=LANE_SLOT)]
        assert lane.last_snapshot == 0


@pytest.mark.parametrize("reason", ["stop", "length"])
def test_a_lane_that_ended_normally_publishes_its_endpoint_at_its_resume_frontier(reason):
    """Only a cancelled lane is exempt: one that finished is published by §7.7's rule alone."""
    parts = _Parts(dict(worthwhile=True))
    lane = _lane(150, pages=3, committed=2, reason=reason, cached=150)
    parts.pub.release(lane)
    assert [c for c in parts.log if c[0] == "publish"] == [
        ("publish", 150, 0, ENDPOINT, tuple(range(128, 150)), 52, False)
    ]


# ---- a failed lane; pending taps from the last page ---------------------------------------


def _with_pending_tail_tap(reason: str) -> KVLane:
    """Tokens 0..160 computed, blocks 0-1 committed; a tap at 150 (snapshot slot 1, its tail
    copied to page 90) waits for block 2, which the finished reply never filled."""
    lane = _lane(160, pages=3, committed=2, reason=reason)
    lane.pending = [PendingTap(150, 1, SnapshotKind.TAP, 90)]
    lane.last_snapshot = 150
    return lane


def test_a_finishing_lane_publishes_a_pending_tap_from_its_last_page_then_its_endpoint():
    parts = _Parts(dict(worthwhile=True))
    lane = _with_pending_tail_tap("stop")
    parts.pub.release(lane)
    assert parts.log == [
        ("publish", 150, 1, SnapshotKind.TAP, tuple(range(128, 150)), 90, True),
        ("free", [41]),
        ("write_snapshot", "write@150", 11),
        ("worthwhile", 160),
        *_endpoint_calls(160, 0, tail=52, taken=True),
        *_settled([], slot=10),
    ]
    assert parts.counters.taps_dropped == 0 and lane.pending == []


def test_a_failed_lane_drops_its_pending_taps_and_publishes_no_endpoint():
    """Its state may be half-written: the tap's slot and tail page go back, counted; no
    endpoint is asked for; its partial last page is freed with its slot."""
    parts = _Parts(dict(worthwhile=True))
    lane = _with_pending_tail_tap("error")
    parts.pub.release(lane)
    assert parts.log == [
        ("free_slot", 1),
        ("free", [90]),
        *_settled([52], slot=LANE_SLOT),
    ]
    assert parts.counters.taps_dropped == 1 and lane.pending == []
    assert parts.snap_phys == SNAP_PHYS and lane.last_snapshot == 150


# ---- a Host restore in flight ---------------------------------------------------------------


@pytest.mark.parametrize("cache", [True, False])
def test_a_lane_released_before_its_first_pass_waits_for_its_restore_first(cache):
    """Its slot and pages may still be restore destinations (§6.5): the restore is waited for
    before anything goes back, and the lane holds no ticket afterwards."""
    parts = _Parts(dict(worthwhile=False) if cache else None)
    lane = _lane(128, pages=3, committed=2 if cache else 0, reason="abort", cached=128)
    lane.restore_ticket = SimpleNamespace(wait_all=lambda: parts.log.append(("wait_all",)))
    parts.pub.release(lane)
    if cache:
        assert parts.log == [("wait_all",), ("worthwhile", 128), *_settled([52], LANE_SLOT)]
    else:  # no prefix cache: every page is the lane's
        assert parts.log == [
            ("wait_all",),
            ("free", [50, 51, 52]),
            ("unreserve", LANE_ID),
            ("release_slot", LANE_SLOT),
        ]
    assert lane.restore_ticket is None
