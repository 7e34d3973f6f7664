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


def test_images_with_mtp_speculation_on_cuda(folder, tmp_path):
    """An image request and a text one speculating together (K = 3, the random head): the
    image's verify rows carry its (t, h, w) positions (such steps run eagerly), greedy output
    as plain decode's up to bf16 near-ties (plain decode's logprob gap at the first
    difference under 0.1 nats)."""
    import shutil

    from tests.vision.vl_checkpoint import add_random_mtp_head

    path = tmp_path / "vl_mtp"
    shutil.copytree(folder, path)
    add_random_mtp_head(path)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=20)
    chats = [_ask(96, 64, 1, "What is in it?"), [{"role": "user", "content": "Plain text."}]]
    with LLM(str(path), **OPTIONS) as plain:
        want = plain.chat(chats, params)
    with LLM(str(path), speculative="mtp", num_speculative_tokens=3, **OPTIONS) as spec:
        got = spec.chat(chats, params)
        assert spec.engine.speculator.stats.verify_rows > 0
        spec.check_idle()
    for w, g in zip(want, got, strict=True):
        pairs = enumerate(zip(w.token_ids, g.token_ids, strict=True))
        n = next((i for i, (a, b) in pairs if a != b), None)
        if n is None:
            assert g.token_ids == w.token_ids
            continue
        lp = w.logprobs[n]
        assert lp[w.token_ids[n]] - lp.get(g.token_ids[n], float("-inf")) < 0.1, n
