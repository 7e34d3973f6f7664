"""A restart does not lose reuse (spec §5.5, §9.3): a process restarted with its
`prefix_cache_file` between requests reuses what the same process would have reused had it kept
running, for N restarts of the same prompt and of a growing conversation."""

from __future__ import annotations

import random

import pytest
import torch

from ninfer.demo import DEMO_DIR
from ninfer.llm import LLM
from ninfer.models.presets import build_random_model
from ninfer.request import SamplingParams
from ninfer.tokenizer import Tokenizer
from tests.engine.engine_helpers import TINY

# 80 tokens: the endpoint is published (64+ past the prompt-tail tap) and supersedes the tap
GREEDY = SamplingParams(max_tokens=80, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    return build_random_model(TINY, torch.float32, "cpu", seed=1)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_dir(DEMO_DIR)


def _llm(model, tok, path=None) -> LLM:
    return LLM.from_model(
        model,
        tokenizer=tok,
        chat_template=None,
        device="cpu",
        prefill_chunk=64,
        max_concurrency=2,
        kv_capacity=4096,
        host_cache_mib=4,
        check_invariants=True,
        prefix_cache_file=path,
    )


def _uninterrupted(model, tok, prompts) -> list[tuple[int, list[int]]]:
    with _llm(model, tok) as llm:
        outs = [llm.generate({"prompt_token_ids": p}, GREEDY)[0] for p in prompts]
    return [(o.usage.cached_tokens, o.token_ids) for o in outs]


def _restarted(model, tok, path, prompts) -> list[tuple[int, list[int]]]:
    got = []
    for p in prompts:
        with _llm(model, tok, path) as llm:  # saved at close, loaded by the next one
            o = llm.generate({"prompt_token_ids": p}, GREEDY)[0]
        got.append((o.usage.cached_tokens, o.token_ids))
    return got


def test_restarts_of_the_same_prompt_keep_the_reuse(model, tok, tmp_path):
    rng = random.Random(11)
    prompt = [rng.randrange(4, 2500) for _ in range(800)]
    prompts = [prompt] * 5
    same = _uninterrupted(model, tok, prompts)
    assert [c for c, _ in same][1:] == [768] * 4  # the prompt-tail tap serves every retry
    assert _restarted(model, tok, tmp_path / "cache.bin", prompts) == same


def test_restarts_of_a_growing_conversation_keep_the_reuse(model, tok, tmp_path):
    rng = random.Random(12)
    # each turn echoes the previous reply (reply tokens come from an uninterrupted run) and
    # adds a new message; every other turn retries the previous prompt
    first = [rng.randrange(4, 2500) for _ in range(300)]
    prompts, prompt = [], first
    with _llm(model, tok) as llm:
        for _ in range(4):
            prompts += [prompt, prompt]
            reply = llm.generate({"prompt_token_ids": prompt}, GREEDY)[0].token_ids
            prompt = prompt + reply + [rng.randrange(4, 2500) for _ in range(90)]
    same = _uninterrupted(model, tok, prompts)
    assert all(c > 0 for c, _ in same[1:])
    assert _restarted(model, tok, tmp_path / "cache.bin", prompts) == same
