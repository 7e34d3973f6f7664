"""Page pressure never cuts a request short (spec §6.3, §9.5).

Admission checks the engine's own rule (need <= free + evictable - reserved, evictable being
what eviction can free), so an admitted lane always gets its entitlement; a lane the pool cannot
extend beyond it is suspended through its endpoint snapshot and resumed from there when pages
allow. Every request ends "length" only at max_tokens or the model length, with the tokens (and
stream, text, logprobs) of the same request run alone on a roomy engine.
"""

from __future__ import annotations

import random

from engine_helpers import assert_idle, greedy, rand_tokens
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ninfer.engine.kv import pages
from ninfer.request import RequestOutput, SamplingParams, StreamDelta


def _roomy(make_llm, **kw):
    opts = dict(kv_capacity=200 * 64, max_concurrency=1, prefix_reuse=False)
    opts.update(kw)
    return make_llm(**opts)


def _alone(roomy, prompt, params) -> RequestOutput:
    return roomy.generate([prompt], params)[0]


def small_window(monkeypatch):
    """Admissions reserve 64 output tokens instead of 512, so that short requests on a small
    pool outgrow their entitlement and meet the pool's limit every few tokens."""
    monkeypatch.setattr(pages, "OUTPUT_WINDOW", 64)


def test_admission_never_overcommits_the_pool(make_llm, monkeypatch):
    """Three lanes on a 9-page pool with a Host tier, shared prefixes: on 07d62c0 an admission
    quoted "need <= evictable" (free - reserved clamped at 0, pinned subtrees counted) and the
    reservations outgrew free + evictable (the engine failed its invariant check). Now every
    request ends at max_tokens with its solo tokens."""
    small_window(monkeypatch)
    rng = random.Random(5)
    pre = rand_tokens(rng, 70)
    shapes = [(True, 101, 92), (False, 85, 10), (False, 39, 127), (True, 91, 128), (False, 69, 35)]
    prompts = [(pre if shared else []) + rand_tokens(rng, n) for shared, n, _ in shapes]
    params = [greedy(m) for _, _, m in shapes]
    llm = make_llm(kv_capacity=9 * 64, max_concurrency=3, host_cache_mib=16)
    roomy = _roomy(make_llm)
    outs = llm.generate(prompts, params)
    for out, prompt, sp in zip(outs, prompts, params, strict=True):
        assert out.error is None and out.finish_reason == "length", out.error
        assert out.token_ids == _alone(roomy, prompt, sp).token_ids
    assert_idle(llm)


def test_suspended_stream_is_one_uninterrupted_request(make_llm, monkeypatch):
    """Streamed, seeded sampling with logprobs and a Host tier: the suspended request's deltas
    (same request_id) add up to its final tokens and text, which equal a solo run's."""
    small_window(monkeypatch)
    rng = random.Random(22)
    llm = make_llm(kv_capacity=8 * 64, max_concurrency=2, host_cache_mib=16)
    roomy = _roomy(make_llm)
    prompts = [rand_tokens(rng, 100), rand_tokens(rng, 120)]
    params = [
        SamplingParams(max_tokens=220, temperature=0.9, seed=7, ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=200, temperature=0, ignore_eos=True),
    ]
    streams = [llm.stream(p, sp) for p, sp in zip(prompts, params, strict=True)]
    finals = []
    for s, p, sp in zip(streams, prompts, params, strict=True):
        toks, text, final, ids = [], "", None, set()
        for ev in s:
            if isinstance(ev, StreamDelta):
                ids.add(ev.request_id)
                toks += ev.token_ids
                text += ev.text
            else:
                final = ev
        want = _alone(roomy, p, sp)
        assert ids == {final.request_id} and final.finish_reason == "length"
        assert final.token_ids == toks == want.token_ids
        assert final.text == text == want.text
        # (batch composition moves logprobs in the last float bits, suspended or not)
        assert (final.logprobs is None) == (want.logprobs is None)
        for got, exp in zip(final.logprobs or [], want.logprobs or [], strict=True):
            assert got.keys() == exp.keys()
            assert all(abs(got[k] - exp[k]) < 1e-4 for k in got)
        assert final.usage.prompt_tokens == len(p)
        assert final.usage.completion_tokens == sp.max_tokens
        finals.append(final)
    assert sum(f.metrics.suspensions for f in finals) >= 1
    assert llm.cache_stats().suspensions == sum(f.metrics.suspensions for f in finals)
    assert_idle(llm)


