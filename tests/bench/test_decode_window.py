"""The steady-state decode figure of `ninfer bench decode`: `decode_window` on synthetic
per-token arrival times (exact arithmetic: dyadic step costs), then `bench_decode` on the demo
model (CPU, a few dozen steps)."""

from __future__ import annotations

import pytest

from ninfer.bench.throughput import MIN_WINDOW_STEPS, decode_window

MIXED, DECODE, FEWER = 0.75, 0.25, 0.125  # step costs: a lane prefilling / all decoding / after


def simulate(batch: int, chunks: int, n: int, lag: float = 0.0, max_lanes: int | None = None):
    """Per-lane token arrival times of `batch` lanes of `n` tokens, admitted one at a time, each
    prefilling in `chunks` steps (its first token at its last prefill step), at most
    `max_lanes` at once. A step costs MIXED while a lane prefills, DECODE while every lane
    decodes, FEWER once some lanes have finished; lane i's deltas arrive `lag * i` after the
    step's end (later lanes' deltas are sent later). Returns (times, step end times, first
    token steps, last token steps)."""
    max_lanes = max_lanes or batch
    first, last = [None] * batch, [None] * batch
    ends, now, step, admitted, prefilled = [], 0.0, 0, 0, 0
    running: list[int] = []
    while any(x is None for x in last):
        free = not running or first[running[-1]] is not None  # no lane prefilling
        if free and admitted < batch and len(running) < max_lanes:
            running.append(admitted)
            admitted, prefilled = admitted + 1, 0
        prefilling = first[running[-1]] is None
        now += MIXED if prefilling else DECODE if len(running) == batch else FEWER
        ends.append(now)
        if prefilling:
            prefilled += 1
            if prefilled == chunks:
                first[running[-1]] = step
        for i in list(running):
            if first[i] is not None and step - first[i] == n - 1:
                last[i] = step
                running.remove(i)
        step += 1
    times = [[ends[s] + lag * i for s in range(first[i], last[i] + 1)] for i in range(batch)]
    return times, ends, first, last


def test_the_window_is_the_all_decoding_steps_exactly():
    times, ends, first, last = simulate(batch=3, chunks=2, n=20)
    assert first == [1, 3, 5] and last == [20, 22, 24]
    w = decode_window(times)
    # from the step that gave lane 2 its first token (5) to lane 0's last (20): steps 6..20
    assert w["steps"] == 15 == last[0] - first[-1]
    assert w["seconds"] == ends[20] - ends[5] == 15 * DECODE
    assert w["step_seconds"] == DECODE and w["note"] is None


def test_deltas_of_one_step_arriving_apart_still_give_the_exact_window():
    # lane 0's token of step 5 arrives before lane 2's first: it still opens the window
    times, ends, _, _ = simulate(batch=4, chunks=1, n=30, lag=0.01)
    w = decode_window(times)
    assert w["steps"] == 29 - 3
    assert w["seconds"] == pytest.approx(26 * DECODE, abs=1e-12)
    assert w["step_seconds"] == pytest.approx(DECODE, abs=1e-12)


def test_a_mixed_step_never_enters_the_window():
    times, *_ = simulate(batch=2, chunks=3, n=16)
    w = decode_window(times)
    # a mixed step costs 3 decode steps: any of them in the window would raise the mean
    assert w["step_seconds"] == DECODE and w["steps"] == 15 - 3


def test_batch_one_is_its_whole_decode():
    times, ends, first, last = simulate(batch=1, chunks=2, n=12)
    w = decode_window(times)
    assert w["steps"] == 11 and w["seconds"] == 11 * DECODE and w["step_seconds"] == DECODE


def test_a_short_window_gives_no_figure():
    times, *_ = simulate(batch=3, chunks=2, n=MIN_WINDOW_STEPS + 3)
    w = decode_window(times)
    assert w["steps"] == MIN_WINDOW_STEPS + 2 - 4  # n - 1 steps, 4 of them before lane 2's first
    assert w["step_seconds"] is None and "too short" in w["note"]
    assert decode_window(times, min_steps=w["steps"])["step_seconds"] == DECODE


def test_lanes_that_never_all_decode_give_no_figure():
    times, *_ = simulate(batch=3, chunks=1, n=12, max_lanes=2)  # lane 2 waits for lane 0
    w = decode_window(times)
    assert w["steps"] == 0 and w["step_seconds"] is None
    assert "never all decoded at once (at most 2 of 3)" in w["note"]
    assert decode_window([[1.0, 2.0], []])["note"] == "lane(s) [1] produced no token"


@pytest.fixture(scope="module")
def demo_llm():
    from ninfer.llm import LLM

    with LLM(device="cpu", max_concurrency=4, kv_capacity=8192, host_cache_mib=64) as llm:
        yield llm


def test_bench_decode_on_the_demo_model(demo_llm):
    from ninfer.bench.model_math import param_counts
    from ninfer.bench.throughput import bench_decode
    from ninfer.demo import demo_config

    cfg = demo_config()
    bounds = {"copy_bytes_per_s": 1e10}
    rows = bench_decode(demo_llm, cfg, param_counts(cfg), 16, 8, [1, 3], bounds, 4, 4)
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert not r["errors"] and r["steady_note"] is None, r
        # batch 1: the whole decode (8 steps); batch 3: 8 + the staggered start's margin
        assert 8 <= r["steady_window_steps"] <= r["steady_max_tokens"] - 1
        step = r["steady_step_seconds"]
        assert step > 0 and r["steady_window_seconds"] == pytest.approx(
            step * r["steady_window_steps"]
        )
        assert r["steady_tokens_per_s"] == pytest.approx(r["batch"] / step)
        assert r["steady_fraction_of_bound"] == pytest.approx(
            r["steady_tokens_per_s"] / r["bound_tokens_per_s"]
        )
        assert r["e2e_tokens_per_s"] > 0 and r["e2e_max_tokens"] == 8
    assert rows[0]["steady_window_steps"] == 8  # one lane: n - 1 steps, n = 8 + 1


def test_bench_decode_with_a_short_run_says_so(demo_llm):
    from ninfer.bench.model_math import param_counts
    from ninfer.bench.throughput import bench_decode
    from ninfer.demo import demo_config

    cfg = demo_config()
    rows = bench_decode(demo_llm, cfg, param_counts(cfg), 16, 3, [2], {"copy_bytes_per_s": 1e10},
                        4, 4)  # fmt: skip
    (r,) = rows
    assert r["steady_step_seconds"] is None and r["steady_tokens_per_s"] is None
    assert "too short" in r["steady_note"] and r["steady_window_steps"] < MIN_WINDOW_STEPS
    assert r["e2e_tokens_per_s"] > 0


def test_a_batch_the_kv_pool_cannot_hold_at_once_says_so():
    """Three lanes of 300 + 40 tokens on a pool of 8 pages (512 tokens): they decode one or two
    at a time, and the row says why there is no figure instead of asking for more tokens."""
    from ninfer.bench.model_math import param_counts
    from ninfer.bench.throughput import bench_decode
    from ninfer.demo import demo_config
    from ninfer.llm import LLM

    cfg = demo_config()
    with LLM(device="cpu", max_concurrency=4, kv_capacity=512, host_cache_mib=0) as llm:
        (r,) = bench_decode(llm, cfg, param_counts(cfg), 300, 40, [3], {"copy_bytes_per_s": 1e10},
                            4, 4)  # fmt: skip
    assert r["steady_step_seconds"] is None and not r["errors"]
    assert "never all decoded at once" in r["steady_note"]
    assert "the KV pool holds 512 tokens" in r["steady_note"], r["steady_note"]
