"""Released shapes and the deterministic random initialisation."""

from __future__ import annotations

import pytest
import torch

from ninfer.models.presets import PRESETS, build_random_model
from ninfer.models.qwen3_5 import Qwen35ForCausalLM
from tests.models.util import Row, make_batch, make_cache, narrow

# text-model parameters (the released names also count the vision tower)
BILLIONS = {"0.8B": 0.75, "2B": 1.88, "4B": 4.21, "9B": 8.95, "27B": 26.9, "35B-A3B": 34.66}


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_shapes(name):
    cfg = PRESETS[name]
    assert (cfg.vocab_size, cfg.head_dim, cfg.linear_key_head_dim) == (248320, 256, 128)
    assert cfg.eos_token_ids == (248046, 248044) and cfg.rope_theta == 1e7
    assert cfg.full_layer_ids == tuple(range(3, cfg.num_hidden_layers, 4))
    model = Qwen35ForCausalLM(cfg, device="meta")
    total = sum(p.numel() for p in model.parameters()) / 1e9
    assert total == pytest.approx(BILLIONS[name], abs=0.01)
    assert PRESETS["35B-A3B"].is_moe


def test_random_model_is_deterministic_and_fully_random():
    cfg = narrow(PRESETS["0.8B"])
    a = build_random_model(cfg, torch.float32, "cpu", seed=3)
    b = build_random_model(cfg, torch.float32, "cpu", seed=3)
    c = build_random_model(cfg, torch.float32, "cpu", seed=4)
    for (name, pa), pb, pc in zip(
        a.named_parameters(), b.parameters(), c.parameters(), strict=True
    ):
        assert torch.equal(pa, pb), name
        assert not torch.equal(pa, pc), name
        assert pa.std() > 0 and not pa.requires_grad, name
    assert a.lm_head.weight is a.model.embed_tokens.weight


@pytest.mark.parametrize("name", ["27B", "35B-A3B"])
def test_random_model_bf16_outputs_are_finite_and_vary(ref_ops, name):
    cfg = narrow(PRESETS[name])
    model = build_random_model(cfg, torch.bfloat16, "cpu", seed=0)
    cache = make_cache(cfg, num_pages=2, num_slots=2, dtype=torch.bfloat16)
    prompt = list(range(10, 40))
    rows = [Row(prompt, 0, 0, [0]), Row(prompt[:-1] + [7], 0, 1, [1])]
    logits = model(make_batch(rows, logits_indices=[0, 29, 59]), cache, ref_ops)
    assert logits.isfinite().all()
    assert logits.std(dim=-1).min() > 0.1  # not flat
    assert (logits[1] - logits[2]).abs().max() > 1e-2  # the last token matters
    assert not torch.equal(logits[0], logits[1])
