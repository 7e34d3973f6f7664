"""Fault containment with speculation on (`ninfer.engine.speculative`), as `test_faults.py`
checks it for plain decode: a fault in the MTP draft head costs drafts, never a request (the
drafts are only proposals: every lane goes on, its output plain decode's); a fault in one
verify row's acceptance fails that request alone; a fault in the verify pass fails the lanes
of that step; a request cancelled from another thread mid-speculation ends "abort". In every
case the other requests get plain decode's tokens, the engine keeps serving, and nothing is
left pinned (`check_invariants` runs after every step)."""

from __future__ import annotations

import dataclasses
import random
import threading
import time

import pytest
from engine_helpers import (
    INJECTED,
    assert_idle,
    failing_forward,
    greedy,
    rand_tokens,
)

from ninfer.llm import LLM
from ninfer.request import SamplingParams

N_LANES = 4
MAX_TOKENS = 24


@pytest.fixture
def make(mtp_models):
    """make(kind, speculative) -> LLM (K = 3 when speculating); closed at teardown."""
    made: list[LLM] = []

    def factory(kind: str = "dense", speculative: bool = True) -> LLM:
        spec = dict(speculative="mtp", num_speculative_tokens=3) if speculative else {}
        llm = LLM.from_model(mtp_models[kind], None, None, device="cpu", prefill_chunk=64,
                             max_concurrency=N_LANES, kv_capacity=16384, host_cache_mib=16,
                             check_invariants=True, **spec)  # fmt: skip
        made.append(llm)
        return llm

    yield factory
    for llm in made:
        llm.close()


def _prompts(seed: int, n: int = N_LANES) -> list[list[int]]:
    rng = random.Random(seed)
    return [rand_tokens(rng, rng.randrange(20, 120)) for _ in range(n)]


def _plain(make, kind: str, prompts, params) -> list[list[int]]:
    plain = make(kind, speculative=False)
    return [o.token_ids for o in plain.generate(prompts, params)]


def _still_serves(llm, make, kind: str) -> None:
    fresh = _prompts(99, 2)
    params = greedy(MAX_TOKENS)
    assert [o.token_ids for o in llm.generate(fresh, params)] == _plain(make, kind, fresh, params)
    assert_idle(llm)


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("mode", ["once", "every third", "always"])
def test_a_fault_in_the_draft_head_costs_drafts_not_output(make, kind, mode):
    """The head's passes (bridge and chain) raise once, every third time or always: no
    request fails, each gets plain decode's tokens, the faults are counted, and the engine
    drafts again once the head works again."""
    prompts = _prompts(1)
    params = [greedy(MAX_TOKENS), greedy(MAX_TOKENS + 5), greedy(MAX_TOKENS - 7), greedy(9)]
    want = _plain(make, kind, prompts, params)
    llm = make(kind)
    due = {"once": lambda n: n == 3, "every third": lambda n: n % 3 == 0,
           "always": lambda n: True}[mode]  # fmt: skip
    with failing_forward(llm.engine.runner.model.mtp, due):
        outs = llm.generate(prompts, params)
    assert [(o.finish_reason, o.error) for o in outs] == [("length", None)] * len(prompts)
    assert [o.token_ids for o in outs] == want
    stats = llm.engine.call(lambda: llm.engine.speculator.stats)
    assert stats.head_faults >= 1
    if mode == "always":
        assert stats.drafted == 0  # every lane decoded without drafts
    assert llm.engine.faults_contained == 0  # no request failed
    assert_idle(llm)
    before = llm.engine.call(lambda: dataclasses.replace(llm.engine.speculator.stats))
    _still_serves(llm, make, kind)
    after = llm.engine.call(lambda: llm.engine.speculator.stats)
    assert after.drafted > before.drafted and after.head_faults == before.head_faults


