"""`ninfer bench reuse` with MTP speculation on (the CPU, tiny model with a random head, demo
tokenizer and chat template), against the same traces with it off. Its own module, so that the
test runner can place it beside the other bench tests (it replays every trace three times)."""

from __future__ import annotations

import pytest
import torch

from ninfer.bench.reuse import bench_reuse
from ninfer.chat_template import ChatTemplate
from ninfer.demo import DEMO_DIR
from ninfer.llm import LLM
from ninfer.models.presets import build_random_model
from ninfer.tokenizer import Tokenizer
from tests.engine.engine_helpers import TINY, VOCAB


@pytest.mark.slow
def test_reuse_with_mtp_equals_reuse_without():
    """Every trace of `bench reuse` reuses exactly as many tokens with MTP on (K = 3) as with it
    off: with the random head nearly every draft is rejected and rolled back, and none of those
    columns enters the tree, shifts an endpoint or costs a hit; with a controlled acceptance of
    0.7 (runs of accepted drafts, the output then the drafts', other tokens than plain
    decode's) every trace reuses the same fraction of what it could as without MTP."""
    from ninfer.bench.speculative import controlled_acceptance

    tok = Tokenizer.from_dir(DEMO_DIR)
    template = ChatTemplate(tok)
    model = build_random_model(TINY, torch.float32, "cpu", seed=1, mtp=True)

    def factory(control=None, **kwargs):
        def make() -> LLM:
            llm = LLM.from_model(model, tokenizer=tok, chat_template=template, device="cpu",
                                 kv_capacity=16384, host_cache_mib=64, check_invariants=True,
                                 **kwargs)  # fmt: skip
            if control is not None:
                llm.engine.speculator.control = control
            return llm

        return make

    spec = {"speculative": "mtp", "num_speculative_tokens": 3}
    scale = 0.15
    plain = bench_reuse(factory(), VOCAB, seed=0, scale=scale)["rows"]
    mtp = bench_reuse(factory(**spec), VOCAB, seed=0, scale=scale)["rows"]
    assert [(x["trace"], x["reused"], x["theoretical"]) for x in mtp] == [
        (x["trace"], x["reused"], x["theoretical"]) for x in plain
    ]
    accepted = bench_reuse(factory(controlled_acceptance(0.7), **spec), VOCAB, seed=0,
                           scale=scale)["rows"]  # fmt: skip
    for a, p in zip(accepted, plain, strict=True):
        assert a["trace"] == p["trace"] and abs(a["ratio"] - p["ratio"]) <= 0.01, (a, p)
