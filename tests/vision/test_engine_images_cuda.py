"""Images through the engine on CUDA (bf16; the tiny random checkpoint with head_dim 128): the
tower runs on the device, a prefill with images runs eagerly, decode rows of a request with
images take the plain step; a cached run gives a cold run's tokens, the encoder cache hits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from ninfer import LLM, SamplingParams
from tests.vision.vl_checkpoint import build_vl_checkpoint

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
OPTIONS = dict(device="cuda", max_concurrency=2, kv_capacity=8192, host_cache_mib=0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("vl_cuda")
    build_vl_checkpoint(path, name="section-default")
    return path


def _ask(width: int, height: int, seed: int, text: str) -> list[dict]:
    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return [{"role": "user", "content": [{"image": Image.fromarray(rgb)}, text]}]


def test_images_on_cuda_cached_equals_cold(folder):
    long = " ".join(f"w{i}" for i in range(120))
    messages = _ask(96, 64, 0, long)
    with LLM(str(folder), **OPTIONS) as llm:
        assert llm.supports_images
        tower = llm.engine.runner.model.model.visual
        assert next(tower.parameters()).device.type == "cuda"
        cold = llm.chat(messages, GREEDY)[0]
        warm = llm.chat(messages, GREEDY)[0]
        other = llm.chat(_ask(96, 64, 0, "Short?"), GREEDY)[0]
        st = llm.cache_stats()
    assert cold.finish_reason == warm.finish_reason == other.finish_reason == "length"
    assert warm.usage.cached_tokens > 0 and warm.token_ids == cold.token_ids
    assert st.encoder_cache_misses == 1 and st.encoder_cache_hits >= 1
    with LLM(str(folder), prefix_reuse=False, **OPTIONS) as fresh:
        assert fresh.chat(_ask(96, 64, 0, "Short?"), GREEDY)[0].token_ids == other.token_ids
