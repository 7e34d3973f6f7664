"""The Publisher (ninfer/engine/kv/publisher.py). Flexible taps realized inside a pass
(`before_chunk` with `in_pass`): each one strictly inside the chunk, a page boundary (else an
error), gets a Tap snapshot slot reserved, a pending tap and the lane's new deepest snapshot,
and its (position, physical slot) is returned; taps at or outside the chunk's ends and exact
taps are left planned. Taps
realized after a pass (`after_advance`): captured at the chunk's end with a tail copy of the
partial block, skipped and counted without a page for it, Boundary kind for boundary taps,
published in order once their blocks commit (a duplicate's tail page freed by the engine); a
flexible tap is not captured at the prompt's end; a failed lane's pending taps are dropped and
counted. These use stand-in index, pools and budget that record what the Publisher asks of
them. Block commit through the engine: usage.cache_creation_tokens counts exactly the prompt
blocks a request inserted."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from engine_helpers import greedy, rand_tokens

from ninfer.cache.common import SnapshotKind
from ninfer.cache.records import CommitKind, SlotGrant
from ninfer.engine.kv.counters import EngineCounters
from ninfer.engine.kv.lane import KVLane, PendingTap
from ninfer.engine.kv.publisher import Publisher
from ninfer.engine.request import PromptHints, Request

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


def _lane(n: int, taps: list[tuple[int, bool]], computed: int) -> KVLane:
    job = Request("r", list(range(n)), greedy(4), PromptHints(), sink=None)
    lane = KVLane(job, 7, 0, n, computed)
    lane.taps = list(taps)
    return lane


def test_in_pass_tap_reserves_a_tap_slot_and_records_the_pending_tap():
    pub, index, freed = _publisher(SlotGrant(2, None, False, [40, 41]))
    lane = _lane(1000, [(300, True), (640, False)], 512)
    lane.last_snapshot = 512
    assert pub.before_chunk(lane, 512, 700, in_pass=True) == [(640, 12)]
    assert index.asked == [(7, 640, SnapshotKind.TAP)]
    assert freed == [40, 41]  # tails of snapshots the slot's displacement deleted
    assert lane.pending == [PendingTap(640, 2, SnapshotKind.TAP, None)]
    assert lane.last_snapshot == 640
    assert lane.taps == [(300, True)]
    # the same frontier again is no deeper snapshot: nothing is reserved
    lane.taps = [(640, False)]
    assert pub.before_chunk(lane, 512, 700, in_pass=True) == []
    assert index.asked == [(7, 640, SnapshotKind.TAP)] and len(lane.pending) == 1


def test_every_in_pass_tap_of_a_chunk_is_reserved_in_order():
    """Rungs inside one long pass: one snapshot each, at its own position, deepest last; an
    exact tap inside it too (the scheduler cut the chunk at any the pass could not take)."""
    pub, index, _ = _publisher(SlotGrant(1, None, False, []))
    taps = [(1024, False), (576, False), (640, True), (2048, False), (3008, False)]
    lane = _lane(3000 + 64, taps, 512)
    got = pub.before_chunk(lane, 512, 3008, in_pass=True)
    assert got == [(576, 11), (640, 11), (1024, 11), (2048, 11)]
    assert [a[1] for a in index.asked] == [576, 640, 1024, 2048]
    assert [t.frontier for t in lane.pending] == [576, 640, 1024, 2048]
    assert lane.last_snapshot == 2048
    assert lane.taps == [(3008, False)]  # at the chunk's end


@pytest.mark.parametrize("last", [640, 641, 700])
def test_in_pass_tap_at_or_behind_the_deepest_snapshot_is_skipped(last):
    pub, index, _ = _publisher(SlotGrant(2, None, False, []))
    lane = _lane(700, [(640, False)], 512)
    lane.last_snapshot = last
    assert pub.before_chunk(lane, 512, 700, in_pass=True) == []
    assert index.asked == [] and lane.pending == [] and lane.last_snapshot == last
    assert lane.taps == []  # the flexible tap is consumed all the same


def test_in_pass_tap_just_past_the_deepest_snapshot_is_reserved():
    pub, index, _ = _publisher(SlotGrant(0, None, False, []))
    lane = _lane(1000, [(640, False)], 512)
    lane.last_snapshot = 639
    assert pub.before_chunk(lane, 512, 700, in_pass=True) == [(640, 10)]
    assert lane.pending == [PendingTap(640, 0, SnapshotKind.TAP, None)]
    assert lane.last_snapshot == 640


def test_in_pass_tap_without_a_free_slot_is_skipped():
    pub, index, freed = _publisher(None)
    lane = _lane(1000, [(640, False)], 512)
    assert pub.before_chunk(lane, 512, 700, in_pass=True) == []
    assert index.asked == [(7, 640, SnapshotKind.TAP)]
    assert lane.pending == [] and lane.last_snapshot == 0 and freed == []


def test_in_pass_taps_in_the_prompts_last_page_go_to_the_tail_position():
    """The prompt tail (n - 64 < p < n) is taken at the scheduler's `tail_at`, not at p (a
    snapshot within a page of the end would leave a short reply's endpoint unpublished)."""
    pub, index, _ = _publisher(SlotGrant(1, None, False, []))
    lane = _lane(3000, [(1024, False), (2944, False)], 0)
    assert pub.before_chunk(lane, 0, 3000, in_pass=True, tail_at=960) == [(960, 11), (1024, 11)]
    assert [a[1] for a in index.asked] == [960, 1024] and lane.taps == []


