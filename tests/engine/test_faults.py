"""Fault containment: cancellation from any thread, and injected faults at every fault point
(sampler, model forward, Device->Host and Host->Device copies, Host slab allocation,
tokenizer.decode) with concurrent requests in flight. A fault fails the lanes it hit with a clear
error; every other request finishes with the tokens of a cold run; the engine keeps serving and
the cache's invariants hold, with pages and pins back to baseline."""

from __future__ import annotations

import random
import threading
import time

import pytest
from engine_helpers import assert_idle, greedy, rand_tokens

from ninfer.request import EngineError, RequestOutput, SamplingParams, StreamDelta


def _wait_live(llm, n: int, timeout: float = 30.0) -> list[str]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        ids = llm.live_request_ids()
        if len(ids) >= n:
            return ids
        time.sleep(0.005)
    raise AssertionError(f"{n} requests never became live")


# ---- cancellation -----------------------------------------------------------------------------


def test_cancel_by_id_from_another_thread(make_llm):
    llm = make_llm()
    long = SamplingParams(max_tokens=3000, temperature=0.0, ignore_eos=True)
    prompts = [rand_tokens(random.Random(i), 40) for i in range(3)]
    outs: list[list[RequestOutput]] = []
    worker = threading.Thread(target=lambda: outs.append(llm.generate(prompts, long)))
    worker.start()
    ids = _wait_live(llm, 3)
    assert llm.cancel(ids[1]) is True
    time.sleep(0.05)
    for rid in ids[::2]:
        llm.cancel(rid)
    worker.join(60)
    assert not worker.is_alive()
    assert [o.finish_reason for o in outs[0]] == ["abort"] * 3
    assert all(len(o.token_ids) < 3000 for o in outs[0])
    assert llm.cancel(ids[0]) is False and llm.cancel("no-such-request") is False
    assert_idle(llm)
    assert llm.generate([prompts[0]], greedy(4))[0].finish_reason == "length"


def test_stream_closed_from_another_thread_ends_abort(make_llm):
    llm = make_llm()
    stream = llm.stream(rand_tokens(random.Random(7), 30), SamplingParams(
        max_tokens=3000, temperature=0.0, ignore_eos=True))  # fmt: skip
    first = next(stream)
    assert isinstance(first, StreamDelta) and first.request_id == stream.request_id
    threading.Timer(0.05, stream.close).start()
    events = list(stream)
    assert isinstance(events[-1], RequestOutput) and events[-1].finish_reason == "abort"
    assert all(isinstance(e, StreamDelta) for e in events[:-1])
    assert list(stream) == []  # ended
    stream.close()  # idempotent
    assert_idle(llm)


def test_stream_close_on_the_iterating_thread_settles_the_request(make_llm):
    llm = make_llm()
    stream = llm.stream(rand_tokens(random.Random(8), 30), SamplingParams(
        max_tokens=3000, temperature=0.0, ignore_eos=True))  # fmt: skip
    next(stream)
    stream.close()
    assert llm.cancel(stream.request_id) is False  # answered: no longer live
    assert_idle(llm)


def test_cancel_by_id_of_a_stream(make_llm):
    llm = make_llm()
    stream = llm.stream(rand_tokens(random.Random(9), 30), SamplingParams(
        max_tokens=3000, temperature=0.0, ignore_eos=True))  # fmt: skip
    assert llm.cancel(stream.request_id) is True
    *_, final = list(stream)
    assert final.finish_reason == "abort"
    assert_idle(llm)


def test_keyboard_interrupt_in_generate_cancels_its_requests(make_llm):
    llm = make_llm()
    engine = llm.engine
    real = engine.next_event
    calls = {"n": 0}

    def interrupted(job):  # Ctrl+C while generate() waits for its first output
        calls["n"] += 1
        if calls["n"] == 1:
            time.sleep(0.2)
            raise KeyboardInterrupt
        return real(job)

    engine.next_event = interrupted
    long = SamplingParams(max_tokens=3000, temperature=0.0, ignore_eos=True)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([rand_tokens(random.Random(i), 40) for i in range(3)], long)
    engine.next_event = real
    t0 = time.monotonic()
    while engine.busy():
        assert time.monotonic() - t0 < 30, "the interrupted requests kept running"
        time.sleep(0.01)
    assert_idle(llm)
    assert llm.generate([[5, 6, 7]], greedy(3))[0].finish_reason == "length"


