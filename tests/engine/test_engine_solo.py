"""A lone prompt's longer passes (`solo_prefill_chunk`): the same tokens as `prefill_chunk`
passes, fewer steps, the prompt-tail snapshot still within `prefill_chunk` of the end (taken
inside the final pass, without a second one), and decode rows keep the short budget."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ninfer.engine import engine as loop
from ninfer.request import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _prompt(seed: int, n: int) -> dict:
    rng = random.Random(seed)
    return {"prompt_token_ids": [rng.randrange(16, 2000) for _ in range(n)]}


def test_solo_passes_give_the_same_tokens_in_fewer_steps(make_llm):
    prompt = _prompt(1, 700)
    runs = {}
    for solo in (64, 256):
        llm = make_llm(prefill_chunk=64, solo_prefill_chunk=solo)
        engine = llm.engine
        before = engine.steps
        out = llm.generate([prompt], GREEDY)[0]
        steps = engine.steps - before
        retry = llm.generate([prompt], GREEDY)[0]
        runs[solo] = (out.token_ids, steps, retry)
    (base, base_steps, base_retry), (solo, solo_steps, solo_retry) = runs[64], runs[256]
    assert solo == base  # fp32: the pass boundaries do not change the greedy tokens
    # 700 tokens: 11 passes of 64 against 256 + 256 + 188 (the tail tapped inside), then decode
    assert solo_steps == base_steps - 8, (solo_steps, base_steps)
    for retry in (base_retry, solo_retry):
        assert retry.token_ids == base
        assert retry.usage.cached_tokens == 640  # the tail snapshot: ceil64(700 - 64)


def _spy_steps(monkeypatch) -> list[list[tuple[int, int, bool]]]:
    """(start, end, in_pass) of every slice of every step the engine plans from now on (the
    loop runs each planned step's slices)."""
    steps: list[list[tuple[int, int, bool]]] = []
    plan = loop.plan_step

    def spy(*args, **kwargs):
        slices = plan(*args, **kwargs)
        steps.append([(s.start, s.end, s.in_pass) for s in slices])
        return slices

    monkeypatch.setattr(loop, "plan_step", spy)
    return steps


@pytest.mark.parametrize("in_pass", [True, False])
def test_tail_snapshot_inside_the_final_pass_or_cut_before_it(make_llm, monkeypatch, in_pass):
    """The in-pass tap and the cut give the same tokens and the same snapshot; the in-pass one
    saves a pass. The retry's cold oracle is a run without the prefix cache."""
    prompt = _prompt(4, 700)
    cold = make_llm(prefill_chunk=64, solo_prefill_chunk=256, prefix_reuse=False)
    want = cold.generate([prompt], GREEDY)[0].token_ids
    llm = make_llm(prefill_chunk=64, solo_prefill_chunk=256)
    if not in_pass:
        llm.engine.in_pass = None
    steps = _spy_steps(monkeypatch)
    assert llm.generate([prompt], GREEDY)[0].token_ids == want
    prefill = [s for step in steps for s in step if s[1] - s[0] > 1]
    if in_pass:
        assert prefill == [(0, 256, True), (256, 512, True), (512, 700, True)], prefill
    else:
        assert prefill == [(0, 256, False), (256, 512, False), (512, 640, False), (640, 700, False)]
    retry = llm.generate([prompt], GREEDY)[0]
    assert retry.token_ids == want and retry.usage.cached_tokens == 640


def test_in_pass_tap_without_a_free_snapshot_slot_is_skipped(make_llm, monkeypatch):
    """No snapshot slot for the in-pass tap: the pass runs whole, unsplit, the same tokens."""
    prompt = _prompt(5, 700)
    cold = make_llm(prefill_chunk=64, solo_prefill_chunk=256, prefix_reuse=False)
    want = cold.generate([prompt], GREEDY)[0].token_ids
    llm = make_llm(prefill_chunk=64, solo_prefill_chunk=256)
    index, rows = llm.engine.kv_state.index, []
    allocate = index.allocate_snapshot_slot
    monkeypatch.setattr(
        index,
        "allocate_snapshot_slot",
        lambda lane, f, kind: None if f == 640 else allocate(lane, f, kind),
    )
    launch = llm.engine.runner.launch
    monkeypatch.setattr(llm.engine.runner, "launch", lambda r, *a: rows.append(r) or launch(r, *a))
    assert llm.generate([prompt], GREEDY)[0].token_ids == want
    assert all(not r.taps for step in rows for r in step)
    assert llm.generate([prompt], GREEDY)[0].usage.cached_tokens != 640


def test_decoding_lanes_keep_the_short_budget(make_llm, monkeypatch):
    """With a lane decoding, a long prompt's chunks are prefill_chunk tokens."""
    llm = make_llm(prefill_chunk=64, solo_prefill_chunk=512, max_concurrency=2)
    steps = _spy_steps(monkeypatch)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    short, long_ = _prompt(2, 300), _prompt(3, 600)
    outs = llm.generate([short, long_], params)
    assert all(len(o.token_ids) == 40 for o in outs)
    sizes = [[end - start for start, end, _ in step] for step in steps]
    mixed = [s for s in sizes if len(s) > 1]  # steps with decode rows and a prefill chunk
    assert mixed and all(max(s) <= 64 for s in mixed), sizes
    assert sizes[0] == [300], sizes  # the lone first prompt: one pass, its tail tapped inside


def _chat(rng: random.Random, turns: int, words: int) -> list[dict]:
    vocab = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "zeta", "theta", "rho"]

    def text(n: int) -> str:
        return " ".join(rng.choice(vocab) + str(rng.randrange(100)) for _ in range(n))

    conv = [{"role": "system", "content": text(words)}]
    for _ in range(turns):
        conv.append({"role": "user", "content": text(rng.randrange(5, words))})
        conv.append({"role": "assistant", "content": text(rng.randrange(3, 40))})
    conv.append({"role": "user", "content": text(rng.randrange(5, words))})
    return conv


@given(seed=st.integers(0, 2**16), turns=st.integers(0, 2), words=st.integers(20, 160))
@settings(
    max_examples=5,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),  # engine runs per example
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
def test_a_cold_chat_prompt_takes_its_exact_taps_inside_one_pass(
    make_llm, monkeypatch, seed, turns, words
):
    """A lone cold chat prompt runs as one pass with the cache on, as with it off: its exact
    taps (message boundaries, the end of the last user message before the generation opener)
    are taken inside the pass, off the page grid, their partial blocks copied after it. A
    re-rendered follow-up that drops the reply resumes at such a tap and gives the tokens of
    a cold run."""
    conv = _chat(random.Random(seed), turns, words)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    cold = make_llm(prefix_reuse=False, solo_prefill_chunk=4096)
    llm = make_llm(solo_prefill_chunk=4096)
    steps = _spy_steps(monkeypatch)
    first = llm.chat([conv], params)[0]
    passes = [s for step in steps for s in step if s[1] - s[0] > 1]
    assert passes == [(0, first.usage.prompt_tokens, True)], passes
    assert first.token_ids == cold.chat([conv], params)[0].token_ids
    follow = [*conv, {"role": "user", "content": "and then?"}]  # the reply dropped
    hot, want = llm.chat([follow], params)[0], cold.chat([follow], params)[0]
    assert hot.token_ids == want.token_ids
    assert hot.usage.cached_tokens > 0
