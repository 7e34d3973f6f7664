"""GPU test of structured outputs (issue 39, item 1) on CUDA with decode graphs and the
overlapped decode on: constrained and free lanes share steps that replay captured graphs (the
mask computed on the host while the step in flight runs); every constrained reply that finishes
validates against its schema, and a free lane's tokens are those of its run alone (bf16: equal
up to the alone run's first near tie, batch shapes move logits). The model has the engine's
real kernel shapes and the demo tokenizer's vocabulary. Skipped without CUDA or without
flashinfer / fla / triton / xgrammar.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from engine_helpers import CUDA_TINY, assert_idle, rand_tokens

from ninfer.bench.schemas import SCHEMAS
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
jsonschema = pytest.importorskip("jsonschema")

NEAR_TIE = 0.05  # nats between the alone run's top two candidates


@pytest.fixture(scope="module")
def llm():
    model = build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=41)
    llm = LLM.from_model(
        model, Tokenizer.from_dir(DEMO_DIR), device="cuda", max_concurrency=8,
        kv_capacity=128 * 64, host_cache_mib=0, prefill_chunk=128, check_invariants=True,
    )  # fmt: skip
    yield llm
    llm.close()


def _agree(got: list[int], alone) -> None:
    for i, (g, lp) in enumerate(zip(got, alone.logprobs, strict=True)):
        top = sorted(lp.values(), reverse=True)
        if len(top) > 1 and top[0] - top[1] < NEAR_TIE:
            return
        assert g == alone.token_ids[i], f"token {i}: {g} != {alone.token_ids[i]}"


def test_constrained_and_free_lanes_share_graph_steps(llm):
    assert llm.engine_config.ops.cuda_graphs and llm.engine.runner.graphs is not None
    rng = random.Random(3)
    prompts = [{"prompt_token_ids": rand_tokens(rng, 40 + 9 * i)} for i in range(8)]
    schemas = [SCHEMAS[i] for i in (0, 2, 3, 7)]
    bound = [
        SamplingParams(max_tokens=160, seed=i, structured_outputs=StructuredOutputsParams(json=s))
        for i, s in enumerate(schemas)
    ]
    free = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=2)
    replays, overlapped = llm.engine.runner.graphs.replays, llm.engine.overlapped_steps
    outs = llm.generate(prompts, [*bound, *[free] * 4])
    assert llm.engine.runner.graphs.replays > replays
    assert llm.engine.overlapped_steps > overlapped
    stopped = 0
    for out, schema in zip(outs[:4], schemas, strict=True):
        assert out.finish_reason in ("stop", "length"), out.error
        if out.finish_reason == "stop":
            stopped += 1
            jsonschema.validate(json.loads(out.text), schema)
    assert stopped
    for got, prompt in zip(outs[4:], prompts[4:], strict=True):
        assert got.finish_reason == "length"
        _agree(got.token_ids, llm.generate([prompt], free)[0])
    assert_idle(llm)
