"""Checkpoint loading: transformers' save_pretrained output and hand-built Hub layouts (wrapper
config, `model.language_model.` keys, shards + index, vision / MTP tensors, per-expert MoE)."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer.models.weights import checkpoint_files, load_model
from tests.models.hf_util import hf_logits, random_hf_model
from tests.models.util import Row, make_batch, make_cache

IDS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]


def _assert_same_logits(model, hf, ref_ops):
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters())
    cache = make_cache(model.config, num_pages=2, num_slots=1)
    got = model(make_batch([Row(IDS, 0, 0, [1])]), cache, ref_ops)
    assert (got - hf_logits(hf, IDS)).abs().max() < 1e-4


@pytest.mark.parametrize("name", ["dense-tied", "moe-untied"])
def test_save_pretrained_checkpoint_loads(tmp_path, ref_ops, name):
    hf = random_hf_model(name)
    hf.save_pretrained(tmp_path)
    assert checkpoint_files(tmp_path) == [tmp_path / "model.safetensors"]
    model = load_model(tmp_path, torch.float32, "cpu")
    if hf.config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    _assert_same_logits(model, hf, ref_ops)


def _hub_checkpoint(path, hf, per_expert: bool) -> None:
    """Writes `hf` the way the Hub stores Qwen3.5: wrapper config, language_model keys, two
    shards with an index, plus vision-tower and MTP tensors."""
    text = hf.config.to_dict()
    wrapper = text["model_type"].removesuffix("_text")
    config = {"model_type": wrapper, "text_config": text, "vision_config": {"depth": 1},
              "tie_word_embeddings": hf.config.tie_word_embeddings}  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    tensors = {}
    for key, t in hf.state_dict().items():
        if key == "lm_head.weight" and hf.config.tie_word_embeddings:
            continue
        if per_expert and key.endswith("experts.gate_up_proj"):
            for e, w in enumerate(t):
                gate, up = w.chunk(2)
                tensors[key.replace("gate_up_proj", f"{e}.gate_proj.weight")] = gate
                tensors[key.replace("gate_up_proj", f"{e}.up_proj.weight")] = up
            continue
        if per_expert and key.endswith("experts.down_proj"):
            for e, w in enumerate(t):
                tensors[key.replace("down_proj", f"{e}.down_proj.weight")] = w
            continue
        tensors[key.replace("model.", "model.language_model.", 1)] = t
    tensors["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(6, 2)
    tensors["mtp.fc.weight"] = torch.zeros(2, 4)
    keys = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": keys[::2],
        "model-00002-of-00002.safetensors": keys[1::2],
    }
    weight_map = {}
    for file, names in shards.items():
        save_file({k: tensors[k].contiguous() for k in names}, str(path / file))
        weight_map.update(dict.fromkeys(names, file))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


@pytest.mark.parametrize(
    ("name", "per_expert"),
    [("dense-untied-odd", False), ("moe-untied", True), ("moe-tied-full-first", False)],
)
def test_hub_layout_loads(tmp_path, ref_ops, caplog, name, per_expert):
    hf = random_hf_model(name)
    _hub_checkpoint(tmp_path, hf, per_expert)
    assert [p.name for p in checkpoint_files(tmp_path)] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    with caplog.at_level(logging.INFO, logger="ninfer.models"):
        model = load_model(tmp_path, torch.float32, "cpu")
    skipped = [r for r in caplog.records if r.name == "ninfer.models"]
    assert len(skipped) == 1 and "skipped 2" in skipped[0].getMessage()
    _assert_same_logits(model, hf, ref_ops)


def test_load_casts_to_dtype(tmp_path):
    random_hf_model("dense-tied").save_pretrained(tmp_path)
    model = load_model(tmp_path, torch.bfloat16, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.inv_freq.dtype == torch.float32


def _edit_single_file(path, edit) -> None:
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop("model.layers.2.linear_attn.A_log"), "model.layers.2.linear_attn.A_log"),
        (lambda t: t.pop("model.layers.0.mlp.experts.4.up_proj.weight"),
         "model.layers.0.mlp.experts.4.up_proj.weight"),
        (lambda t: t.update({"model.layers.0.mlp.foo.weight": torch.zeros(2)}),
         "unexpected tensor 'model.layers.0.mlp.foo.weight'"),
        (lambda t: t.update({"model.layers.0.mlp.experts.6.down_proj.weight": torch.zeros(2)}),
         "unexpected tensor 'model.layers.0.mlp.experts.6.down_proj.weight'"),
        (lambda t: t.update({"model.norm.weight": torch.zeros(41)}),
         r"'model.norm.weight' has shape \[41\], expected \[40\]"),
        (lambda t: t.update({"model.layers.2.mlp.experts.0.gate_proj.weight": torch.zeros(3, 40)}),
         r"'model.layers.2.mlp.experts.0.gate_proj.weight' has shape \[3, 40\]"),
    ],
    ids=["missing", "missing-expert", "unexpected", "unexpected-expert", "shape", "expert-shape"],
)  # fmt: skip
def test_bad_checkpoints_name_the_tensor(tmp_path, edit, message):
    random_hf_model("moe-untied").save_pretrained(tmp_path)
    _edit_single_file(tmp_path, edit)
    with pytest.raises(ValueError, match=message):
        load_model(tmp_path, torch.float32, "cpu")
