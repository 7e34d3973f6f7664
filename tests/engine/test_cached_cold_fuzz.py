"""Cached = cold under a random mix (`python -m ninfer.bench.cached_cold` runs it long),
CI-sized: seeded rounds of requests sharing prefixes, with random sampling settings, cancels
and early-closed streams, through an LLM whose prefix cache (small Device pool, Host tier)
persists across rounds; each request run again without a cache.

The criterion: every completed reply equals the cold run's and every cancelled or closed one is
a prefix of it, except where the two differ only at a near-tie: up to and including the first
differing position every logprob both runs list agrees within `NOISE` (fp32 rounding of other
chunk bounds and batch neighbours), and the decision that flipped there had a margin within
`TIE` (greedy: the cold run's top-2 gap; seeded sampling: the draw's margin between the two
tokens, its noise reproduced from the seed, or a top-p / top-k / min-p cut, whose threshold
moves with the same noise). Anything else is a suspect: a cache bug until shown otherwise."""

from __future__ import annotations

import io

import torch

from ninfer.bench.cached_cold import (
    FP32,
    FuzzReport,
    FuzzRequest,
    Mismatch,
    Outcome,
    classify,
    compare,
    race_gap,
    run_cached_cold,
)
from ninfer.request import SamplingParams
from ninfer.sampling import make_generator, sample


def test_cached_equals_cold_under_a_random_mix(make_llm):
    """96 requests in 4 rounds (seed 11) over a 24-page Device pool and a Host tier: no error,
    no drift beyond the noise, no mismatch but near-ties; the mix reached the cache."""
    llm = make_llm(
        max_concurrency=8, kv_capacity=24 * 64, host_cache_mib=4, device_snapshot_slots=4,
        solo_prefill_chunk=256,  # a lone prompt's final chunk may snapshot inside the pass
        check_invariants=False,  # the cold comparison is the check
    )  # fmt: skip
    cold = make_llm(max_concurrency=8, prefix_reuse=False, check_invariants=False)
    log = io.StringIO()
    report = run_cached_cold(
        llm, cold, rounds=4, per_round=24, seed=11, root_tokens=200, max_tokens=10, out=log
    )
    assert report.ok, (report.errors, [m.describe() for m in report.suspects], log.getvalue())
    assert report.requests == 96 and report.compared.get("length", 0) > 20
    assert report.compared.get("abort", 0) > 5 and report.compared.get("closed", 0) > 0
    assert report.positions > 200 and report.max_drift <= FP32.noise
    stats = llm.cache_stats()
    assert stats.restores > 0  # the Host tier served some of it
    assert stats.hits_host + stats.hits_device > 10


def test_race_gap_reproduces_the_seeded_draw():
    """`race_gap` rebuilds the draw `ninfer.sampling` made: the chosen token beats every other
    token of the row (a positive margin), at every step of a seeded request."""
    torch.manual_seed(0)
    vocab, params = 300, SamplingParams(temperature=0.7, seed=99)
    gen = make_generator(params.seed, "cpu")
    for step in range(4):
        logits = torch.randn(1, vocab) * 2
        chosen = int(sample(logits, [params], [gen]).token_ids[0])
        lp = logits[0].log_softmax(-1)
        others = [t for t in range(vocab) if t != chosen][::7]
        gaps = [race_gap(params, step, vocab, (chosen, float(lp[chosen])), (t, float(lp[t])))
                for t in others]  # fmt: skip
        assert min(gaps) > 0


def _mismatch(params: SamplingParams, **figures) -> Mismatch:
    req = FuzzRequest(0, 0, [5, 6], [], params, "complete", 0)
    m = Mismatch(req, "length", 0, 3, 10, 11, **figures)
    m.kind = classify(m)
    return m


def test_classify_tells_a_near_tie_from_a_suspect():
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    sampled = SamplingParams(temperature=0.8, seed=1, max_tokens=8)
    top_p = SamplingParams(temperature=0.8, seed=1, top_p=0.9, max_tokens=8)
    assert _mismatch(greedy, drift=3e-6, cold_gap=2e-6, race_gap=None).kind == "near-tie"
    assert _mismatch(greedy, drift=3e-6, cold_gap=10 * FP32.tie, race_gap=None).kind == "suspect"
    assert _mismatch(greedy, drift=10 * FP32.noise, cold_gap=0.0, race_gap=None).kind == "suspect"
    assert _mismatch(sampled, drift=3e-6, cold_gap=0.5, race_gap=-4e-6).kind == "near-tie"
    assert _mismatch(sampled, drift=3e-6, cold_gap=0.5, race_gap=0.3).kind == "suspect"
    assert _mismatch(top_p, drift=3e-6, cold_gap=0.5, race_gap=0.3).kind == "near-tie"
    report = FuzzReport(mismatches=[_mismatch(sampled, drift=0.2, cold_gap=0.1, race_gap=0.0)])
    assert not report.ok and report.suspects


def test_a_drift_beyond_the_noise_fails_without_a_mismatch():
    """Equal tokens, logprobs 1e-3 apart: the cached run computed something else."""
    params = SamplingParams(temperature=0.0, max_tokens=2, logprobs=2)
    req = FuzzRequest(0, 0, [5, 6], [], params, "complete", 0)
    lp = [{7: -1.0, 8: -2.0}, {9: -1.5, 7: -1.7}]
    off = [{t: v + 1e-3 for t, v in row.items()} for row in lp]
    report = FuzzReport()
    hot, cold = Outcome([7, 9], off, "length"), Outcome([7, 9], lp, "length")
    assert compare(req, hot, cold, 16, report) is None
    assert not report.ok and "off the cold run's from reply position 0" in report.errors[0]
