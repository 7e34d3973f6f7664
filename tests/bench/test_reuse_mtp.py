"""`ninfer bench reuse` with MTP speculation on (the CPU, tiny model with a random head, demo
tokenizer and chat template), against the same traces with it off. Its own module, so that the
test runner can place it beside the other bench tests (it replays every trace three times)."""

from __future__ import annotations

import pytest
import torch

from ninfer.bench.reuse import TRACE_NAMES, bench_reuse
from ninfer.chat_template import ChatTemplate
from ninfer.demo import DEMO_DIR
from ninfer.llm import LLM
from ninfer.models.presets import build_random_model
from ninfer.tokenizer import Tokenizer
from tests.engine.engine_helpers import TINY, VOCAB


@pytest.mark.slow
def test_reuse_with_mtp_equals_reuse_without():
    """The traces of `bench reuse` reuse exactly as many tokens with MTP on (K = 3) as with it
    off: with the random head nearly every draft is rejected and rolled back, and none of those
    columns enters the tree, shifts an endpoint or costs a hit (the edit, retry and no-reply
    traces); with a controlled acceptance of 0.7 (runs of accepted drafts, the output then
    the drafts', other tokens than plain decode's) the traces of raw tokens, re-rendered
    chats and forks reuse the same fraction of what they could as without MTP. Every trace
    runs under one of the two."""
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
    accepting = ("agent", "chat", "subagents")
    rejected = tuple(t for t in TRACE_NAMES if t not in accepting)

    def run(traces, control=None, **kwargs):  # a trace's seed is its place in `traces`
        rows = bench_reuse(factory(control, **kwargs), VOCAB, seed=0, scale=scale, traces=traces)
        return rows["rows"]

    plain, mtp = run(rejected), run(rejected, **spec)
    assert [(x["trace"], x["reused"], x["theoretical"]) for x in mtp] == [
        (x["trace"], x["reused"], x["theoretical"]) for x in plain
    ]
    plain, accepted = run(accepting), run(accepting, controlled_acceptance(0.7), **spec)
    for a, p in zip(accepted, plain, strict=True):
        assert a["trace"] == p["trace"] and abs(a["ratio"] - p["ratio"]) <= 0.01, (a, p)
