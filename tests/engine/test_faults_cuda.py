"""Fault containment on CUDA (the CPU suite's injections, tests/engine/test_faults.py, with real
streams, events and CUDA graphs): a raising copy on the restore stream and on the transfer
stream part-way through a batch, a raising forward outside graph replay (eager prefill) and
inside it (the decode graph replayed, then the step raises). Faulted lanes fail with the
injected error, the others complete, the engine serves again, invariants hold and nothing stays
pinned. Skipped without CUDA or without flashinfer / fla / triton.

bf16 outputs depend on batch composition near ties, so the survivors are compared with a cold
run by "equal tokens, or a first difference where the cold run's top-2 logprobs are within
0.05", as tests/engine/test_engine_host_cuda.py does.
"""

from __future__ import annotations

import random

import pytest
import torch
from engine_helpers import CUDA_TINY, assert_idle, rand_tokens

from ninfer.llm import LLM
from ninfer.models.presets import build_random_model
from ninfer.request import SamplingParams

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
for _mod in ("triton", "flashinfer", "fla"):
    pytest.importorskip(_mod)

INJECTED = "injected fault"
N = 8
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, logprobs=2, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    return build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=41)


def _llm(model, **kw) -> LLM:
    opts = dict(
        device="cuda", max_concurrency=N, kv_capacity=64 * 64, host_cache_mib=64,
        device_snapshot_slots=4, prefill_chunk=128, check_invariants=True,
    )  # fmt: skip
    opts.update(kw)
    return LLM.from_model(model, **opts)


def _prompts(seed: int, n: int = N) -> list[list[int]]:
    rng = random.Random(seed)
    return [rand_tokens(rng, rng.randrange(40, 300)) for _ in range(n)]


def _close_enough(out, cold) -> bool:
    if out.token_ids == cold.token_ids:
        return True
    pairs = zip(out.token_ids, cold.token_ids, strict=True)
    k = next(i for i, (a, b) in enumerate(pairs) if a != b)
    top = sorted(cold.logprobs[k].values(), reverse=True)
    return len(top) >= 2 and top[0] - top[1] < 0.05


def _check(llm, model, prompts, outs, may_fail) -> list[int]:
    cold_llm = _llm(model, prefix_reuse=False, host_cache_mib=0, max_concurrency=1)
    failed = []
    for i, (p, out) in enumerate(zip(prompts, outs, strict=True)):
        if out.finish_reason == "error":
            assert may_fail and INJECTED in out.error, out.error
            failed.append(i)
            continue
        assert out.finish_reason == "length" and len(out.token_ids) == PARAMS.max_tokens
        cold = cold_llm.generate([{"prompt_token_ids": p}], PARAMS)[0]
        assert _close_enough(out, cold), f"request {i} differs from a cold run"
    cold_llm.close()
    return failed


def _serves_again(llm):
    outs = llm.generate([{"prompt_token_ids": p} for p in _prompts(99, 3)], PARAMS)
    assert all(o.finish_reason == "length" for o in outs)
    llm.settle()
    assert_idle(llm)


def _generate(llm, prompts):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS)


@pytest.mark.parametrize("where", ["eager", "graph"])
def test_cuda_raising_forward_fails_its_step(model, where):
    llm = _llm(model)
    runner = llm.engine.runner
    assert runner.graphs is not None, "decode graphs were not captured"
    state = {"n": 0, "hit": 0}
    if where == "graph":
        real = runner.graphs.run

        def run(rows, fed=None):
            out = real(rows, fed)  # the replay is queued: the step raises after it
            state["n"] += 1
            if state["n"] == 5:
                state["hit"] += 1
                raise RuntimeError(INJECTED)
            return out

        runner.graphs.run = run
    else:
        real = runner.forward

        def forward(rows, feed=None):
            if not runner.graphs.can_run(rows):  # a prefill or mixed step: eager
                state["n"] += 1
                if state["n"] == 3:
                    state["hit"] += 1
                    raise RuntimeError(INJECTED)
            return real(rows, feed)

        runner.forward = forward
    prompts = _prompts(1, N + 4)
    outs = _generate(llm, prompts)
    assert state["hit"] == 1
    failed = _check(llm, model, prompts, outs, may_fail=True)
    assert 0 < len(failed) < len(prompts)
    if where == "graph":
        runner.graphs.run = real
    else:
        runner.forward = real
    _serves_again(llm)
    llm.close()