@pytest.mark.parametrize(("tap", "end"), [(512, 700), (448, 700), (768, 700), (640, 640)])
def test_taps_at_or_outside_the_chunks_ends_are_left_planned(tap, end):
    pub, index, _ = _publisher(SlotGrant(1, None, False, []))
    lane = _lane(1000, [(tap, False)], 512)
    assert pub.before_chunk(lane, 512, end, in_pass=True) == []
    assert index.asked == [] and lane.pending == [] and lane.taps == [(tap, False)]


def test_in_pass_tap_off_a_page_boundary_is_an_error():
    pub, index, _ = _publisher(SlotGrant(1, None, False, []))
    lane = _lane(1000, [(600, False)], 512)
    with pytest.raises(ValueError) as err:
        pub.before_chunk(lane, 512, 700, in_pass=True)
    assert str(err.value) == "in-pass tap at 600: not a page boundary inside (512, n)"
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


# ---- taps realized after a pass, publication and dropping (stand-in parts) ----------------


class _Cache:
    """Stand-in index of one lane (id 7): every block is newly inserted, every publication
    new; records calls."""

    def __init__(self):
        self.calls: list[tuple] = []
        self._slots = iter(range(4))
        self.duplicates: set[int] = set()  # frontiers the cache holds already

    def __getattribute__(self, name):
        attr = object.__getattribute__(self, name)
        if name in ("calls", "_slots", "duplicates"):
            return attr

        def checked(lane, *args, **kwargs):
            assert lane == 7, f"{name}: unknown lane {lane!r}"
            return attr(lane, *args, **kwargs)

        return checked

    def commit_block(self, lane, b, data, page, extra=0):
        self.calls.append(("commit", b, page))
        return SimpleNamespace(kind=CommitKind.INSERTED)

    def allocate_snapshot_slot(self, lane, f, kind):
        slot = next(self._slots)
        self.calls.append(("allocate", f, kind, slot))
        return SlotGrant(slot, None, False, [])

    def has_snapshot(self, lane, f, tail_tokens):
        self.calls.append(("has", f, tuple(tail_tokens)))
        return f in self.duplicates

    def free_snapshot_slot(self, lane, slot):
        self.calls.append(("free_slot", slot))

    def publish_snapshot(self, lane, f, slot, kind, tail_tokens, tail_page, finishing):
        self.calls.append(("publish", f, slot, kind, tuple(tail_tokens), tail_page, finishing))
        return SimpleNamespace(freed_pages=[], write=None, duplicate=f in self.duplicates)


class _Parts:
    def __init__(self, headroom: int):
        self.cache = _Cache()
        self.freed: list[int] = []
        self.copies: list[tuple[int, int, int]] = []
        self.taps: list[tuple[int, int]] = []
        kv = SimpleNamespace(
            free=self.freed.extend, copy_prefix=lambda s, d, n: self.copies.append((s, d, n))
        )
        states = SimpleNamespace(snap_phys=SNAP_PHYS, tap=lambda a, b: self.taps.append((a, b)))
        self.taken: list[int] = []  # pages asked of the budget, per call

        def take(n):
            self.taken.append(n)
            return [90 + i for i in range(n)]

        budget = SimpleNamespace(headroom=lambda: headroom, take=take)
        self.counters = EngineCounters()
        self.pub = Publisher(self.cache, kv, states, budget, None, self.counters)


