"""In-flight prefix coalescing (spec §12.2, `concurrent_prefill=True`) through the engine:
requests sharing a new prefix wait for the first one's snapshot at the divergence instead of
prefilling the prefix again; requests that share nothing are not delayed (measured in engine
steps, so the comparison is deterministic)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from engine_helpers import TINY, assert_idle, greedy, rand_tokens

from ninfer.cache.cost import CacheCostModel
from ninfer.engine.kv.coalesce import wait_for_sibling
from ninfer.llm import LLM
from ninfer.models.presets import build_random_model

SHARED, SUFFIX = 4096, 50


@pytest.fixture(scope="module")
def long_model():
    """The tiny model with room for 4k-token prompts plus their suffix."""
    return build_random_model(
        dataclasses.replace(TINY, max_position_embeddings=8192), torch.float32, "cpu", seed=1
    )


@pytest.fixture
def make_llm(long_model, demo_text):
    made: list[LLM] = []

    def factory(**kwargs) -> LLM:
        tok, template = demo_text
        llm = LLM.from_model(
            long_model,
            tokenizer=tok,
            chat_template=template,
            device="cpu",
            host_cache_mib=16,
            check_invariants=True,
            **kwargs,
        )
        made.append(llm)
        return llm

    yield factory
    for llm in made:
        llm.close()


def _trace(make_llm, **kwargs):
    """other_first, 8 requests sharing a new 4k-token prefix, other_last, all submitted
    together. Returns (outputs, stats, first-token step per request index, admission order)."""
    rng = random.Random(31)
    shared = rand_tokens(rng, SHARED)
    prompts = [rand_tokens(rng, 300)]
    prompts += [shared + rand_tokens(rng, SUFFIX) for _ in range(8)]
    prompts.append(rand_tokens(rng, 200))
    llm = make_llm(
        max_concurrency=8,
        concurrent_prefill=True,
        prefill_chunk=512,
        kv_capacity=1024 * 64,
        **kwargs,
    )
    ids = {}  # request_id -> prompt index, in admission order
    first_token: dict[str, int] = {}

    def on_step(engine):
        for lane in engine.lanes:
            rid = lane.request.request_id
            ids.setdefault(rid, len(ids))
            if len(lane.tokens) > lane.prompt_len:
                first_token.setdefault(rid, engine.steps)

    llm.engine.on_step = on_step
    outs = llm.generate(prompts, greedy(4))
    by_index = {o.request_id: i for i, o in enumerate(outs)}
    order = [by_index[rid] for rid in sorted(ids, key=ids.get)]
    steps = [first_token[o.request_id] for o in outs]
    stats = llm.cache_stats()
    assert_idle(llm)
    return prompts, outs, stats, steps, order


def test_shared_new_prefix_is_prefilled_once(make_llm):
    prompts, outs, stats, steps, order = _trace(make_llm)
    _, base_outs, base, base_steps, base_order = _trace(make_llm, pending_timeout_s=0)
    others = len(prompts[0]) + len(prompts[-1])
    # coalesced: the first sharer prefills the prefix, the other 7 resume from its Boundary
    # snapshot at 4096 and prefill only their own 50 tokens
    assert stats.prefill_tokens == others + SHARED + SUFFIX + 7 * SUFFIX
    assert [o.usage.cached_tokens for o in outs[1:9]] == [0] + [SHARED] * 7
    assert stats.coalesced_waits == 1 and base.coalesced_waits == 0  # only the head waits
    # without coalescing every sharer prefills the whole prefix (7 are admitted at once; the
    # 8th takes the lane other_first frees, before any sharer has published the prefix) but
    # for the 8th, which resumes at a sharer's forward-ladder rung 1024 (`cache.taps`),
    # taken inside the pass that covered it (`scheduler.InPass`)
    assert [o.usage.cached_tokens for o in base_outs[1:9]] == [0] * 7 + [1024]
    assert base.prefill_tokens == others + 8 * (SHARED + SUFFIX) - 1024
    assert [o.token_ids for o in outs] == [o.token_ids for o in base_outs]
    # no TTFT regression for the requests that share nothing: FIFO admission order is the
    # same, and their first tokens come no later (in engine steps) than without coalescing
    assert order == base_order == list(range(10))
    assert steps[0] <= base_steps[0] and steps[-1] <= base_steps[-1]
    assert max(steps[1:9]) <= max(base_steps[1:9])


class _Blocks:
    vision_spans = ()

    def __init__(self, hashes):
        self.hashes = hashes


def _lane(hashes, computed, prompt_len):
    from ninfer.engine.kv.lane import KVLane
    from ninfer.engine.request import PromptHints, Request

    job = Request("sib", [0] * prompt_len, greedy(1), PromptHints(), sink=None)
    job.blocks = _Blocks(hashes)
    return KVLane(job, 1, 0, prompt_len, computed)


def _head(hashes, n):
    from ninfer.engine.request import PromptHints, Request

    job = Request("head", [0] * n, greedy(1), PromptHints(), sink=None)
    job.blocks = _Blocks(hashes)
    return job


def test_wait_is_time_bounded():
    cost = CacheCostModel.cpu(512)  # 2 ms per token: 4096 tokens ~ 8.4 s of prefill
    head = _head(list(range(64)) + [-1], 4200)
    sib = _lane(list(range(64)) + [-2], 0, 4200)
    # twice the sibling's predicted prefill up to 4096 (~16.8 s) must fit half the timeout
    assert not wait_for_sibling(head, 0, [sib], cost, timeout_s=30.0)
    assert sib.taps == []
    assert wait_for_sibling(head, 0, [sib], cost, timeout_s=40.0)
    assert sib.taps == [(4096, True)] and 4096 in sib.boundary_taps
    sib.computed = 4000  # nearly there: a short timeout suffices
    assert wait_for_sibling(head, 0, [sib], cost, timeout_s=1.0)
    assert not wait_for_sibling(head, 0, [sib], cost, timeout_s=0)  # 0 disables coalescing


def test_wait_only_when_the_saved_prefill_exceeds_the_split():
    cost = CacheCostModel(1e-6, 0.0, 1.0, 512, 1e9, 0.0)  # a chunk split costs 1 s
    head = _head([1, 2, 3, -1], 300)
    sib = _lane([1, 2, 3, -2], 0, 300)
    assert not wait_for_sibling(head, 0, [sib], cost, timeout_s=60.0)  # saves 192 tokens < 1 s
    sib.taps = [(192, True)]  # already an exact tap there: no split, so waiting pays
    assert wait_for_sibling(head, 0, [sib], cost, timeout_s=60.0)
