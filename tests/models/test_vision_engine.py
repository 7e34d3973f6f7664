"""The engine over a checkpoint with a vision tower (issue 40): the tower loads where the
checkpoint has a `vision_config` and a `preprocessor_config.json`, and a text-only prompt is
served exactly as without a tower: the same tokens, the same block keys and the same cache
behaviour (a tower must not change text prefix reuse). fp32, CPU."""

from __future__ import annotations

import json

import pytest
import torch

from ninfer import LLM
from ninfer.llm import _image_processor
from ninfer.models.weights import load_model
from ninfer.request import SamplingParams
from tests.models.vision_util import (
    END,
    IMAGE,
    START,
    TEXT_VOCAB,
    VIDEO,
    random_hf_vlm,
    save_checkpoint,
)

OPTS = dict(device="cpu", prefill_chunk=64, max_concurrency=2, kv_capacity=4096,
            host_cache_mib=8, check_invariants=True)  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("vlm")
    return save_checkpoint(random_hf_vlm("section-3-3-2", seed=3), path)


def test_tower_loads_only_with_its_processor_config(checkpoint, tmp_path):
    assert _image_processor(checkpoint) is not None
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((checkpoint / "config.json").read_text())
    assert _image_processor(bare) is None  # no preprocessor_config.json
    (bare / "preprocessor_config.json").write_text("{}")
    raw = json.loads((checkpoint / "config.json").read_text())
    del raw["vision_config"]
    (bare / "config.json").write_text(json.dumps(raw))
    assert _image_processor(bare) is None


def _serve(model, prompts: list[list[int]], processor=None) -> tuple[list[list[int]], dict, bool]:
    llm = LLM.from_model(model, image_processor=processor, **OPTS)
    try:
        params = SamplingParams(max_tokens=6, temperature=0.0)
        outs = [llm.generate([{"prompt_token_ids": p}], params)[0] for p in prompts]
        stats = llm.cache_stats().as_dict()
        return [list(o.token_ids) for o in outs], stats, llm.supports_images
    finally:
        llm.close()


def test_text_only_prompts_served_the_same_with_and_without_the_tower(checkpoint):
    """Two turns sharing a 150-token prefix, with and without the tower: the same tokens and
    every cache counter equal (the second turn resumes as far either way)."""
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(0, TEXT_VOCAB, (150,), generator=g).tolist()
    prompts = [shared + [1, 2, 3], shared + [4, 5, 6, 7]]
    with_tower = load_model(checkpoint, dtype=torch.float32, vision=True)
    text_only = load_model(checkpoint, dtype=torch.float32)
    tokens_v, stats_v, images_v = _serve(with_tower, prompts, _image_processor(checkpoint))
    tokens_t, stats_t, images_t = _serve(text_only, prompts)
    assert images_v and not images_t
    assert tokens_v == tokens_t
    assert stats_v["reuse_tokens"] > 0
    assert stats_v == stats_t


@pytest.mark.parametrize("token", [IMAGE, VIDEO, START, END])
def test_vision_tokens_without_images_refused_naming_the_field(checkpoint, token):
    """With a tower, token ids holding a vision placeholder but no image are refused naming
    the prompt and the token's position; the text-only model serves them as before."""
    ids = [5, 6, token, 7]
    llm = LLM.from_model(load_model(checkpoint, dtype=torch.float32, vision=True), **OPTS)
    try:
        with pytest.raises(ValueError, match=r"^prompt: token 2 \(id"):
            llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1))
        ok = llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=1))
        assert len(ok[0].token_ids) == 1
    finally:
        llm.close()
    text_only = LLM.from_model(load_model(checkpoint, dtype=torch.float32), **OPTS)
    try:
        out = text_only.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1))
        assert len(out[0].token_ids) == 1
    finally:
        text_only.close()
