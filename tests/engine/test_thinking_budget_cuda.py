"""GPU test of the thinking budget (`SamplingParams.thinking_token_budget`) on CUDA with decode
graphs and the overlapped decode on: budgeted, grammar-bound and free lanes share steps that
replay captured graphs; each budgeted reply closes its open `<think>` block exactly on budget
(random weights do not close it themselves), so the forcing is exact when the step is launched
before the previous token is read. The model has the engine's real kernel shapes and the demo
tokenizer's vocabulary. Skipped without CUDA or without flashinfer / fla / triton / xgrammar.
"""

from __future__ import annotations

import random

import pytest
import torch
from engine_helpers import CUDA_TINY, assert_idle, rand_tokens

from ninfer.demo import DEMO_DIR
from ninfer.llm import LLM
from ninfer.models.presets import build_random_model
from ninfer.request import SamplingParams, StructuredOutputsParams
from ninfer.tokenizer import Tokenizer

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
for _mod in ("triton", "flashinfer", "fla", "xgrammar"):
    pytest.importorskip(_mod)


@pytest.fixture(scope="module")
def llm():
    model = build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=43)
    llm = LLM.from_model(
        model, Tokenizer.from_dir(DEMO_DIR), device="cuda", max_concurrency=8,
        kv_capacity=128 * 64, host_cache_mib=0, prefill_chunk=128, check_invariants=True,
    )  # fmt: skip
    yield llm
    llm.close()


def test_budgets_are_exact_on_graph_steps(llm):
    assert llm.engine_config.ops.cuda_graphs and llm.engine.runner.graphs is not None
    tok = llm.tokenizer
    think, close = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    rng = random.Random(5)
    prompts = [
        {"prompt_token_ids": [*rand_tokens(rng, 30 + 7 * i), think]} for i in range(8)
    ]  # each prompt leaves a block open
    budgets = [0, 1, 2, 7, 20, 33, None, 12]
    choice = StructuredOutputsParams(choice=["yes", "no"])
    params = [
        SamplingParams(
            max_tokens=48,
            temperature=0.0 if i % 2 else 1.0,
            seed=i,
            ignore_eos=True,
            thinking_token_budget=b,
            structured_outputs=choice if i == 7 else None,
        )
        for i, b in enumerate(budgets)
    ]
    replays, overlapped = llm.engine.runner.graphs.replays, llm.engine.overlapped_steps
    outs = llm.generate(prompts, params)
    assert llm.engine.runner.graphs.replays > replays
    assert llm.engine.overlapped_steps > overlapped
    for out, b in zip(outs, budgets, strict=True):
        assert out.finish_reason in ("stop", "length"), out.error
        if b is None:
            continue
        first = out.token_ids.index(close) if close in out.token_ids else len(out.token_ids)
        assert first <= b and close in out.token_ids[: b + 1]
    assert_idle(llm)