def _prefilling(n: int, taps, pages: int = 6) -> KVLane:
    lane = _lane(n, taps, 0)
    lane.pages = [50 + i for i in range(pages)]
    lane.private = [True] * pages
    lane.slot = 3
    return lane


def test_a_tap_inside_a_chunk_is_captured_at_its_end_with_a_tail_and_published_later():
    parts = _Parts(headroom=1)
    lane = _prefilling(300, [(100, False), (250, False)])
    lane.boundary_taps = {250}
    lane.computed = 150
    parts.pub.after_advance(lane)
    assert parts.cache.calls == [
        ("commit", 0, 50),
        ("commit", 1, 51),
        ("allocate", 150, SnapshotKind.TAP, 0),
    ]
    assert parts.taken == [1] and parts.copies == [(52, 90, 22)]  # block 2's 22 tokens
    assert parts.taps == [(3, 0)]  # the lane's state into snapshot slot 0
    assert lane.pending == [PendingTap(150, 0, SnapshotKind.TAP, 90)]
    assert lane.last_snapshot == 150 and lane.taps == [(250, False)]
    lane.computed = 191  # block 2 (holding the tail) is not full yet: nothing to publish
    parts.cache.calls.clear()
    parts.pub.after_advance(lane)
    assert parts.cache.calls == [] and len(lane.pending) == 1
    lane.computed = 192  # block 2 commits: the tap publishes with its 22 tail tokens
    parts.pub.after_advance(lane)
    assert parts.cache.calls == [
        ("commit", 2, 52),
        ("publish", 150, 0, SnapshotKind.TAP, tuple(range(128, 150)), 90, False),
    ]
    assert lane.pending == []
    lane.computed = 256  # the Boundary tap is due at a block boundary: no tail
    parts.cache.calls.clear()
    parts.pub.after_advance(lane)
    assert parts.cache.calls == [
        ("commit", 3, 53),
        ("allocate", 256, SnapshotKind.BOUNDARY, 1),
        ("publish", 256, 1, SnapshotKind.BOUNDARY, (), None, False),
    ]
    assert lane.pending == [] and lane.committed_blocks == 4 and lane.taps == []


@pytest.mark.parametrize("headroom", [0, -1])
def test_a_tail_tap_without_a_free_page_is_skipped_and_counted(headroom):
    parts = _Parts(headroom=headroom)
    lane = _prefilling(300, [(100, False), (180, False)])
    lane.computed = 150
    parts.pub.after_advance(lane)
    assert parts.cache.calls[-2:] == [("allocate", 150, SnapshotKind.TAP, 0), ("free_slot", 0)]
    assert parts.counters.taps_skipped_no_page == 1
    assert lane.pending == [] and lane.last_snapshot == 0 and parts.copies == []
    lane.computed = 200  # the next tap finds no page either: counted again
    parts.pub.after_advance(lane)
    assert parts.cache.calls[-2:] == [("allocate", 200, SnapshotKind.TAP, 1), ("free_slot", 1)]
    assert parts.counters.taps_skipped_no_page == 2


@pytest.mark.parametrize("taps", [[(280, False)], [(300, False)], [(290, True)]])
def test_at_the_prompt_end_a_prompt_end_is_captured_a_flexible_tap_is_not(taps):
    """At the prompt's end a flexible tap due there is not captured (a flexible one in the final
    chunk is taken before or inside it: `before_chunk`); the PROMPT_END snapshot is, with its
    tail copied, and published at once: its anchor blocks are committed and its tail tokens are
    the prompt's, so it waits for no block."""
    parts = _Parts(headroom=1)
    lane = _prefilling(300, taps)
    lane.computed = 300
    parts.pub.after_advance(lane)
    tail = tuple(range(256, 300))
    assert parts.cache.calls[4:] == [
        ("has", 300, tail),
        ("allocate", 300, SnapshotKind.PROMPT_END, 0),
        ("publish", 300, 0, SnapshotKind.PROMPT_END, tail, 90, False),
    ]
    assert [c[0] for c in parts.cache.calls[:4]] == ["commit"] * 4
    assert parts.copies == [(54, 90, 44)] and parts.taps == [(3, 0)]
    assert lane.taps == [] and lane.pending == [] and lane.last_snapshot == 300


