"""Step planning on plain lanes (no model, no cache): chunk ends, exact-tap splits, budgets."""

from __future__ import annotations

import queue

from ninfer.engine.lane import Job, Lane, PromptHints
from ninfer.engine.scheduler import chunk_end, may_admit, plan_step
from ninfer.request import SamplingParams


def _lane(n: int, computed: int, taps=(), generated: int = 0) -> Lane:
    job = Job("r", list(range(n)), SamplingParams(), PromptHints(), queue.Queue())
    tokens = list(range(n + generated))
    return Lane(job, 1, 0, tokens, n, computed, taps=list(taps))


def test_chunk_end_aligns_after_a_non_aligned_resume():
    lane = _lane(1000, 279)
    assert chunk_end(lane, 256) == 512  # 279 + 256 = 535, floored to a page boundary
    lane.computed = 512
    assert chunk_end(lane, 256) == 768
    lane.computed = 960
    assert chunk_end(lane, 256) == 1000  # the final chunk ends at n
    assert chunk_end(_lane(1000, 10), 40) == 50  # nothing to floor to above the frontier


def test_exact_taps_split_flexible_do_not():
    lane = _lane(1000, 0, taps=[(100, False), (130, True), (700, True)])
    assert chunk_end(lane, 256) == 130
    lane.computed = 130
    assert chunk_end(lane, 256) == 384
    lane.computed = 640
    assert chunk_end(lane, 256) == 700


def test_plan_step_decode_rows_first_and_a_shared_prefill_budget():
    decoding = _lane(10, 10, generated=1)
    a, b = _lane(300, 0), _lane(300, 0)
    rows = plan_step([a, decoding, b], 256)
    assert [(r.lane, r.start, r.end) for r in rows] == [(decoding, 10, 11), (a, 0, 256)]
    assert rows[0].samples and not rows[1].samples  # b waits: a took the whole budget
    rows = plan_step([a, b], 400)
    assert [(r.lane, r.start, r.end) for r in rows] == [(a, 0, 300), (b, 0, 64)]
    assert rows[0].samples and not rows[1].samples


def test_may_admit_respects_concurrency_and_prefill_policy():
    prefilling, decoding = _lane(300, 64), _lane(10, 10, generated=1)
    assert not may_admit([prefilling], 4, concurrent_prefill=False)
    assert may_admit([prefilling], 4, concurrent_prefill=True)
    assert may_admit([decoding], 4, concurrent_prefill=False)
    assert not may_admit([decoding] * 4, 4, concurrent_prefill=True)