def test_single_request_engine_fault_raises_engine_error_not_value_error(make_llm):
    llm = make_llm()
    llm.engine.on_step = _raise_once(RuntimeError("injected step fault"))
    with pytest.raises(EngineError, match="injected step fault"):
        llm.generate([5, 6, 7, 8], greedy(4))
    assert llm.generate([5, 6, 7, 8], greedy(4)).__len__() == 1  # still serving
    assert_idle(llm)


def _raise_once(exc: BaseException):
    state = {"armed": True}

    def hook(engine):
        if state["armed"] and engine.lanes:
            state["armed"] = False
            raise exc

    return hook


# ---- injected faults with 8 requests in flight --------------------------------------------------

N_LANES = 8
MAX_TOKENS = 12
INJECTED = "injected fault"


def _prompts(seed: int, n: int = N_LANES) -> list[list[int]]:
    rng = random.Random(seed)
    return [rand_tokens(rng, rng.randrange(20, 150)) for _ in range(n)]


_COLD: dict[tuple, list[int]] = {}


def _cold(make_llm, prompts: list[list[int]]) -> list[list[int]]:
    """Tokens of a cold run (no prefix cache, no faults), one request at a time."""
    missing = [p for p in prompts if tuple(p) not in _COLD]
    if missing:
        cold = make_llm(prefix_reuse=False, host_cache_mib=0, max_concurrency=1)
        for p in missing:
            _COLD[tuple(p)] = cold.generate([p], greedy(MAX_TOKENS))[0].token_ids
        cold.close()
    return [_COLD[tuple(p)] for p in prompts]


def _fault_llm(make_llm, **kwargs):
    opts = dict(max_concurrency=N_LANES, kv_capacity=64 * 64, host_cache_mib=4)
    opts.update(kwargs)
    return make_llm(**opts)


def _check(outs, cold, failed_ok) -> list[int]:
    """Every output is the cold run's tokens, or (where `failed_ok`) an error naming the
    injected fault; returns the indices that failed."""
    failed = []
    for i, (out, want) in enumerate(zip(outs, cold, strict=True)):
        if out.finish_reason == "error":
            assert failed_ok(i), f"request {i} failed: {out.error}"
            assert INJECTED in out.error and out.error.startswith("engine error: ")
            assert out.token_ids == want[: len(out.token_ids)]  # what it had was right
            failed.append(i)
        else:
            assert out.finish_reason == "length", (i, out.finish_reason, out.error)
            assert out.token_ids == want, f"request {i} differs from a cold run"
    return failed


def _still_serves(llm, make_llm, seed: int) -> None:
    fresh = _prompts(seed, 3)
    outs = llm.generate(fresh, greedy(MAX_TOKENS))
    assert [o.token_ids for o in outs] == _cold(make_llm, fresh)
    assert_idle(llm)


@pytest.mark.parametrize("mode", ["once", "repeatedly"])
def test_sampler_fault_fails_only_its_request(make_llm, mode):
    llm = _fault_llm(make_llm)
    prompts = _prompts(1)
    cold = _cold(make_llm, prompts)
    targets = {2} if mode == "once" else {2, 5}
    marks = {MAX_TOKENS + 1 + t for t in targets}  # a target's params differ in max_tokens
    engine = llm.engine
    real = engine.runner.sampler
    state = {"step": None}  # "once": the target's sampling fails in one step only

    def sampler(logits, params, generators):
        if any(p.max_tokens in marks for p in params):
            state["step"] = state["step"] or engine.steps
            if mode == "repeatedly" or engine.steps == state["step"]:
                raise RuntimeError(INJECTED)
        return real(logits, params, generators)

    llm.engine.runner.sampler = sampler
    params = [
        SamplingParams(max_tokens=MAX_TOKENS + 1 + i if i in targets else MAX_TOKENS,
                       temperature=0.0, ignore_eos=True)
        for i in range(N_LANES)
    ]  # fmt: skip
    outs = llm.generate(prompts, params)
    for i in targets:  # a target that survived ran one token longer: compare its prefix
        if outs[i].finish_reason != "error":
            outs[i].token_ids = outs[i].token_ids[:MAX_TOKENS]
    failed = _check(outs, cold, lambda i: i in targets)
    assert set(failed) == targets
    llm.engine.runner.sampler = real
    _still_serves(llm, make_llm, 101)


