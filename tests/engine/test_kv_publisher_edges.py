"""The Publisher (ninfer/engine/kv/publisher.py). A flexible tap realized inside the prompt's
final pass (`before_chunk` with `tap_at`): only a page boundary strictly inside the chunk's
(start, n) range is accepted; the Publisher reserves a Tap snapshot slot for it, records the
pending tap and the lane's new deepest snapshot, and returns the slot's physical index (the
index, pools and budget are stand-ins recording what the Publisher asks of them). Block commit
through the engine: usage.cache_creation_tokens counts exactly the prompt blocks a request
inserted."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from engine_helpers import greedy, rand_tokens

from ninfer.cache.common import SnapshotKind
from ninfer.cache.records import SlotGrant
from ninfer.engine.kv.publisher import Publisher
from ninfer.engine.lane import Job, Lane, PendingTap, PromptHints

SNAP_PHYS = [10, 11, 12, 13]  # physical state slot of each logical snapshot slot


class _Index:
    def __init__(self, grant: SlotGrant | None):
        self.grant = grant
        self.asked: list[tuple[int, int, int]] = []

    def allocate_snapshot_slot(self, lane: int, f: int, kind: int):
        self.asked.append((lane, f, kind))
        return self.grant


def _publisher(grant: SlotGrant | None):
    index = _Index(grant)
    freed: list[int] = []
    kv = SimpleNamespace(free=freed.extend)
    states = SimpleNamespace(snap_phys=SNAP_PHYS)
    return Publisher(index, kv, states, None, None, None), index, freed


def _lane(n: int, taps: list[tuple[int, bool]], computed: int) -> Lane:
    job = Job("r", list(range(n)), greedy(4), PromptHints(), sink=None)
    lane = Lane(job, 7, 0, list(job.prompt), n, computed)
    lane.taps = list(taps)
    return lane


def test_in_pass_tap_reserves_a_tap_slot_and_records_the_pending_tap():
    pub, index, freed = _publisher(SlotGrant(2, None, False, [40, 41]))
    lane = _lane(700, [(300, True), (650, False)], 512)
    lane.last_snapshot = 512
    assert pub.before_chunk(lane, 512, 700, tap_at=640) == 12
    assert index.asked == [(7, 640, SnapshotKind.TAP)]
    assert freed == [40, 41]  # tails of snapshots the slot's displacement deleted
    assert lane.pending == [PendingTap(640, 2, SnapshotKind.TAP, None)]
    assert lane.last_snapshot == 640
    assert lane.taps == [(300, True)]
    # the same frontier again is no deeper snapshot: nothing is reserved
    lane.taps = [(660, False)]
    assert pub.before_chunk(lane, 512, 700, tap_at=640) is None
    assert index.asked == [(7, 640, SnapshotKind.TAP)] and len(lane.pending) == 1


@pytest.mark.parametrize("last", [640, 641, 700])
def test_in_pass_tap_at_or_behind_the_deepest_snapshot_is_skipped(last):
    pub, index, _ = _publisher(SlotGrant(2, None, False, []))
    lane = _lane(700, [(650, False)], 512)
    lane.last_snapshot = last
    assert pub.before_chunk(lane, 512, 700, tap_at=640) is None
    assert index.asked == [] and lane.pending == [] and lane.last_snapshot == last
    assert lane.taps == []  # the flexible tap is consumed all the same


def test_in_pass_tap_just_past_the_deepest_snapshot_is_reserved():
    pub, index, _ = _publisher(SlotGrant(0, None, False, []))
    lane = _lane(700, [(650, False)], 512)
    lane.last_snapshot = 639
    assert pub.before_chunk(lane, 512, 700, tap_at=640) == 10
    assert lane.pending == [PendingTap(640, 0, SnapshotKind.TAP, None)]
    assert lane.last_snapshot == 640


def test_in_pass_tap_without_a_free_slot_is_skipped():
    pub, index, freed = _publisher(None)
    lane = _lane(700, [(650, False)], 512)
    assert pub.before_chunk(lane, 512, 700, tap_at=640) is None
    assert index.asked == [(7, 640, SnapshotKind.TAP)]
    assert lane.pending == [] and lane.last_snapshot == 0 and freed == []


@pytest.mark.parametrize(
    ("n", "start", "tap_at"),
    [
        (700, 512, 512),  # the chunk's start: not inside
        (700, 512, 448),  # before the chunk
        (700, 512, 600),  # inside, but not a page boundary
        (700, 512, 768),  # past the prompt
        (704, 512, 704),  # the prompt's end, a page boundary
        (704, 576, 500),  # neither inside nor a page boundary
    ],
)
def test_in_pass_tap_outside_the_chunk_or_off_a_page_boundary_is_an_error(n, start, tap_at):
    pub, index, _ = _publisher(SlotGrant(1, None, False, []))
    lane = _lane(n, [(n - 10, False)], start)
    with pytest.raises(ValueError) as err:
        pub.before_chunk(lane, start, n, tap_at=tap_at)
    assert str(err.value) == f"in-pass tap at {tap_at}: not a page boundary inside ({start}, n)"
    assert index.asked == [] and lane.pending == [] and lane.last_snapshot == 0


@pytest.mark.parametrize(("n", "created"), [(128, 128), (127, 64), (191, 128), (192, 192)])
def test_cache_creation_counts_the_prompt_blocks_a_request_inserts(make_llm, n, created):
    """usage.cache_creation_tokens: the full prompt blocks the request inserted; blocks filled
    by its reply (here 70 tokens, so the block after the prompt fills) are not counted, nor are
    blocks another request inserted before."""
    llm = make_llm()
    prompt = rand_tokens(random.Random(n), n)
    first = llm.generate([prompt], greedy(70))[0].usage
    assert (first.cached_tokens, first.cache_creation_tokens) == (0, created)
    assert llm.generate([prompt], greedy(70))[0].usage.cache_creation_tokens == 0