def _first_round(llm, seed):
    """Requests whose prefixes then leave the Device; the follow-ups restore them from the
    Host tier."""
    prompts = _prompts(seed)
    first = _generate(llm, prompts)
    rng = random.Random(seed + 1)
    for _ in range(12):
        _generate(llm, [rand_tokens(rng, 300)])
    return [p + o.token_ids + [5, 6, 7] for p, o in zip(prompts, first, strict=True)]


@pytest.mark.parametrize("copy", ["restore", "write"])
def test_cuda_raising_copy_mid_batch_degrades(model, copy):
    llm = _llm(model, kv_capacity=40 * 64)
    follow = _first_round(llm, 2) if copy == "restore" else _prompts(3)
    inner = llm.engine.kv_state.transfer.inner  # memory.transfer.HostTransfer
    method = "restore" if copy == "restore" else "write_through"
    real_views, real_issue = inner._views, getattr(inner, method)
    state = {"in": False, "n": 0, "hit": 0}

    def issue(*args, **kwargs):
        state["in"] = True
        try:
            return real_issue(*args, **kwargs)
        finally:
            state["in"] = False

    def views(c):
        if state["in"]:
            state["n"] += 1
            if state["n"] == 3:  # part-way: two copies of the batch are already queued
                state["hit"] += 1
                raise RuntimeError(INJECTED)
        return real_views(c)

    inner._views = views
    setattr(inner, method, issue)
    outs = _generate(llm, follow)
    assert state["hit"] == 1, "the injected copy never ran: the test does not test"
    failed = _check(llm, model, follow, outs, may_fail=False)
    assert not failed
    assert llm.cache_stats().host_faults == 1
    _serves_again(llm)
    llm.close()


def test_cuda_sampling_fault_rewinds_seeded_neighbours(model):
    """A batch sampling fault is retried row by row from each seeded CUDA generator's state
    before the step (runner.sample_rows: get_state / set_state): the injected fault strikes after
    the real sampler has drawn for the whole batch, every row is then sampled alone, and each
    draws what it draws in the same run without the fault. No row fails, so both runs keep the
    same batches and the tokens are equal, not merely close. Without the rewind every generator
    has already advanced by the batch draw and the retry draws from a later state."""
    n, fault_at = 4, 3  # the third sampling call that holds all four rows
    prompts = _prompts(5, n)
    params = [
        SamplingParams(max_tokens=10, temperature=1.0, seed=100 + i, ignore_eos=True)
        for i in range(n)
    ]

    def run(inject):
        llm = _llm(model, max_concurrency=n, prefix_reuse=False, host_cache_mib=0)
        runner = llm.engine.runner
        real = runner.sampler
        state = {"full": 0, "fired": False}

        def sampler(logits, ps, gens):
            out = real(logits, ps, gens)  # every row's generator has drawn
            if inject and not state["fired"] and len(ps) == n:
                state["full"] += 1
                if state["full"] == fault_at:
                    state["fired"] = True
                    raise RuntimeError(INJECTED)
            return out

        runner.sampler = sampler
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        runner.sampler = real
        llm.settle()
        assert_idle(llm)
        llm.close()
        return outs, state["fired"]

    want, _ = run(inject=False)
    outs, fired = run(inject=True)
    assert fired, "the fault never struck a full batch: the test does not test"
    for i, (out, ref) in enumerate(zip(outs, want, strict=True)):
        assert out.finish_reason == "length", (i, out.finish_reason, out.error)
        assert out.token_ids == ref.token_ids, f"row {i} parted from the run without the fault"