def test_a_draft_head_fault_leaves_seeded_sampling_following_the_target(make):
    """Sampled requests whose drafts the head fails to make: they finish, with a full reply,
    and two runs with the same faults and seeds agree (the fault costs only drafts)."""
    prompts = _prompts(2)
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, seed=7 + i, ignore_eos=True)
              for i in range(len(prompts))]  # fmt: skip
    runs = []
    for _ in range(2):
        llm = make("dense")
        with failing_forward(llm.engine.runner.model.mtp, lambda n: n % 4 == 2):
            outs = llm.generate(prompts, params)
        assert all(o.finish_reason == "length" and len(o.token_ids) == MAX_TOKENS for o in outs)
        runs.append([o.token_ids for o in outs])
        assert_idle(llm)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("greedy_rows", [True, False])
def test_a_fault_in_one_rows_acceptance_fails_that_request_alone(make, monkeypatch, greedy_rows):
    """The acceptance of one request's verify rows raises (a sampling fault): that request
    fails with the fault's text (what it had is plain decode's, greedy); the others finish
    with plain decode's tokens (greedy), or in full (sampled)."""
    prompts = _prompts(3)
    target = 2
    marker = MAX_TOKENS + 1  # the target's params differ in max_tokens

    def params(i):
        n = marker if i == target else MAX_TOKENS
        if greedy_rows:
            return greedy(n)
        return SamplingParams(max_tokens=n, temperature=0.8, seed=i, ignore_eos=True)

    plist = [params(i) for i in range(len(prompts))]
    want = _plain(make, "dense", prompts, plist)
    llm = make("dense")
    spec = llm.engine.speculator
    real = spec._accept

    def accept(row, *args):
        if row.sample.max_tokens == marker:
            raise RuntimeError(INJECTED)
        return real(row, *args)

    monkeypatch.setattr(spec, "_accept", accept)
    outs = llm.generate(prompts, plist)
    for i, out in enumerate(outs):
        if i == target:
            assert out.finish_reason == "error" and INJECTED in out.error, out
            if greedy_rows:  # (a sampled request's draws follow its drafts)
                assert out.token_ids == want[i][: len(out.token_ids)]
        else:
            assert (out.finish_reason, out.error) == ("length", None), out
            assert len(out.token_ids) == MAX_TOKENS
            if greedy_rows:
                assert out.token_ids == want[i]
    assert llm.engine.faults_contained == 1
    assert_idle(llm)
    monkeypatch.undo()
    _still_serves(llm, make, "dense")


@pytest.mark.parametrize("mode", ["once", "repeatedly"])
def test_a_verify_pass_fault_fails_the_lanes_of_that_step(make, monkeypatch, mode):
    """The target pass of a step whose rows all verify raises (once, or at three of its
    steps): the lanes of those steps fail (what they had is plain decode's), every other
    request gets plain decode's tokens, and the engine keeps serving."""
    prompts = _prompts(4, N_LANES + 3)  # 4 in flight, 3 queued behind them
    want = _plain(make, "dense", prompts, greedy(MAX_TOKENS))
    llm = make("dense")
    model = llm.engine.runner.model
    real = model.forward_hidden
    hit: list[int] = []
    verify_steps = {"n": 0}

    def forward_hidden(batch, *args, **kwargs):
        if max(batch.q_lens) > 1 and len(set(batch.q_lens)) == 1 and batch.q_lens[0] == 4:
            verify_steps["n"] += 1  # every row a verify row of K + 1 = 4 tokens
            n = verify_steps["n"]
            if n == 3 or (mode == "repeatedly" and n in (7, 12)):
                hit.append(len(batch.q_lens))
                raise RuntimeError(INJECTED)
        return real(batch, *args, **kwargs)

    monkeypatch.setattr(model, "forward_hidden", forward_hidden)
    outs = llm.generate(prompts, greedy(MAX_TOKENS))
    failed = []
    for i, out in enumerate(outs):
        if out.finish_reason == "error":
            assert INJECTED in out.error and out.error.startswith("engine error: ")
            assert out.token_ids == want[i][: len(out.token_ids)]
            failed.append(i)
        else:
            assert (out.finish_reason, out.token_ids) == ("length", want[i]), i
    assert hit and len(failed) == sum(hit)  # exactly the lanes of the faulted steps
    if mode == "once":
        assert len(failed) < len(prompts)  # the queued ones at least were served
    assert llm.engine.faults_contained == len(failed)
    assert_idle(llm)
    monkeypatch.undo()
    _still_serves(llm, make, "dense")