def test_suspension_without_prefix_cache_recomputes(make_llm, monkeypatch):
    """prefix_reuse=False: nothing to resume from, so a suspended lane recomputes its tokens
    from the start when pages allow; its output is still the solo run's."""
    small_window(monkeypatch)
    rng = random.Random(23)
    llm = make_llm(kv_capacity=8 * 64, max_concurrency=2, prefix_reuse=False)
    roomy = _roomy(make_llm)
    prompts = [rand_tokens(rng, 100), rand_tokens(rng, 100)]
    outs = llm.generate(prompts, greedy(250))
    assert [o.token_ids for o in outs] == [_alone(roomy, p, greedy(250)).token_ids for p in prompts]
    assert [o.finish_reason for o in outs] == ["length", "length"]
    assert sum(o.metrics.suspensions for o in outs) >= 1
    assert llm.cache_stats().suspensions >= 1
    assert_idle(llm)


def test_cancel_while_suspended_returns_what_it_generated(make_llm, monkeypatch):
    small_window(monkeypatch)
    rng = random.Random(24)
    llm = make_llm(kv_capacity=8 * 64, max_concurrency=2, host_cache_mib=0)
    roomy = _roomy(make_llm)
    engine = llm.engine
    seen = []

    def cancel_suspended(eng):
        for job in eng.waiting:
            if job.suspensions and not job.cancelled.is_set():
                seen.append(len(job.generated))
                job.cancelled.set()

    engine.on_step = cancel_suspended
    prompts = [rand_tokens(rng, 100), rand_tokens(rng, 100)]
    outs = llm.generate(prompts, greedy(250))
    engine.on_step = None
    assert len(seen) == 1
    aborted = [o for o in outs if o.finish_reason == "abort"]
    done = [o for o in outs if o.finish_reason == "length"]
    assert len(aborted) == len(done) == 1
    i = outs.index(aborted[0])
    assert aborted[0].token_ids == _alone(roomy, prompts[i], greedy(250)).token_ids[: seen[0]]
    assert done[0].token_ids == _alone(roomy, prompts[1 - i], greedy(250)).token_ids
    assert_idle(llm)


_PARAMS = st.one_of(
    st.builds(greedy, st.integers(1, 160)),
    st.builds(
        lambda n, seed: SamplingParams(max_tokens=n, temperature=0.8, seed=seed, ignore_eos=True),
        st.integers(1, 160),
        st.integers(0, 3),
    ),
)


@settings(
    max_examples=7,  # new draws every run; the suite keeps to its 10 minutes
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**16),
    n_pages=st.integers(5, 8),
    lanes=st.integers(1, 8),
    host=st.booleans(),
    reuse=st.sampled_from([True, True, False]),
    reqs=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 130), _PARAMS), min_size=2, max_size=8
    ),
)
def test_no_request_is_ever_cut_short(
    make_llm, monkeypatch, seed, n_pages, lanes, host, reuse, reqs
):
    """Any mix of prompts (sharing prefixes), pool sizes and concurrency, invariants checked
    every step: every request ends "length" exactly at max_tokens or the model length, with
    the tokens of the same request run alone."""
    small_window(monkeypatch)
    rng = random.Random(seed)
    prefixes = [rand_tokens(rng, n) for n in (0, 70, 130)]
    prompts = [prefixes[k] + rand_tokens(rng, n) for k, n, _ in reqs]
    params = [p for _, _, p in reqs]
    llm = make_llm(
        kv_capacity=n_pages * 64,
        max_concurrency=lanes,
        host_cache_mib=16 if host else 0,
        prefix_reuse=reuse,
    )
    max_len = llm.engine_config.memory.max_model_len
    outs = llm.generate(prompts, params)
    for out, prompt, sp in zip(outs, prompts, params, strict=True):
        assert out.error is None and out.finish_reason == "length", out
        assert len(out.token_ids) == min(sp.max_tokens, max_len - len(prompt))
        assert out.token_ids == _solo(make_llm, max_len, prompt, sp)
    suspended = llm.cache_stats().suspensions
    assert suspended == sum(o.metrics.suspensions for o in outs)
    event(f"suspensions: {'some' if suspended else 'none'}")
    assert_idle(llm)
    llm.close()


_SOLO: dict = {}


def _solo(make_llm, max_len: int, prompt: list[int], sp: SamplingParams) -> list[int]:
    """The request's tokens run alone on a roomy engine without a cache (memoized)."""
    key = (max_len, tuple(prompt), sp.max_tokens, sp.temperature, sp.seed)
    if key not in _SOLO:
        roomy = _SOLO.get(max_len)
        if roomy is None:
            roomy = _SOLO[max_len] = _roomy(make_llm, max_model_len=max_len)
        _SOLO[key] = _alone(roomy, prompt, sp).token_ids
    return _SOLO[key]