@pytest.mark.parametrize("mode", ["once", "repeatedly"])
def test_forward_fault_fails_the_lanes_of_that_step(make_llm, mode):
    llm = _fault_llm(make_llm)
    prompts = _prompts(2, N_LANES + 4)  # 8 in flight, 4 queued behind them
    cold = _cold(make_llm, prompts)
    runner = llm.engine.runner
    real = runner.forward
    calls = {"n": 0}
    hit: list[int] = []  # rows of the faulted steps

    def forward(rows, feed=None):
        calls["n"] += 1
        due = calls["n"] == 4 if mode == "once" else calls["n"] in (4, 9, 15)
        if due:
            hit.append(len(rows))
            raise RuntimeError(INJECTED)
        return real(rows, feed)

    runner.forward = forward
    outs = llm.generate(prompts, greedy(MAX_TOKENS))
    failed = _check(outs, cold, lambda i: True)
    assert hit and failed
    if mode == "once":
        assert len(failed) == hit[0]  # exactly the lanes of the faulted step
    assert len(failed) < len(prompts)  # the queued ones at least were served
    runner.forward = real
    assert llm.engine.faults_contained == len(failed)
    _still_serves(llm, make_llm, 102)


@pytest.mark.parametrize("mode", ["once", "repeatedly"])
def test_decode_fault_fails_one_request(make_llm, monkeypatch, mode, demo_text):
    tok, _ = demo_text
    llm = _fault_llm(make_llm)
    prompts = _prompts(3)
    targets = [4] if mode == "once" else [1, 6]
    marker = VOCAB_MARK
    for t in targets:
        prompts[t] = prompts[t] + [marker]  # in the target's detokenizer window
    cold = _cold(make_llm, prompts)
    real = tok.decode
    state = {"left": 1 if mode == "once" else 10**9}

    def decode(ids, *args, **kwargs):
        if state["left"] and marker in ids:
            state["left"] -= 1
            raise RuntimeError(INJECTED)
        return real(ids, *args, **kwargs)

    monkeypatch.setattr(tok, "decode", decode)
    outs = llm.generate(prompts, greedy(MAX_TOKENS))
    failed = _check(outs, cold, lambda i: i in targets)
    assert failed == targets
    monkeypatch.setattr(tok, "decode", real)
    _still_serves(llm, make_llm, 103)


def test_a_request_whose_state_cannot_be_built_fails_alone(make_llm):
    llm = _fault_llm(make_llm)
    prompts = _prompts(8)
    cold = _cold(make_llm, prompts)
    engine = llm.engine
    real = engine.make_gen

    def make_gen(seed, device):  # the target alone samples with seed 4242
        if seed == 4242:
            raise RuntimeError(INJECTED)
        return real(seed, device)

    engine.make_gen = make_gen
    params = [greedy(MAX_TOKENS) for _ in prompts]
    params[3] = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.5, seed=4242)
    outs = llm.generate(prompts, params)
    assert outs[3].finish_reason == "error" and INJECTED in outs[3].error
    assert _check(outs, cold, lambda i: i == 3) == [3]
    engine.make_gen = real
    _still_serves(llm, make_llm, 108)


VOCAB_MARK = 2400  # outside rand_tokens' range: only a target's prompt holds it


def _host_copies_equal_cold(make_llm, llm, seed: int) -> None:
    """Requests over the earlier prompts' prefixes (their cache state whatever the faults left)
    still give the cold run's tokens."""
    again = _prompts(seed)
    outs = llm.generate(again, greedy(MAX_TOKENS))
    assert [o.token_ids for o in outs] == _cold(make_llm, again)


