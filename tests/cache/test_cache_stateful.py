"""Hypothesis stateful tests: random admit / commit / tap / endpoint / release / cancel / land /
evict sequences against a model memory layer; check_invariants() and exact page accounting
after every step, with and without a Host tier (Device-only eviction deletes subtrees)."""

from __future__ import annotations

import hypothesis.strategies as st
from cache_helpers import make_index
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ninfer.cache import QuoteParams, Readiness, SnapshotKind, StaleQuoteError, prepare_prompt

SEGMENTS = [[s * 1000 + i for i in range(n)] for s, n in enumerate((64, 100, 70, 130, 64))]
PROMPTS = [
    SEGMENTS[0] + SEGMENTS[1],
    SEGMENTS[0] + SEGMENTS[1] + SEGMENTS[2],
    SEGMENTS[0] + SEGMENTS[3],
    SEGMENTS[0] + SEGMENTS[1] + SEGMENTS[3] + SEGMENTS[4],
    SEGMENTS[2] + SEGMENTS[4],
]
POOL = 40


class CacheMachine(RuleBasedStateMachine):
    host_slabs = 7

    @initialize(slots=st.integers(0, 3))
    def setup(self, slots):
        self.ix = make_index(host_slabs=self.host_slabs, slots=slots)
        self.free = set(range(POOL))
        self.lanes: dict[int, dict] = {}
        self.pending: list[int] = []
        self.last_l = 0.0

    # ---- the memory layer's part -----------------------------------------------------------

    def _give_back(self, pages):
        for p in pages:
            assert p not in self.free, f"page {p} freed twice"
            self.free.add(p)

    def _take(self) -> int | None:
        if not self.free:
            self._give_back(self.ix.evict_device_pages(1))
        return self.free.pop() if self.free else None

    def _transfer(self, batch_id: int, land: bool) -> None:
        if land:
            self._land(batch_id)
        else:
            self.pending.append(batch_id)

    def _land(self, batch_id: int) -> None:
        if self.ix.batches[batch_id].kind == "restore":
            self.ix.on_restore_landed(batch_id)
        else:
            self.ix.on_write_through_landed(batch_id)

    # ---- rules -----------------------------------------------------------------------------

    @precondition(lambda self: len(self.lanes) < 3)
    @rule(p=st.integers(0, len(PROMPTS) - 1), land=st.booleans(), cancel=st.booleans())
    def admit(self, p, land, cancel):
        toks = PROMPTS[p]
        lane = max(self.lanes, default=0) + 1
        ent = -(-len(toks) // 64) + 1
        q = self.ix.quote(prepare_prompt(toks), QuoteParams(ent, len(self.free), POOL))
        if q.readiness != Readiness.READY:
            assert q.readiness == Readiness.TEMPORARILY_BLOCKED  # ent <= POOL always
            return
        staged = self.ix.stage(q, lane, len(self.free))
        self._give_back(staged.evicted_pages)
        k = staged.restore_pages_needed
        assert k <= len(self.free), "stage left too few pages for its own restore"
        pages = [self.free.pop() for _ in range(k)]
        rb = self.ix.begin_restore(lane, pages)
        if cancel:
            if rb is not None:
                self._land(rb.batch_id)
            self._give_back(self.ix.cancel_stage(lane))
            return
        self.ix.activate(lane)
        if rb is not None:
            self._transfer(rb.batch_id, land)
        self.lanes[lane] = {"toks": toks, "private": [], "latest": staged.frontier}

    @precondition(lambda self: self.lanes)
    @rule(data=st.data())
    def commit(self, data):
        self.commit_lane(data.draw(st.sampled_from(sorted(self.lanes))))

    def commit_lane(self, lane):
        rec, path = self.lanes[lane], self.ix.lane_path(lane)
        b = len(path)
        if 64 * (b + 1) > len(rec["toks"]):
            return
        page = self._take()
        if page is None:
            return
        res = self.ix.commit_block(lane, b, rec["toks"][64 * b : 64 * b + 64], page)
        if res.kind.name == "DUPLICATE":
            rec["private"].append(page)

    @precondition(lambda self: self.lanes)
    @rule(data=st.data(), offset=st.integers(0, 63), kind=st.sampled_from(list(SnapshotKind)))
    def snapshot(self, data, offset, kind):
        lane = data.draw(st.sampled_from(sorted(self.lanes)))
        path = self.ix.lane_path(lane)
        if kind == SnapshotKind.ENDPOINT:
            f = 64 * len(path) + offset
        else:
            f = 64 * (len(path) - 1) + offset if offset else 64 * len(path)
        self.publish(lane, f, kind, data.draw(st.booleans()))

    def publish(self, lane, f, kind, land):
        rec, path = self.lanes[lane], self.ix.lane_path(lane)
        committed = 64 * len(path)
        if kind == SnapshotKind.ENDPOINT:
            if not committed <= f < committed + 64:
                return  # an endpoint's tail is the partial page after the committed blocks
        elif f > committed or (f % 64 and f > committed - 64 + 63):
            return
        if f <= rec["latest"] or f <= 0 or f > len(rec["toks"]):
            return
        tail_page = self._take() if f % 64 else None
        if f % 64 and tail_page is None:
            return
        grant = self.ix.allocate_snapshot_slot(lane, f, kind)
        if grant is None:
            if tail_page is not None:
                self.free.add(tail_page)
            return
        self._give_back(grant.freed_pages)
        tail = rec["toks"][f - f % 64 : f]
        res = self.ix.publish_snapshot(lane, f, grant.slot, kind, tail, tail_page)
        self._give_back(res.freed_pages)
        if res.duplicate and tail_page is not None:
            self.free.add(tail_page)
        if res.write is not None:
            self._transfer(res.write.batch_id, land)
        rec["latest"] = f

    @precondition(lambda self: self.lanes)
    @rule(data=st.data(), land=st.booleans())
    def release(self, data, land):
        self.release_lane(data.draw(st.sampled_from(sorted(self.lanes))), land)

    def release_lane(self, lane, land):
        rec = self.lanes.pop(lane)
        res = self.ix.release(lane)
        self._give_back(rec["private"])
        self._give_back(res.freed_pages)
        if res.write is not None:
            self._transfer(res.write.batch_id, land)

    @precondition(lambda self: len(self.lanes) < 3)
    @rule(
        p=st.integers(0, len(PROMPTS) - 1),
        tap=st.integers(1, 5),
        end=st.integers(0, 63),
        land=st.booleans(),
    )
    def whole_request(self, p, tap, end, land):
        """A full request in one step: admit, prefill, a tap, an endpoint, release."""
        self.admit(p, land, False)
        lane = max(self.lanes, default=None)
        if lane is None or self.lanes[lane]["toks"] is not PROMPTS[p]:
            return
        for _ in range(6):
            self.commit_lane(lane)
        self.publish(lane, 64 * tap, SnapshotKind.TAP, land)
        n = len(PROMPTS[p])
        self.publish(lane, n - end, SnapshotKind.ENDPOINT, land)
        self.release_lane(lane, land)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def land(self, data):
        i = data.draw(st.integers(0, len(self.pending) - 1))
        self._land(self.pending.pop(i))

    @rule(p=st.integers(0, len(PROMPTS) - 1), land=st.booleans())
    def prefetch(self, p, land):
        toks = PROMPTS[p]
        ent = -(-len(toks) // 64) + 1
        q = self.ix.quote(prepare_prompt(toks), QuoteParams(ent, len(self.free), POOL))
        plan = self.ix.plan_prefetch(q, len(self.free))
        self._give_back(plan.evicted_pages)
        assert len(plan.nodes) <= len(self.free), "prefetch planned beyond its room"
        pages = [self.free.pop() for _ in plan.nodes]
        rb = self.ix.begin_prefetch(plan.nodes, pages)
        if rb is not None:
            self._transfer(rb.batch_id, land)

    @rule(n=st.integers(0, 6))
    def evict(self, n):
        self._give_back(self.ix.evict_device_pages(n))

    @rule(p=st.integers(0, len(PROMPTS) - 1))
    def stale_quote(self, p):
        q = self.ix.quote(prepare_prompt(PROMPTS[p]), QuoteParams(3, len(self.free), POOL))
        self.ix.evict_device_pages(0)
        try:
            self.ix.stage(q, 99, len(self.free))
        except StaleQuoteError:
            return
        raise AssertionError("a quote survived a mutation")

    # ---- invariants ------------------------------------------------------------------------

    @invariant()
    def consistent(self):
        ix = self.ix
        ix.check_invariants()
        owned = [n.device_page for n in ix.blocks.tree.nodes.values() if n.device_page >= 0]
        owned += [s.tail_page for s in ix.snapshots.by_id.values() if s.tail_page >= 0]
        private = [p for rec in self.lanes.values() for p in rec["private"]]
        everything = owned + private + list(self.free)
        assert sorted(everything) == list(range(POOL)), "a page leaked or has two owners"
        assert self.last_l <= ix.host_tier.L, "L decreased"
        self.last_l = ix.host_tier.L


class DeviceOnlyMachine(CacheMachine):
    host_slabs = 0


_settings = settings(
    max_examples=50,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = _settings
TestDeviceOnlyMachine = DeviceOnlyMachine.TestCase
TestDeviceOnlyMachine.settings = _settings
