"""GPU: the engine's warm-up runs the pass a cached turn's long final chunk is (one eager row
after a cached context, the gathered attention path, a snapshot inside the pass), so that no
kernel is first built inside a user's cached turn (issue 23: cached turns slower than cold).
Skipped without CUDA or the kernel libraries."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from engine_helpers import CUDA_TINY

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
for _mod in ("triton", "flashinfer", "fla"):
    pytest.importorskip(_mod)

from ninfer.llm import LLM  # noqa: E402
from ninfer.models.presets import build_random_model  # noqa: E402
from ninfer.request import SamplingParams  # noqa: E402

TRITON_CACHE = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _kernel_files() -> int:
    return sum(len(f) for _, _, f in os.walk(TRITON_CACHE)) if TRITON_CACHE.is_dir() else 0


def test_cached_turns_long_final_chunk_is_warm():
    model = build_random_model(CUDA_TINY, torch.bfloat16, "cuda", seed=5)
    llm = LLM.from_model(
        model, device="cuda", max_concurrency=2, kv_capacity=16384, host_cache_mib=0,
        prefill_chunk=512, solo_prefill_chunk=4096,
    )  # fmt: skip
    try:
        runner = llm.engine.runner
        planner = runner.ops.attention_planner
        # the warm-up took the gathered path; the planner's counter then starts at 0 for
        # served passes (engine.startup keeps the warm-up's count)
        assert llm.engine.startup["warm_gathered_passes"] >= 1
        assert planner.gathered_passes == 0
        first = [(13 * i) % 2500 + 4 for i in range(1500)]
        llm.generate([{"prompt_token_ids": first}], PARAMS)
        gathered, files = planner.gathered_passes, _kernel_files()
        # resumes at the first prompt's tail snapshot (1024: ceil64(1500 - 512)) or later; the
        # rest, over 1600 tokens, in one eager pass (a final chunk > prefill_chunk with the
        # prompt-tail snapshot inside it) over the cached context, gathered
        turn = first + [(7 * i) % 2500 + 4 for i in range(1200)]
        out = llm.generate([{"prompt_token_ids": turn}], PARAMS)[0]
        assert out.usage.cached_tokens >= 1024
        assert planner.gathered_passes > gathered
        assert _kernel_files() == files  # no kernel compiled inside the cached turn
    finally:
        llm.close()
