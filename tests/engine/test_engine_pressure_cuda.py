"""GPU test of suspension under page pressure (spec §9.5) with CUDA graphs and overlapped
decode: two lanes outgrow a small pool, one is suspended through its endpoint snapshot and
resumed, and both end at max_tokens with the tokens of a solo run (bf16: equal up to the first
near tie of the solo run). Skipped without CUDA or without flashinfer / fla / triton.
"""

from __future__ import annotations

import random

import pytest
import torch
from engine_helpers import CUDA_TINY, assert_idle, rand_tokens

from ninfer.engine.kv import pages
from ninfer.llm import LLM
from ninfer.models.presets import build_random_model
from ninfer.request import SamplingParams

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
for _mod in ("triton", "flashinfer", "fla"):
    pytest.importorskip(_mod)

NEAR_TIE = 0.05  # nats between the solo run's top two candidates


@pytest.fixture(scope="module")
def model():
    return build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=31)


def _agree(got: list[int], solo) -> None:
    """Equal tokens up to the solo run's first near tie (bf16 batch shapes move logits)."""
    for i, (g, lp) in enumerate(zip(got, solo.logprobs, strict=True)):
        top = sorted(lp.values(), reverse=True)
        if len(top) > 1 and top[0] - top[1] < NEAR_TIE:
            return
        assert g == solo.token_ids[i], f"token {i}: {g} != {solo.token_ids[i]}"


@pytest.mark.parametrize("host", [0, 64])
def test_cuda_suspension_never_cuts_short(model, monkeypatch, host):
    monkeypatch.setattr(pages, "OUTPUT_WINDOW", 64)
    rng = random.Random(5)
    prompts = [rand_tokens(rng, 100), rand_tokens(rng, 130)]
    params = SamplingParams(temperature=0.0, max_tokens=300, logprobs=2, ignore_eos=True)
    llm = LLM.from_model(
        model, device="cuda", max_concurrency=2, kv_capacity=9 * 64, host_cache_mib=host,
        prefill_chunk=128, check_invariants=True,
    )  # fmt: skip
    roomy = LLM.from_model(
        model, device="cuda", max_concurrency=1, kv_capacity=64 * 64, prefix_reuse=False,
        prefill_chunk=128,
    )  # fmt: skip
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        assert [o.finish_reason for o in outs] == ["length", "length"]
        assert [len(o.token_ids) for o in outs] == [300, 300]
        assert sum(o.metrics.suspensions for o in outs) >= 1
        assert llm.cache_stats().suspensions == sum(o.metrics.suspensions for o in outs)
        for out, p in zip(outs, prompts, strict=True):
            _agree(out.token_ids, roomy.generate([{"prompt_token_ids": p}], params)[0])
        assert_idle(llm)
    finally:
        llm.close()
        roomy.close()
