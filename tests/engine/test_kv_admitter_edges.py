"""Admission's PermanentlyInfeasible verdict (ninfer/engine/kv/admitter.py): a request whose
page entitlement exceeds the whole pool fails at once with a message naming its need and the
pool's size in pages and tokens, with and without the prefix cache. (Through `LLM` the options
never allow such a pool, so the Admitter is built over stand-in parts.)"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from engine_helpers import greedy

from ninfer.cache.records import QuoteParams, Readiness
from ninfer.engine.kv.admitter import Admitter
from ninfer.engine.lane import Job, PromptHints


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