def test_cancel_mid_speculation_from_another_thread(make):
    """Long speculating requests, two cancelled by id from another thread: they end "abort"
    with a prefix of plain decode's tokens; the others finish with plain decode's."""
    prompts = _prompts(5)
    n = 200
    want = _plain(make, "dense", prompts, greedy(n))
    llm = make("dense")
    outs = []
    worker = threading.Thread(target=lambda: outs.append(llm.generate(prompts, greedy(n))))
    worker.start()
    t0 = time.monotonic()
    while len(llm.live_request_ids()) < len(prompts) and time.monotonic() - t0 < 60:
        time.sleep(0.005)
    ids = llm.live_request_ids()
    while llm.engine.call(lambda: llm.engine.speculator.stats.verify_rows) < 8:
        time.sleep(0.005)
    cancelled = {ids[0], ids[2]}
    assert all(llm.cancel(rid) for rid in cancelled)
    worker.join(120)
    assert not worker.is_alive()
    for i, out in enumerate(outs[0]):
        if out.request_id in cancelled:
            assert out.finish_reason == "abort" and len(out.token_ids) < n
            assert out.token_ids == want[i][: len(out.token_ids)]
        else:
            assert (out.finish_reason, out.token_ids) == ("length", want[i])
    assert_idle(llm)


@pytest.mark.parametrize("fatal", [False, True])
def test_a_fault_of_the_bridge_run_ahead_sets_the_step_back(make, monkeypatch, fatal):
    """The graph route's bridge run ahead (`Speculator._bridge_ahead`: CUDA graphs only, so
    called directly here) draws for sampled rows on the device, then a pass raises: the
    step falls back to the host's acceptance (None), each sampled row's generator is back
    where it was (the host then draws what the device drew), the chains it ran ahead are
    dropped and the fault counted; a fatal fault (a sticky CUDA error) is re-raised."""
    import torch

    from ninfer.engine.executor.runner import Row

    sp = make("dense").engine.speculator
    gens = [torch.Generator().manual_seed(s) for s in (3, 4)]
    sampled = SamplingParams(temperature=1.0, seed=3)
    rows = [Row([1, 2, 3], 10, 0, [], sampled, gens[0]),
            Row([1, 2, 3], 10, 1, [], greedy(8), None),
            Row([4, 5, 6], 10, 2, [], sampled, gens[1])]  # fmt: skip
    before = [g.get_state() for g in gens]
    want = [torch.rand(4, generator=g) for g in gens]
    for g, state in zip(gens, before, strict=True):
        g.set_state(state)
    message = "CUDA error: an illegal memory access" if fatal else INJECTED

    def drawing_then_raising(*args):
        for g in gens:
            torch.rand(7, generator=g)
        sp.ahead = {"lane": "a chain run ahead"}
        raise RuntimeError(message)

    monkeypatch.setattr(sp, "_bridge_ahead", drawing_then_raising)
    if fatal:
        with pytest.raises(RuntimeError, match="illegal memory access"):
            sp._contained_ahead(rows, [], [], {}, None, None, None)
        return
    assert sp._contained_ahead(rows, [], [], {}, None, None, None) is None
    assert sp.ahead == {} and sp.stats.head_faults == 1
    for g, w in zip(gens, want, strict=True):
        assert torch.equal(torch.rand(4, generator=g), w)