def test_an_exact_tap_at_the_prompt_end_takes_the_place_of_the_prompt_end():
    parts = _Parts(headroom=1)
    lane = _prefilling(300, [(300, True)])
    lane.computed = 300
    parts.pub.after_advance(lane)
    assert parts.cache.calls[-1] == ("allocate", 300, SnapshotKind.TAP, 0)
    assert lane.pending == [PendingTap(300, 0, SnapshotKind.TAP, 90)]


def test_no_prompt_end_where_the_cache_holds_one_or_past_a_chat_opener():
    """A retry finds its prompt end in the cache: nothing is staged. A chat's prompt end within
    a block past its generation opener is not taken: a client that drops the reply diverges at
    the opener, which is tapped."""
    parts = _Parts(headroom=1)
    parts.cache.duplicates.add(300)
    lane = _prefilling(300, [])
    lane.computed = 300
    parts.pub.after_advance(lane)
    assert parts.cache.calls[-1][0] == "has" and parts.copies == []
    for opener, taken in ((290, False), (237, False), (236, True)):
        parts = _Parts(headroom=1)
        lane = _prefilling(300, [])
        lane.request.hints.opener = opener
        lane.computed = 300
        parts.pub.after_advance(lane)
        assert (lane.last_snapshot == 300) == taken, opener


def test_a_failed_lane_drops_its_pending_taps_counting_them():
    parts = _Parts(headroom=5)
    lane = _prefilling(300, [(100, False), (140, True)])
    lane.computed = 140
    parts.pub.after_advance(lane)
    assert lane.pending == [PendingTap(140, 0, SnapshotKind.TAP, 90)]
    parts.pub._drop_pending(lane)
    assert parts.cache.calls[-1] == ("free_slot", 0)
    assert parts.freed == [90] and lane.pending == []
    assert parts.counters.taps_dropped == 1
    lane = _prefilling(300, [(70, True)])  # the next failed lane adds to the count
    lane.computed = 70
    parts.pub.after_advance(lane)
    parts.pub._drop_pending(lane)
    assert parts.cache.calls[-1] == ("free_slot", 1)
    assert parts.freed == [90, 90] and parts.counters.taps_dropped == 2


@pytest.mark.parametrize(("last", "captured"), [(149, True), (150, False), (200, False)])
def test_a_tap_at_or_behind_the_deepest_snapshot_is_not_captured_again(last, captured):
    parts = _Parts(headroom=1)
    lane = _prefilling(300, [(100, False)])
    lane.last_snapshot = last
    lane.computed = 150
    parts.pub.after_advance(lane)
    allocated = [c for c in parts.cache.calls if c[0] == "allocate"]
    assert allocated == ([("allocate", 150, SnapshotKind.TAP, 0)] if captured else [])
    assert lane.last_snapshot == (150 if captured else last) and lane.taps == []


@pytest.mark.parametrize("duplicate", [False, True])
def test_pending_taps_publish_in_order_and_a_duplicates_tail_page_is_freed(duplicate):
    """Two tail taps wait for the same block; once it commits both publish. A duplicate
    publication leaves its tail page with the engine, which frees it; a new one keeps it."""
    parts = _Parts(headroom=5)
    if duplicate:
        parts.cache.duplicates = {150, 170, 192}
    lane = _prefilling(300, [(150, True), (170, True), (192, True)])
    for computed in (150, 170):
        lane.computed = computed
        parts.pub.after_advance(lane)
    assert lane.pending == [
        PendingTap(150, 0, SnapshotKind.TAP, 90),
        PendingTap(170, 1, SnapshotKind.TAP, 90),
    ]
    lane.computed = 192
    parts.pub.after_advance(lane)
    published = [c[1] for c in parts.cache.calls if c[0] == "publish"]
    assert published == [150, 170, 192] and lane.pending == []
    assert parts.freed == ([90, 90] if duplicate else [])
