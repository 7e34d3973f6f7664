"""`quantization_config` parsing and module matching (`ninfer.models.quant`)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.models.quant import (
    COMPRESSED,
    FINE_GRAINED,
    OFFICIAL_NOT_CONVERT,
    checkpoint_scheme,
    on_the_fly,
    parse_scheme,
)

FINE = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
    "modules_to_not_convert": ["lm_head", "model.language_model.layers.0.linear_attn.in_proj_a"],
}
GROUP = {
    "targets": ["Linear"],
    "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
                "dynamic": False},
    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
}  # fmt: skip
COMPRESSED_QC = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {"group_0": GROUP},
    "ignore": ["lm_head", "re:.*linear_attn.*", "re:.*mlp.gate$"],
}


def test_fine_grained_parses():
    s = parse_scheme(FINE)
    assert (s.method, s.block, s.scale_name) == (FINE_GRAINED, (128, 128), "weight_scale_inv")
    assert s.keep == tuple(FINE["modules_to_not_convert"])
    assert s.block_for(5120) == (128, 128)
    assert not s.converts("lm_head")
    assert not s.converts("model.layers.0.linear_attn.in_proj_a")  # the Hub's layout names it
    assert s.converts("model.layers.1.linear_attn.in_proj_a")
    assert s.converts("model.layers.0.linear_attn.in_proj_z")


def test_compressed_parses():
    s = parse_scheme(COMPRESSED_QC)
    assert (s.method, s.per_channel, s.scale_name) == (COMPRESSED, True, "weight_scale")
    assert s.block_for(640) == (1, 640)
    assert not s.converts("lm_head")
    assert not s.converts("model.layers.3.linear_attn.out_proj")
    assert not s.converts("model.layers.3.mlp.gate")
    assert s.converts("model.layers.3.mlp.gate_proj")
    assert s.converts("model.layers.3.self_attn.q_proj")
    assert s.converts("model.lm_head")  # a plain name matches exactly, not as a suffix


def test_compressed_block_strategy():
    weights = {**GROUP["weights"], "strategy": "block", "block_structure": [64, 32]}
    qc = {**COMPRESSED_QC, "config_groups": {"g": {**GROUP, "weights": weights}}}
    assert parse_scheme(qc).block == (64, 32)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"quant_method": "awq"}, "quant_method"),
        ({"fmt": "e5m2"}, "fmt"),
        ({"activation_scheme": "static"}, "activation_scheme"),
        ({"weight_block_size": [128]}, "weight_block_size"),
        ({"weight_block_size": [128, 0]}, "weight_block_size"),
        ({"weight_block_size": "128x128"}, "weight_block_size"),
        ({"weight_block_size": [128, True]}, "weight_block_size"),
        ({"modules_to_not_convert": "lm_head"}, "modules_to_not_convert"),
        ({"modules_to_not_convert": [1]}, "modules_to_not_convert"),
    ],
)
def test_malformed_fine_grained_names_field(change, field):
    with pytest.raises(ValueError, match=field):
        parse_scheme({**FINE, **change})


@pytest.mark.parametrize(
    ("weights", "field"),
    [
        ({"num_bits": 4}, "num_bits"),
        ({"type": "int"}, "type"),
        ({"dynamic": True}, "dynamic"),
        ({"symmetric": False}, "symmetric"),
        ({"strategy": "tensor"}, "strategy"),
        ({"strategy": "block", "block_structure": None}, "block_structure"),
    ],
)
def test_malformed_compressed_names_field(weights, field):
    group = {**GROUP, "weights": {**GROUP["weights"], **weights}}
    with pytest.raises(ValueError, match=field):
        parse_scheme({**COMPRESSED_QC, "config_groups": {"g": group}})


@pytest.mark.parametrize(
    ("qc", "field"),
    [
        ({**COMPRESSED_QC, "config_groups": {}}, "config_groups"),
        ({**COMPRESSED_QC, "config_groups": {"g": {**GROUP, "targets": ["Embedding"]}}}, "targets"),
        ({**COMPRESSED_QC, "config_groups": {"g": {**GROUP, "weights": None}}}, "weights"),
        (
            {**COMPRESSED_QC, "config_groups": {"g": {**GROUP, "input_activations": {}}}},
            "input_activations",
        ),
        ({**COMPRESSED_QC, "ignore": "lm_head"}, "ignore"),
        ("fp8", "quantization_config"),
    ],
)
def test_malformed_compressed_config(qc, field):
    with pytest.raises(ValueError, match=field):
        parse_scheme(qc)


def test_checkpoint_scheme_reads_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_text"}))
    assert checkpoint_scheme(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": FINE}))
    assert checkpoint_scheme(tmp_path).block == (128, 128)


def test_on_the_fly():
    assert on_the_fly(None) is None
    s = on_the_fly("fp8")
    assert (s.method, s.block, s.keep) == (FINE_GRAINED, (128, 128), OFFICIAL_NOT_CONVERT)
    for name in ("lm_head", "model.layers.0.linear_attn.in_proj_b", "model.layers.2.mlp.gate",
                 "model.layers.2.mlp.shared_expert_gate"):  # fmt: skip
        assert not s.converts(name)
    for name in ("model.layers.0.linear_attn.in_proj_qkv", "model.layers.0.linear_attn.out_proj",
                 "model.layers.3.self_attn.o_proj", "model.layers.2.mlp.gate_proj",
                 "model.layers.2.mlp.shared_expert.up_proj"):  # fmt: skip
        assert s.converts(name)
    for bad in ("FP8", "int8", ""):
        with pytest.raises(ValueError, match="quantization"):
            on_the_fly(bad)


_PART = st.sampled_from(["model", "layers", "0", "1", "11", "mlp", "gate", "gate_proj", "attn",
                         "lm_head", "linear_attn", "in_proj_a", "language_model"])  # fmt: skip
_NAME = st.lists(_PART, min_size=1, max_size=5).map(".".join)


@pytest.fixture(scope="module")
def should_convert_module():
    return pytest.importorskip("transformers.quantizers.quantizers_utils").should_convert_module


@settings(deadline=None)
@given(name=_NAME, patterns=st.lists(_NAME | st.just("layers.*"), max_size=3))
def test_fine_grained_matching_agrees_with_transformers(should_convert_module, name, patterns):
    """Our not-convert rule is transformers' (`should_convert_module`) on names in the model's
    own layout."""
    scheme = parse_scheme({**FINE, "modules_to_not_convert": patterns})
    want = should_convert_module(name, patterns)
    assert scheme._kept(name) is (not want)