@pytest.mark.parametrize("mode", ["once", "repeatedly"])
def test_device_to_host_copy_fault_degrades_to_device_only(make_llm, mode):
    llm = _fault_llm(make_llm)
    inner = llm.engine.kv_state.transfer.inner  # memory.transfer.HostTransfer
    real = inner.write_through
    state = {"left": 1 if mode == "once" else 10**9}

    def write_through(*args, **kwargs):
        if state["left"]:
            state["left"] -= 1
            raise RuntimeError(INJECTED)
        return real(*args, **kwargs)

    inner.write_through = write_through
    prompts = _prompts(4)
    outs = llm.generate(prompts, greedy(MAX_TOKENS))
    assert [o.token_ids for o in outs] == _cold(make_llm, prompts)  # nobody failed
    stats = llm.cache_stats()
    assert stats.host_faults >= 1 and (mode == "once") == (stats.host_faults == 1)
    _host_copies_equal_cold(make_llm, llm, 4)
    inner.write_through = real
    _host_copies_equal_cold(make_llm, llm, 4)
    _still_serves(llm, make_llm, 104)


def test_host_slab_allocation_fault_degrades_to_device_only(make_llm, monkeypatch):
    from ninfer.cache.host_pool import HostSlabPool

    llm = _fault_llm(make_llm)
    real = HostSlabPool.allocate
    state = {"n": 0}

    def allocate(self, k):
        state["n"] += 1
        if state["n"] % 2:  # every other allocation raises
            raise RuntimeError(INJECTED)
        return real(self, k)

    monkeypatch.setattr(HostSlabPool, "allocate", allocate)
    prompts = _prompts(5)
    outs = llm.generate(prompts, greedy(MAX_TOKENS))
    assert [o.token_ids for o in outs] == _cold(make_llm, prompts)
    assert llm.cache_stats().host_faults >= 1
    _host_copies_equal_cold(make_llm, llm, 5)
    monkeypatch.setattr(HostSlabPool, "allocate", real)
    _still_serves(llm, make_llm, 105)


@pytest.mark.parametrize("mode", ["once", "repeatedly"])
def test_host_to_device_copy_fault_recomputes(make_llm, mode):
    # a small Device pool, so that the first round's prefixes live on the Host only
    llm = _fault_llm(make_llm, kv_capacity=40 * 64, device_snapshot_slots=2)
    prompts = _prompts(6)
    first = llm.generate(prompts, greedy(MAX_TOKENS))
    for p in _prompts(60, 16):  # push the first round off the Device
        llm.generate([p], greedy(4))
    follow = [p + o.token_ids + [5, 6, 7] for p, o in zip(prompts, first, strict=True)]
    inner = llm.engine.kv_state.transfer.inner
    real = inner.restore
    state = {"left": 1 if mode == "once" else 10**9, "hit": 0}

    def restore(*args, **kwargs):
        if state["left"]:
            state["left"] -= 1
            state["hit"] += 1
            raise RuntimeError(INJECTED)
        return real(*args, **kwargs)

    inner.restore = restore
    outs = llm.generate(follow, greedy(MAX_TOKENS))
    assert state["hit"] >= 1, "no Host restore happened: the test does not test"
    assert [o.token_ids for o in outs] == _cold(make_llm, follow)
    assert llm.cache_stats().host_faults == state["hit"]
    inner.restore = real
    _still_serves(llm, make_llm, 106)


# ---- faults that end the engine -----------------------------------------------------------------


def test_a_poisoning_cuda_error_ends_the_engine_with_its_text(make_llm):
    llm = _fault_llm(make_llm)
    text = "CUDA error: an illegal memory access was encountered"
    runner = llm.engine.runner
    real = runner.forward
    calls = {"n": 0}

    def forward(rows, feed=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError(text)
        return real(rows, feed)

    runner.forward = forward
    prompts = _prompts(7, N_LANES + 4)  # some still queued when the engine ends
    outs = llm.generate(prompts, greedy(MAX_TOKENS))
    assert all(o.finish_reason == "error" and text in o.error for o in outs)
    with pytest.raises(EngineError, match="illegal memory access"):
        llm.generate([5, 6, 7], greedy(2))
    with pytest.raises(EngineError, match="illegal memory access"):
        llm.cache_stats()
