"""The stats gauges are running counts the stores keep, read without scanning the cache.

`PrefixIndex.stats()` must not look at any node or snapshot (a `/metrics` scrape runs it on the
engine thread), `check_invariants()` must catch a count that drifted from the records, and after
every step of random request / eviction / transfer / abort / load sequences the gauges must
equal `invariants.recount_gauges` (the O(tree) recount).
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from cache_helpers import Driver, make_index, tokens
from hypothesis import HealthCheck, given, settings

from ninfer.cache import (
    PrefixIndex,
    QuoteParams,
    Readiness,
    SnapshotKind,
    prepare_prompt,
)
from ninfer.cache.invariants import recount_gauges
from ninfer.cache.stats import GAUGES

SEGMENTS = [tokens(s + 1, n) for s, n in enumerate((64, 100, 70, 130))]
PROMPTS = [
    SEGMENTS[0] + SEGMENTS[1],
    SEGMENTS[0] + SEGMENTS[1] + SEGMENTS[2],
    SEGMENTS[0] + SEGMENTS[3],
    SEGMENTS[2] + SEGMENTS[3],
]
BIG = 10**6  # free pages: the Driver-like world below never runs out of Device pages


def assert_gauges_match(ix: PrefixIndex) -> None:
    have, want = ix.stats(), recount_gauges(ix)
    assert {g: getattr(have, g) for g in GAUGES} == {g: getattr(want, g) for g in GAUGES}


def busy_index() -> PrefixIndex:
    """Every count nonzero: Device and Host nodes, Host-only nodes after eviction, snapshots
    with and without tails, Device images, Host copies, a superseded snapshot, and the
    Device-only blocks of open lane 4."""
    ix = make_index(host_slabs=64, slots=4)
    d = Driver(ix)
    d.run(1, PROMPTS[1], taps=[128, 136], endpoint=234)
    d.run(2, PROMPTS[2], taps=[136])
    ix.evict_device_pages(3)
    d.run(3, PROMPTS[3], endpoint=200)
    d.admit(4, tokens(9, 128))
    d.commit(4, 128)
    ix.check_invariants()
    s = ix.stats()
    assert all(getattr(s, g) > 0 for g in GAUGES), {g: getattr(s, g) for g in GAUGES}
    assert s.nodes_host < s.nodes and s.nodes_device < s.nodes
    return ix


# ---- stats() reads counts, not records ---------------------------------------------------------


class NoScan(dict):
    """A records dict whose contents may not be read (len and lookups by key still work)."""

    def _scan(self, *_):
        raise AssertionError("stats() read the records")

    __iter__ = values = items = keys = _scan


@pytest.mark.parametrize("host_slabs", [64, 0], ids=["host", "device-only"])
def test_stats_reads_no_node_or_snapshot(host_slabs):
    ix = busy_index() if host_slabs else make_index(host_slabs=0)
    if not host_slabs:
        Driver(ix).run(1, PROMPTS[1], taps=[128], endpoint=234)
    want = recount_gauges(ix)
    tree, snaps = ix.blocks.tree, ix.snapshots
    nodes, by_id = tree.nodes, snaps.by_id
    tree.nodes, snaps.by_id = NoScan(nodes), NoScan(by_id)
    try:
        have = ix.stats()
    finally:
        tree.nodes, snaps.by_id = nodes, by_id
    assert {g: getattr(have, g) for g in GAUGES} == {g: getattr(want, g) for g in GAUGES}


# ---- a drifted count is caught ------------------------------------------------------------------


def blocks(ix: PrefixIndex):
    return ix.blocks


def snapshots(ix: PrefixIndex):
    return ix.snapshots


def slots(ix: PrefixIndex):
    return ix.snapshots.slots


# (the count's owner, its attribute, the message check_invariants names)
COUNTS = [
    (blocks, "device_copies", "stats gauge nodes_device: kept"),
    (blocks, "host_copies", "stats gauge nodes_host: kept"),
    (snapshots, "tail_pages", "stats gauge snapshot_tails_device: kept"),
    (snapshots, "host_copies", "stats gauge snapshots_host: kept"),
    (snapshots, "host_slabs", "stats gauge host_snapshot_bytes: kept"),
    (slots, "snapshot_count", "snapshot slot count"),
]


@pytest.mark.parametrize("delta", [1, -1])
@pytest.mark.parametrize(
    ("owner", "attr", "message"), COUNTS, ids=[f"{c[0].__name__}.{c[1]}" for c in COUNTS]
)
def test_a_drifted_count_fails_the_invariant_check(owner, attr, message, delta):
    ix = busy_index()
    obj = owner(ix)
    setattr(obj, attr, getattr(obj, attr) + delta)
    with pytest.raises(AssertionError, match=message):
        ix.check_invariants()


# ---- random operations: stats() equals the recount after every step ----------------------------


class World:
    """Plays the engine over one index: page ids are never reused, transfers land, wait or
    are aborted as the operations say."""

    def __init__(self, host_slabs: int, slots: int) -> None:
        self.ix = make_index(host_slabs=host_slabs, slots=slots)
        self.next_page = 0
        self.next_lane = 0
        self.pending: list[int] = []
        self.open: dict[int, list[int]] = {}  # lane -> its prompt

    def page(self) -> int:
        self.next_page += 1
        return self.next_page

    def finish(self, batch_id: int, land: bool) -> None:
        if land:
            self.land(batch_id)
        else:
            self.pending.append(batch_id)

    def land(self, batch_id: int) -> None:
        if self.ix.batches[batch_id].kind == "restore":
            self.ix.on_restore_landed(batch_id)
        else:
            self.ix.on_write_through_landed(batch_id)

    def abort(self, batch_id: int) -> None:
        if self.ix.batches[batch_id].kind == "restore":
            self.ix.abort_restore(batch_id)
        else:
            self.ix.abort_write_through(batch_id)

    # ---- operations ----------------------------------------------------------------------

    def request(self, p: int, tap: int, end: int, land: bool, abort: bool, keep: bool) -> None:
        ix, toks = self.ix, PROMPTS[p]
        if keep and len(self.open) >= 2:
            return
        self.settle_prefetch(abort)
        self.next_lane += 1
        lane = self.next_lane
        q = ix.quote(prepare_prompt(toks), QuoteParams(-(-len(toks) // 64) + 1, BIG, BIG))
        if q.readiness != Readiness.READY:
            return
        staged = ix.stage(q, lane, BIG)
        rb = ix.begin_restore(lane, [self.page() for _ in range(staged.restore_pages_needed)])
        if rb is not None and abort:
            ix.abort_restore(rb.batch_id)  # a Host fault before the lane started: cancelled
            return
        ix.activate(lane)
        if rb is not None:
            ix.on_restore_landed(rb.batch_id)
        for b in range(len(ix.lane_path(lane)), len(toks) // 64):
            ix.commit_block(lane, b, toks[64 * b : 64 * b + 64], self.page())
        latest = staged.frontier
        committed = len(ix.lane_path(lane))
        for f, kind in (
            (64 * tap, SnapshotKind.TAP),
            (64 * committed + end, SnapshotKind.ENDPOINT),
        ):
            if f <= latest or f > min(len(toks), 64 * committed + 63) or tap > committed:
                continue
            grant = ix.allocate_snapshot_slot(lane, f, kind)
            if grant is None:
                continue
            tail = toks[f - f % 64 : f]
            res = ix.publish_snapshot(
                lane, f, grant.slot, kind, tail, self.page() if tail else None
            )
            if res.write is not None:
                self.finish(res.write.batch_id, land)
            latest = f
        if keep:
            self.open[lane] = toks
        else:
            self.release(lane, land)

    def release(self, lane: int, land: bool) -> None:
        self.open.pop(lane, None)
        res = self.ix.release(lane)
        if res.write is not None:
            self.finish(res.write.batch_id, land)

    def release_open(self, land: bool) -> None:
        if self.open:
            self.release(min(self.open), land)

    def evict(self, n: int) -> None:
        self.ix.evict_device_pages(n)

    def settle(self, i: int, abort: bool) -> None:
        if self.pending:
            bid = self.pending.pop(i % len(self.pending))
            self.abort(bid) if abort else self.land(bid)

    def settle_prefetch(self, abort: bool) -> None:
        """As the engine's admission does (`engine/kv/prefetcher.py`): a prefetch batch in
        flight lands, or fails and is aborted, before the next quote; a lane is never staged
        over blocks a prefetch is still filling."""
        for bid in [b for b in self.pending if self.ix.batches[b].kind == "restore"]:
            self.pending.remove(bid)
            self.abort(bid) if abort else self.land(bid)

    def prefetch(self, p: int, land: bool) -> None:
        toks = PROMPTS[p]
        q = self.ix.quote(prepare_prompt(toks), QuoteParams(-(-len(toks) // 64) + 1, BIG, BIG))
        plan = self.ix.plan_prefetch(q, BIG)
        rb = self.ix.begin_prefetch(plan.nodes, [self.page() for _ in plan.nodes])
        if rb is not None:
            self.finish(rb.batch_id, land)

    def load(self, p: int, blocks: int, tail: int, superseded: bool) -> None:
        """A cache file's Host-only entries: `blocks` of prompt p, a snapshot `tail` past them."""
        ix, toks = self.ix, PROMPTS[p]
        blocks = min(blocks, len(toks) // 64)
        parent = 0
        try:
            for b in range(blocks):
                parent = ix.load_block(parent, toks[64 * b : 64 * b + 64])
            if blocks:
                ix.load_snapshot(
                    parent, toks[64 * blocks : 64 * blocks + tail], superseded=superseded
                )
        except ValueError:  # no free slab, no Host tier, or the snapshot exists
            pass


REQUEST = st.tuples(
    st.just("request"),
    st.integers(0, len(PROMPTS) - 1),
    st.integers(1, 3),
    st.integers(0, 63),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
OPS = st.one_of(
    REQUEST,
    REQUEST,
    st.tuples(st.just("release_open"), st.booleans()),
    st.tuples(st.just("evict"), st.integers(1, 8)),
    st.tuples(st.just("settle"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("prefetch"), st.integers(0, len(PROMPTS) - 1), st.booleans()),
    st.tuples(
        st.just("load"),
        st.integers(0, len(PROMPTS) - 1),
        st.integers(1, 3),
        st.integers(0, 63),
        st.booleans(),
    ),
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    host_slabs=st.sampled_from([0, 8, 40]),
    slots=st.integers(0, 3),
    ops=st.lists(OPS, min_size=8, max_size=24),
)
def test_stats_equal_the_recount_after_every_operation(host_slabs, slots, ops):
    w = World(host_slabs, slots)
    assert_gauges_match(w.ix)
    for name, *args in ops:
        getattr(w, name)(*args)
        assert_gauges_match(w.ix)
        w.ix.check_invariants()
