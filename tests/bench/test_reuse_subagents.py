"""The documented sub-agents trace of `ninfer bench reuse` (4 sub-agents x 3 turns over one
2000-token raw-token preamble, arriving one after another) on the CPU: the engine reuses at
least 0.95 of the theoretical bound. The second sub-agent resumes at the forward-ladder rung
1024 of the first one's cold prefill (`cache.taps`), the third and fourth at the fork tap."""

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
def test_sub_agents_reuse_at_least_095_of_the_bound():
    tok = Tokenizer.from_dir(DEMO_DIR)
    template = ChatTemplate(tok)
    model = build_random_model(TINY, torch.float32, "cpu", seed=1)

    def make_llm() -> LLM:
        return LLM.from_model(
            model, tokenizer=tok, chat_template=template, device="cpu", kv_capacity=16384,
            host_cache_mib=64, check_invariants=True,
        )  # fmt: skip

    r = bench_reuse(make_llm, VOCAB, seed=0, scale=1.0, traces=("subagents",))
    (row,) = r["rows"]
    assert row["requests"] == 12
    assert row["ratio"] >= 0.95, row
