"""Admission edges (ninfer/engine/kv/admitter.py) over stand-in parts: the PermanentlyInfeasible
verdict (a request whose page entitlement exceeds the whole pool fails at once with a message
naming its need and the pool's size in pages and tokens, with and without the prefix cache;
through `LLM` the options never allow such a pool), and the tap plan of an admitted lane (every
prompt hint handed to the planner with its kind, the fork tap a cached block prefix past the
resume frontier proves, the planner's taps mapped to exact / flexible and Boundary).

Also: an entitlement exactly equal to the pool's total or free pages is admitted; a new lane
records its admission time, and a resumed request's lane prefills all it knew while its
generation still starts at the request's own prompt end; a cached admission records the path
pages, a private copy of the source's partial tail, whether it resumed from an endpoint (also
told to the tap planner), a Host restore's ticket (for the first pass and for timing) and
reserves the entitlement its pages leave (never negative); a head that waits for a prefilling
sibling is counted once per request, and a resumed request never waits."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from coalesce_helpers import COST, keyed_job, sibling
from engine_helpers import greedy

from ninfer.cache.common import SnapshotKind
from ninfer.cache.records import QuoteParams, Readiness
from ninfer.cache.taps import HintKind, Placement, Tap, TapHint
from ninfer.engine.kv.admitter import Admitter
from ninfer.engine.kv.counters import EngineCounters
from ninfer.engine.kv.lane import KVLane
from ninfer.engine.request import PromptHints, Request


def _admitter(index, pool_pages: int, entitlement: int) -> Admitter:
    kv = SimpleNamespace(num_pages=pool_pages)
    budget = SimpleNamespace(quote=lambda job: QuoteParams(entitlement, pool_pages, pool_pages))
    states = SimpleNamespace(acquire=lambda: pytest.fail("an infeasible request took a slot"))
    return Admitter(
        index, kv, states, budget, None, None, itertools.count(1), pending_timeout_s=1.0
    )


@pytest.mark.parametrize("cached", [False, True])
def test_a_request_larger_than_the_pool_fails_naming_need_and_pool(cached):
    job = Request("r", list(range(10, 310)), greedy(500), PromptHints(), sink=None)
    index = None
    if cached:
        quote = SimpleNamespace(readiness=Readiness.PERMANENTLY_INFEASIBLE, need_pages=13)
        index = SimpleNamespace(quote=lambda blocks, params: quote)
    verdict = _admitter(index, pool_pages=6, entitlement=13).try_admit(job, [])
    assert verdict.lane is None
    assert verdict.error == (
        "kv_capacity: the request needs 13 KV pages (300 prompt tokens plus its output window) "
        "but the pool holds 6 pages (384 tokens); raise kv_capacity or shorten the request"
    )


def test_a_request_that_fits_the_pool_but_not_the_free_pages_waits():
    job = Request("r", list(range(10, 310)), greedy(500), PromptHints(), sink=None)
    admitter = _admitter(None, pool_pages=16, entitlement=13)
    admitter.budget = SimpleNamespace(quote=lambda job: QuoteParams(13, 12, 16))
    verdict = admitter.try_admit(job, [])
    assert verdict.lane is None and verdict.error is None


class _Planner:
    """Records the hints the Admitter hands the tap planner; answers with `taps`."""

    def __init__(self, taps):
        self.taps = taps
        self.asked = []

    def plan_taps(self, lane_id, n, hints, vision_spans=(), resumed_from_endpoint=None):
        self.asked.append((lane_id, n, list(hints), resumed_from_endpoint))
        return self.taps


def _lane_for_taps(hints: PromptHints, n: int, cached: int, cached_prefix: int, endpoint=False):
    job = Request("r", list(range(n)), greedy(4), hints, sink=None)
    lane = KVLane(job, 5, 0, n, cached)
    lane.cached_tokens, lane.cached_prefix_tokens = cached, cached_prefix
    lane.resumed_endpoint = endpoint
    return lane


def test_every_prompt_hint_reaches_the_planner_with_its_kind():
    hints = PromptHints(explicit=[100, 300], structural=[150], opener=390, message_starts=[20, 200])
    taps = [
        Tap(128, Placement.FLEXIBLE, 1, False, 128),
        Tap(150, Placement.EXACT, 2, True, 150),
        Tap(300, Placement.EXACT, 3, False, 300),
    ]
    planner = _Planner(taps)
    admitter = _admitter(planner, pool_pages=16, entitlement=8)
    lane = _lane_for_taps(hints, 400, 0, 0, endpoint=True)
    admitter._plan_taps(lane)
    assert planner.asked == [
        (
            5,
            400,
            [
                TapHint(100, HintKind.EXPLICIT),
                TapHint(300, HintKind.EXPLICIT),
                TapHint(150, HintKind.STRUCTURAL),
                TapHint(20, HintKind.MESSAGE),
                TapHint(200, HintKind.MESSAGE),
                TapHint(390, HintKind.OPENER),
            ],
            True,
        )
    ]
    assert lane.taps == [(128, False), (150, True), (300, True)]
    assert lane.boundary_taps == {150}


def test_no_opener_hint_without_an_opener():
    planner = _Planner([])
    lane = _lane_for_taps(PromptHints(opener=None), 400, 0, 0)
    _admitter(planner, 16, 8)._plan_taps(lane)
    assert planner.asked == [(5, 400, [], False)]
    assert lane.taps == [] and lane.boundary_taps == set()


@pytest.mark.parametrize(
    ("n", "cached", "cached_prefix", "fork"),
    [
        (400, 64, 128, 128),  # a whole block of cached history past the resume frontier
        (400, 64, 127, None),  # one token short of a block
        (400, 0, 64, 64),
        (400, 300, 399, 399),  # the fork may be the prompt's last token
        (400, 300, 400, None),  # the whole prompt is cached history: no fork inside it
        (400, 100, 100, None),
    ],
)
def test_a_fork_from_cached_history_plans_an_explicit_tap_there(n, cached, cached_prefix, fork):
    planner = _Planner([])
    lane = _lane_for_taps(PromptHints(explicit=[10]), n, cached, cached_prefix)
    _admitter(planner, 16, 8)._plan_taps(lane)
    want = [TapHint(10, HintKind.EXPLICIT)]
    if fork is not None:
        want.append(TapHint(fork, HintKind.EXPLICIT))
    assert planner.asked == [(5, n, want, False)]


# ---- admission boundaries and what a lane records (index None) -------------------------------


class _Budget:
    """Quotes `params`; records every reservation as (lane id, pages)."""

    def __init__(self, params: QuoteParams):
        self.params = params
        self.reserved: list[tuple[int, int]] = []

    def quote(self, job):
        return self.params

    def reserve(self, lane, pages):
        self.reserved.append((lane.lane_id, pages))


def _plain_admitter(params: QuoteParams) -> Admitter:
    states = SimpleNamespace(acquire=lambda: 4)
    return Admitter(
        None,
        SimpleNamespace(num_pages=params.total_pages),
        states,
        _Budget(params),
        None,
        None,
        itertools.count(1),
        pending_timeout_s=1.0,
    )


@pytest.mark.parametrize(("free", "total"), [(13, 13), (13, 16), (20, 13)])
def test_an_entitlement_equal_to_the_pool_or_the_free_pages_is_admitted(free, total):
    """Admission needs entitlement <= total pages (else infeasible) and <= free pages (else it
    waits): equality admits, reserving the whole entitlement; the lane prefills the prompt."""
    job = Request("r", list(range(10, 310)), greedy(500), PromptHints(), sink=None)
    admitter = _plain_admitter(QuoteParams(13, free, total))
    verdict = admitter.try_admit(job, [])
    lane = verdict.lane
    assert verdict.error is None and lane is not None
    assert admitter.budget.reserved == [(1, 13)]
    assert (lane.lane_id, lane.slot, lane.computed, lane.prompt_len) == (1, 4, 0, 300)
    assert lane.request is job and lane.tokens == job.prompt


def test_a_resumed_request_prefills_what_it_knew_and_generates_from_its_own_prompt_end():
    """A suspended request comes back with its 300 prompt + 40 generated tokens: the new
    lane's prompt is all 340, its generated tokens still start at 300 (§9.5): outputs, usage
    and max_tokens count from there."""
    prompt = list(range(10, 310))
    job = Request("r", prompt, greedy(100), PromptHints(), sink=None)
    job.tokens += range(500, 540)
    job.suspensions = 1
    lane = _plain_admitter(QuoteParams(8, 16, 16)).try_admit(job, []).lane
    assert lane.tokens is job.tokens
    assert (lane.prompt_len, job.gen_start, lane.computed) == (340, 300, 0)
    # the reply so far counts from the request's own prompt: the 40 tokens generated before
    assert job.generated == list(range(500, 540)) and job.tokens_left() == 60


# ---- cached admission (stand-in index) -------------------------------------------------------


class _Ticket:
    def __init__(self):
        self.preludes = 0

    def wait_prelude(self):
        self.preludes += 1


class _CachedIndex:
    """A READY quote at `frontier` whose staged path has node i on page 40 + i; `source` the
    snapshot resumed from (None: the root) of kind `kind`, its image in `source_slot`, its tail
    on page 77; `host`: a Host hit whose restore brings the tail to page 88."""

    def __init__(self, frontier, source=9, kind=SnapshotKind.TAP, source_slot=6, host=False):
        self.cost = COST
        self.frontier, self.source, self.kind = frontier, source, kind
        self.source_slot, self.host = source_slot, host
        self.calls: list[tuple] = []
        self.planned: list[tuple] = []

    def quote(self, blocks, params):
        return SimpleNamespace(
            readiness=Readiness.READY,
            frontier=self.frontier,
            need_pages=0,
            cached_prefix_tokens=self.frontier,
        )

    def stage(self, quote, lane_id, free_pages):
        self.calls.append(("stage", lane_id))
        return SimpleNamespace(
            evicted_pages=[30, 31],
            source_tail_page=77,
            hit_tier="host" if self.host else "device",
            restore_pages_needed=2,
            frontier=self.frontier,
            path=list(range(self.frontier // 64)),
            source=self.source,
            source_slot=self.source_slot,
        )

    def begin_restore(self, lane_id, pages):
        self.calls.append(("begin_restore", lane_id, list(pages)))
        return SimpleNamespace(bytes=4096, tail=SimpleNamespace(page=88))

    def node(self, node):
        return SimpleNamespace(device_page=40 + node)

    def snapshot(self, sid):
        assert sid == self.source
        return SimpleNamespace(kind=self.kind)

    def activate(self, lane_id):
        self.calls.append(("activate", lane_id))

    def plan_taps(self, lane_id, n, hints, vision_spans=(), resumed_from_endpoint=None):
        self.planned.append((lane_id, n, resumed_from_endpoint))
        return []


class _Restores:
    def __init__(self):
        self.tickets: list[tuple[int, _Ticket]] = []

    def restore(self, batch, slot):
        ticket = _Ticket()
        self.tickets.append((slot, ticket))
        return ticket


class _CachedParts:
    def __init__(self, index: _CachedIndex, entitlement: int, timeout_s: float = 60.0):
        self.freed: list[int] = []
        self.copies: list[tuple] = []
        self.resumes: list[tuple[int, int]] = []
        self.acquired = 0
        pages = itertools.count(60)

        def acquire():
            self.acquired += 1
            return 4

        kv = SimpleNamespace(
            num_pages=64,
            free=self.freed.extend,
            alloc=lambda n: [next(pages) for _ in range(n)],
            copy_prefix=lambda s, d, n: self.copies.append((s, d, n)),
        )
        states = SimpleNamespace(acquire=acquire, resume=lambda a, b: self.resumes.append((a, b)))
        self.budget = _Budget(QuoteParams(entitlement, 64, 64))
        self.transfer = _Restores()
        self.counters = EngineCounters()
        self.index = index
        self.admitter = Admitter(
            index,
            kv,
            states,
            self.budget,
            self.transfer,
            self.counters,
            itertools.count(1),
            timeout_s,
        )


def _job(n: int = 400) -> Request:
    return Request("r", list(range(n)), greedy(100), PromptHints(), sink=None)


@pytest.mark.parametrize("kind", [SnapshotKind.ENDPOINT, SnapshotKind.TAP, SnapshotKind.BOUNDARY])
def test_a_cached_admission_resumes_the_source_with_a_private_copy_of_its_tail(kind):
    """F_s = 150: blocks 0, 1 are the path's pages, the 22 tail tokens are copied from the
    source's tail page into a private page; the state comes from the source's image; the tap
    planner is told whether the lane resumed from an endpoint."""
    parts = _CachedParts(_CachedIndex(150, kind=kind), entitlement=8)
    job = _job()
    lane = parts.admitter.try_admit(job, []).lane
    assert parts.freed == [30, 31]  # pages the staging evicted
    assert lane.pages == [40, 41, 60] and lane.private == [False, False, True]
    assert parts.copies == [(77, 60, 22)]
    assert parts.resumes == [(6, 4)]  # source image into the lane's slot
    assert (lane.computed, lane.cached_tokens, lane.last_snapshot) == (150, 150, 150)
    assert lane.committed_blocks == 2
    endpoint = kind == SnapshotKind.ENDPOINT
    assert lane.resumed_endpoint is endpoint
    assert parts.index.planned == [(1, 400, endpoint)]
    assert parts.budget.reserved == [(1, 5)]  # entitlement 8 less the 3 pages it holds
    assert parts.index.calls == [("stage", 1), ("activate", 1)]
    assert lane.restore_ticket is None and job.usage.restore_timing is None
    assert (job.usage.cached_tokens, job.usage.cached_prefix_tokens) == (150, 150)


def test_a_host_hit_restores_without_waiting_and_keeps_the_ticket_for_timing():
    """Host-only parts are restored into 2 fresh pages; the lane's first pass waits on the
    ticket, which the request also keeps for metrics; only the tail's prelude is waited for,
    as the tail copy reads the restored page 88."""
    parts = _CachedParts(_CachedIndex(150, host=True), entitlement=8)
    job = _job()
    lane = parts.admitter.try_admit(job, []).lane
    assert parts.index.calls[1] == ("begin_restore", 1, [60, 61])
    [(slot, ticket)] = parts.transfer.tickets
    assert slot == 4 and ticket.preludes == 1
    assert lane.restore_ticket is ticket and job.usage.restore_timing is ticket
    assert job.usage.restored_host_bytes == 4096
    assert parts.copies == [(88, 62, 22)] and lane.pages == [40, 41, 62]


@pytest.mark.parametrize(("entitlement", "reserved"), [(3, 0), (2, 0), (4, 1)])
def test_a_cached_admission_reserves_what_its_entitlement_leaves_beyond_its_pages(
    entitlement, reserved
):
    """The lane holds 3 pages at F_s = 150 (two path pages and the tail copy): it reserves the
    rest of its entitlement, never less than nothing."""
    parts = _CachedParts(_CachedIndex(150), entitlement=entitlement)
    lane = parts.admitter.try_admit(_job(), []).lane
    assert len(lane.pages) == 3 and parts.budget.reserved == [(1, reserved)]


def test_a_head_waiting_for_a_prefilling_sibling_is_counted_once_per_request():
    """Two heads share five blocks with a sibling that is prefilling them (§12.2): each waits
    without taking a slot, and each request is counted once however often it waits."""
    sib = sibling([1, 2, 3, 4, 5, -2], 130, 400)
    parts = _CachedParts(_CachedIndex(128), entitlement=8)
    first = keyed_job("a", [1, 2, 3, 4, 5, -1], 400)
    for _ in range(2):
        verdict = parts.admitter.try_admit(first, [sib])
        assert verdict.lane is None and verdict.error is None
    assert first.coalesced and parts.counters.coalesced_waits == 1
    second = keyed_job("b", [1, 2, 3, 4, 5, -3], 400)
    assert parts.admitter.try_admit(second, [sib]).lane is None
    assert parts.counters.coalesced_waits == 2
    assert parts.acquired == 0 and parts.index.calls == []


def test_a_resumed_request_never_waits_for_a_sibling():
    sib = sibling([1, 2, 3, 4, 5, -2], 130, 400)
    parts = _CachedParts(_CachedIndex(128), entitlement=8)
    job = keyed_job("a", [1, 2, 3, 4, 5, -1], 400)
    job.tokens += [7] * 20
    job.suspensions = 1
    lane = parts.admitter.try_admit(job, [sib]).lane
    assert lane is not None and lane.prompt_len == 420 and lane.computed == 128
    assert not job.coalesced and parts.counters.coalesced_waits == 0


def test_a_resumed_admission_keeps_its_own_frontier_and_adds_to_the_requests_usage():
    """A suspended request's usage reports its first admission's cached figures and the Host
    bytes of every admission; the KV decisions of each admission read its own frontier."""
    job = _job()
    first = _CachedParts(_CachedIndex(256, host=True), entitlement=8)
    assert first.admitter.try_admit(job, []).lane.cached_tokens == 256
    job.suspensions = 1
    again = _CachedParts(_CachedIndex(64, host=True), entitlement=8)
    lane = again.admitter.try_admit(job, []).lane
    assert (lane.cached_tokens, lane.cached_prefix_tokens, lane.last_snapshot) == (64, 64, 64)
    assert (job.usage.cached_tokens, job.usage.cached_prefix_tokens) == (256, 256)
    assert job.usage.restored_host_bytes == 2 * 4096
    assert job.usage.restore_timing is lane.restore_ticket  # the latest restore's
