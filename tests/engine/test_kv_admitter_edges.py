"""Admission edges (ninfer/engine/kv/admitter.py) over stand-in parts: the PermanentlyInfeasible
verdict (a request whose page entitlement exceeds the whole pool fails at once with a message
naming its need and the pool's size in pages and tokens, with and without the prefix cache;
through `LLM` the options never allow such a pool), and the tap plan of an admitted lane (every
prompt hint handed to the planner with its kind, the fork tap a cached block prefix past the
resume frontier proves, the planner's taps mapped to exact / flexible and Boundary)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from engine_helpers import greedy

from ninfer.cache.records import QuoteParams, Readiness
from ninfer.cache.taps import HintKind, Placement, Tap, TapHint
from ninfer.engine.kv.admitter import Admitter
from ninfer.engine.lane import Job, Lane, PromptHints


def _admitter(index, pool_pages: int, entitlement: int) -> Admitter:
    kv = SimpleNamespace(num_pages=pool_pages)
    budget = SimpleNamespace(quote=lambda job: QuoteParams(entitlement, pool_pages, pool_pages))
    states = SimpleNamespace(acquire=lambda: pytest.fail("an infeasible request took a slot"))
    return Admitter(
        index, kv, states, budget, None, None, itertools.count(1), pending_timeout_s=1.0
    )


@pytest.mark.parametrize("cached", [False, True])
def test_a_request_larger_than_the_pool_fails_naming_need_and_pool(cached):
    job = Job("r", list(range(10, 310)), greedy(500), PromptHints(), sink=None)
    index = None
    if cached:
        quote = SimpleNamespace(readiness=Readiness.PERMANENTLY_INFEASIBLE, need_pages=13)
        index = SimpleNamespace(quote=lambda blocks, params: quote)
    verdict = _admitter(index, pool_pages=6, entitlement=13).try_admit(job, 0.0, [])
    assert verdict.lane is None
    assert verdict.error == (
        "kv_capacity: the request needs 13 KV pages (300 prompt tokens plus its output window) "
        "but the pool holds 6 pages (384 tokens); raise kv_capacity or shorten the request"
    )


def test_a_request_that_fits_the_pool_but_not_the_free_pages_waits():
    job = Job("r", list(range(10, 310)), greedy(500), PromptHints(), sink=None)
    admitter = _admitter(None, pool_pages=16, entitlement=13)
    admitter.budget = SimpleNamespace(quote=lambda job: QuoteParams(13, 12, 16))
    verdict = admitter.try_admit(job, 0.0, [])
    assert verdict.lane is None and verdict.error is None


class _Planner:
    """Records the hints the Admitter hands the tap planner; answers with `taps`."""

    def __init__(self, taps):
        self.taps = taps
        self.asked = []

    def plan_taps(self, lane_id, n, hints, resumed_from_endpoint):
        self.asked.append((lane_id, n, list(hints), resumed_from_endpoint))
        return self.taps


def _lane_for_taps(hints: PromptHints, n: int, cached: int, cached_prefix: int, endpoint=False):
    job = Job("r", list(range(n)), greedy(4), hints, sink=None)
    lane = Lane(job, 5, 0, list(job.prompt), n, cached)
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
