"""Shared fixtures of the engine tests: a tiny random Qwen3.5 model on the CPU (fp32), an
engine factory with invariant checks after every step, and an engine-independent greedy oracle.
"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import TINY, TINY_MOE

from ninfer.llm import LLM
from ninfer.models.presets import build_random_model


@pytest.fixture(scope="session")
def tiny_model():
    return build_random_model(TINY, torch.float32, "cpu", seed=1)


@pytest.fixture(scope="module")
def mtp_models():
    """Tiny dense and MoE models with a random MTP head (fp32, CPU), one pair per test module
    (a test may quantise a head in place)."""
    return {
        "dense": build_random_model(TINY, torch.float32, "cpu", seed=1, mtp=True),
        "moe": build_random_model(TINY_MOE, torch.float32, "cpu", seed=2, mtp=True),
    }


@pytest.fixture(scope="session")
def demo_text():
    """(tokenizer, chat template) of the demo model (its vocabulary matches TINY's)."""
    from ninfer.chat_template import ChatTemplate
    from ninfer.demo import DEMO_DIR
    from ninfer.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DEMO_DIR)
    return tok, ChatTemplate(tok)


@pytest.fixture
def make_llm(tiny_model, demo_text):
    """make_llm(**kwargs) -> LLM over the tiny model (demo tokenizer); closed at teardown."""
    made: list[LLM] = []

    def factory(**kwargs) -> LLM:
        opts = dict(
            device="cpu",
            prefill_chunk=64,
            max_concurrency=4,
            kv_capacity=16384,
            host_cache_mib=16,  # every engine test runs with a (small) Host tier
            check_invariants=True,
        )
        opts.update(kwargs)
        tok, template = demo_text
        llm = LLM.from_model(tiny_model, tokenizer=tok, chat_template=template, **opts)
        made.append(llm)
        return llm

    yield factory
    for llm in made:
        llm.close()
