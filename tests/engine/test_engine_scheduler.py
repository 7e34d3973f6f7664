"""Step planning on plain lanes (no model, no cache): chunk ends, exact-tap splits, budgets."""

from __future__ import annotations

import queue

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.engine.kv.lane import KVLane
from ninfer.engine.request import PromptHints, Request
from ninfer.engine.scheduler import InPass, chunk_end, final_tap, may_admit, plan_step
from ninfer.request import SamplingParams


def _lane(n: int, computed: int, taps=(), generated: int = 0) -> KVLane:
    job = Request("r", list(range(n)), SamplingParams(), PromptHints(), queue.Queue())
    job.tokens = list(range(n + generated))
    return KVLane(job, 1, 0, n, computed, taps=list(taps))


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


def test_solo_budget_only_when_no_lane_decodes():
    lone = _lane(9000, 0)
    assert [(r.start, r.end) for r in plan_step([lone], 2048, 8192)] == [(0, 8192)]
    decoding = _lane(10, 10, generated=1)
    rows = plan_step([decoding, lone], 2048, 8192)
    assert [(r.start, r.end) for r in rows] == [(10, 11), (0, 2048)]  # decoders wait less
    assert [(r.start, r.end) for r in plan_step([lone], 2048)] == [(0, 2048)]  # no solo budget


def test_final_chunk_with_a_flexible_tap_stays_within_prefill_chunk():
    tail = _lane(8192, 0, taps=[(8128, False)])  # the prompt tail: taken at the final start
    assert chunk_end(tail, 8192, 2048) == 6144
    tail.computed = 6144
    assert chunk_end(tail, 8192, 2048) == 8192
    assert chunk_end(_lane(8192, 0), 8192, 2048) == 8192  # no flexible tap: one pass
    assert chunk_end(_lane(8010, 0, taps=[(7936, False)]), 8192, 2048) == 6016  # ceil64(5962)
    exact = _lane(8192, 0, taps=[(5000, True), (8128, False)])
    assert chunk_end(exact, 8192, 2048) == 5000  # an exact tap still splits first
    ladder = _lane(20000, 0, taps=[(12288, False), (19968, False)])
    assert chunk_end(ladder, 8192, 2048) == 8192  # flexible taps never split a middle chunk
    ladder.computed = 16384
    assert chunk_end(ladder, 8192, 2048) == 17984  # ceil64(20000 - 2048): final pass 2016


def test_long_chunks_snapshot_inside_their_pass_others_are_cut():
    tail = _lane(8192, 0, taps=[(8128, False)])
    assert final_tap(tail, 0, 8192, 2048) == 6144 and final_tap(tail, 0, 6144, 2048) is None
    assert final_tap(tail, 6144, 8192, 2048) is None  # within the cap: taken at its start
    rows = plan_step([tail], 2048, 8192)
    assert [(r.start, r.end, r.in_pass, r.tail_at) for r in rows] == [(0, 8192, True, 6144)]
    rows = plan_step([tail], 2048, 8192, in_pass=None)
    assert [(r.start, r.end, r.in_pass) for r in rows] == [(0, 6144, False)]
    graphs = InPass(above=2048, stride=64)  # CUDA: rows a prefill graph replays take none
    a, b = _lane(3000, 0, taps=[(2944, False)]), _lane(5000, 0, taps=[(4992, False)])
    rows = plan_step([a, b], 2048, 8192, graphs)  # any rows of a step may
    assert [(r.lane, r.start, r.end, r.in_pass) for r in rows] == [
        (a, 0, 3000, True),
        (b, 0, 5000, True),
    ]
    short = _lane(2000, 0, taps=[(1024, False)])
    assert [(r.end, r.in_pass) for r in plan_step([short], 2048, 8192, graphs)] == [(2000, False)]
    resumed = _lane(8000, 100, taps=[(7936, False)])  # off the op set's tap grid: cut
    assert [(r.end, r.in_pass) for r in plan_step([resumed], 2048, 8192, graphs)] == [(5952, False)]
    assert plan_step([resumed], 2048, 8192, InPass(2048, 1))[0].in_pass  # the reference's
    decoding = _lane(10, 10, generated=1)
    rows = plan_step([decoding, tail], 2048, 8192, graphs)  # the short budget: no long chunk
    assert [(r.start, r.end, r.in_pass) for r in rows] == [(10, 11, False), (0, 2048, False)]


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 5000),
    start=st.integers(0, 4999),
    base=st.sampled_from([64, 128, 256]),
    factor=st.integers(1, 8),
    taps=st.lists(st.tuples(st.integers(1, 5000), st.booleans()), max_size=6),
)
@pytest.mark.parametrize("in_pass", [None, InPass(), InPass(128, 64)])
def test_chunk_ends_over_a_whole_prompt(in_pass, n, start, base, factor, taps):
    """Chunks tile [start, n) within the budget; a middle end is an exact tap, a page boundary
    or (nothing to floor to) s + budget; the final chunk that takes a flexible tap at its start
    is at most `base` tokens, unless it snapshots inside its pass (`in_pass` allows it)."""
    start = min(start, n - 1)
    budget = base * factor
    flexible = [(p - p % 64 or 64, False) for p, exact in taps if not exact]
    plan = sorted({(p, e) for p, e in taps if e} | set(flexible))
    lane = _lane(n, start, taps=[(p, e) for p, e in plan if start < p <= n])
    while lane.computed < n:
        s = lane.computed
        [row] = plan_step([lane], base, budget, in_pass=in_pass)
        end = row.end
        assert row.start == s < end <= min(n, s + max(budget, base))
        assert row.in_pass == (in_pass is not None and in_pass.allows(s, end))
        exact_cut = any(e and p == end for p, e in lane.taps)
        if end < n:
            assert exact_cut or end % 64 == 0 or end == s + budget
        elif any(not e and s < p <= n for p, e in lane.taps) and not row.in_pass:
            assert n - s <= base
        lane.taps = [(p, e) for p, e in lane.taps if p > end]
        lane.computed = end
