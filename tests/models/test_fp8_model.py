"""FP8 models on the reference ops: on-the-fly quantisation, fusion of FP8 projections, and the
logits of the dequantised model (the oracle)."""

from __future__ import annotations

import copy

import pytest
import torch

from ninfer.models.fp8 import Fp8Linear
from ninfer.models.presets import PRESETS, build_random_model
from ninfer.models.quant import OFFICIAL_NOT_CONVERT, QuantScheme
from ninfer.models.quantize import (
    dense_state_dict,
    dequantize_,
    kept_dense,
    quantize_,
    weight_bytes,
)
from ninfer.models.qwen3_5 import Experts, fused_weight
from ninfer.ops.fp8 import Fp8Weight
from tests.models.util import Row, make_batch, make_cache, narrow

IDS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]


def _scheme(block=(32, 32), keep=OFFICIAL_NOT_CONVERT) -> QuantScheme:
    return QuantScheme("fp8", block, keep, "weight_scale_inv")


def _model(preset: str, dtype=torch.float32):
    return build_random_model(narrow(PRESETS[preset], layers=4), dtype, "cpu", seed=3)


def _logits(model, ops, dtype=torch.float32):
    cache = make_cache(model.config, num_pages=2, num_slots=1, dtype=dtype)
    return model(make_batch([Row(IDS, 0, 0, [1])]), cache, ops)


@pytest.mark.parametrize("preset", ["27B", "35B-A3B"])
def test_quantised_model_equals_its_dequantised_twin(ref_ops, preset):
    fp8 = quantize_(_model(preset), _scheme())
    twin = dequantize_(copy.deepcopy(fp8), torch.float32)
    assert not any(isinstance(m, Fp8Linear) for m in twin.modules())
    assert torch.equal(_logits(fp8, ref_ops), _logits(twin, ref_ops))
    fp8.fuse_projections()
    twin.fuse_projections()
    assert (_logits(fp8, ref_ops) - _logits(twin, ref_ops)).abs().max() < 1e-5


def test_official_defaults_keep_the_listed_modules_dense():
    fp8 = quantize_(_model("35B-A3B"), _scheme())
    assert kept_dense(fp8) == [
        "layers.*.linear_attn.in_proj_a", "layers.*.linear_attn.in_proj_b", "layers.*.mlp.gate",
        "layers.*.mlp.shared_expert_gate", "lm_head",
    ]  # fmt: skip
    layer = fp8.model.layers[0]
    assert isinstance(layer.linear_attn.in_proj_qkv, Fp8Linear)
    assert isinstance(layer.mlp.shared_expert.down_proj, Fp8Linear)
    assert layer.mlp.experts.blocks == {"gate_up_proj": (32, 32), "down_proj": (32, 32)}
    assert layer.mlp.experts.gate_up_proj.dtype == torch.float8_e4m3fn


def test_router_and_tied_head_stay_dense_whatever_the_scheme():
    cfg = narrow(PRESETS["0.8B"], layers=2)
    assert cfg.tie_word_embeddings
    fp8 = quantize_(build_random_model(cfg, torch.float32, "cpu"), _scheme(keep=()))
    assert fp8.lm_head.weight is fp8.model.embed_tokens.weight
    moe = quantize_(_model("35B-A3B"), _scheme(keep=()))
    assert not isinstance(moe.model.layers[0].mlp.gate, Fp8Linear)
    assert not isinstance(moe.model.layers[0].mlp.shared_expert_gate, Fp8Linear)
    assert isinstance(moe.lm_head, Fp8Linear)


def test_fp8_fusion_keeps_kinds_apart(ref_ops):
    """GDN: FP8 qkv | z fuse, dense b | a fuse, never the four together; every fused FP8 weight
    holds its parts' values and scales as views."""
    fp8 = quantize_(_model("27B"), _scheme())
    before = _logits(fp8, ref_ops)
    fp8.fuse_projections()
    gdn = fp8.model.layers[0].linear_attn
    assert gdn.in_proj is None
    assert isinstance(gdn.in_proj_qkvz, Fp8Weight)
    assert isinstance(gdn.in_proj_ba, torch.Tensor)
    assert fused_weight(gdn.in_proj_qkvz, (gdn.in_proj_qkv, gdn.in_proj_z)) is gdn.in_proj_qkvz
    assert gdn.in_proj_qkv.weight_scale_inv.data_ptr() == gdn.in_proj_qkvz.scale.data_ptr()
    attn = fp8.model.layers[3].self_attn
    assert isinstance(attn.qkv_proj, Fp8Weight)
    assert (_logits(fp8, ref_ops) - before).abs().max() < 1e-5


def test_fp8_parts_off_the_block_grid_stay_unfused(ref_ops):
    """A block of 48 rows does not divide the projections' 256 / 128 rows: nothing FP8 fuses
    (a fused scale row would straddle two parts); the dense b | a still do."""
    fp8 = quantize_(_model("27B"), _scheme(block=(48, 32)))
    before = _logits(fp8, ref_ops)
    fp8.fuse_projections()
    gdn, attn = fp8.model.layers[0].linear_attn, fp8.model.layers[3].self_attn
    assert gdn.in_proj is None and gdn.in_proj_qkvz is None
    assert isinstance(gdn.in_proj_ba, torch.Tensor)
    assert attn.qkv_proj is None
    assert (_logits(fp8, ref_ops) - before).abs().max() < 1e-5


def test_bf16_fp8_model_runs_and_halves_the_bytes(ref_ops):
    dense = _model("27B", torch.bfloat16)
    fp8 = quantize_(copy.deepcopy(dense), _scheme())
    twin = dequantize_(copy.deepcopy(fp8), torch.bfloat16)
    bf16 = torch.bfloat16
    assert torch.equal(_logits(fp8, ref_ops, bf16), _logits(twin, ref_ops, bf16))
    dense_bytes, fp8_bytes = weight_bytes(dense), weight_bytes(fp8)
    assert fp8_bytes.per_token < dense_bytes.per_token
    assert dense_bytes.total == sum(p.numel() * 2 for p in dense.parameters())


def test_random_preset_quantised_at_build(ref_ops):
    cfg = narrow(PRESETS["35B-A3B"], layers=4)
    fp8 = build_random_model(cfg, torch.float32, "cpu", seed=3, quantization="fp8")
    assert fp8.quant_scheme is not None and fp8.quant_scheme.block == (128, 128)
    assert isinstance(fp8.model.layers[3].self_attn.q_proj, Fp8Linear)
    twin = quantize_(_model("35B-A3B"), fp8.quant_scheme)
    assert torch.equal(_logits(fp8, ref_ops), _logits(twin, ref_ops))
    with pytest.raises(ValueError, match="quantization"):
        build_random_model(cfg, torch.float32, "cpu", quantization="int8")


def _dense_target_bytes(model) -> int:
    """Bytes of the drawn dense weights of the modules `quantization="fp8"` converts."""
    from ninfer.models.quant import on_the_fly
    from ninfer.models.quantize import fp8_targets

    linears, experts = fp8_targets(model, on_the_fly("fp8"))
    total = 0
    for name in [*linears, *experts]:
        module = model.get_submodule(name)
        if not getattr(module, "blocks", None):  # experts already FP8 have blocks
            total += sum(p.numel() * p.element_size() for p in module.parameters() if not p.is_meta)
    return total


@pytest.mark.parametrize("preset", ["27B", "35B-A3B"])
@pytest.mark.parametrize("mtp", [False, True])
def test_random_fp8_preset_is_drawn_module_by_module(monkeypatch, preset, mtp):
    """`build_random_model(quantization="fp8")` draws the parameters one at a time and makes
    each converted module FP8 as soon as it is drawn: at every draw, the dense weights of the
    modules to convert stay within the largest one's (the dense model is never held whole: the
    27B or the 35B-A3B in bf16 would not fit beside its FP8 copy on one 80 GB card), and the
    model is the dense one quantised after the draw, bit for bit."""
    from ninfer.models import presets
    from ninfer.models.quant import on_the_fly

    cfg = narrow(PRESETS[preset], layers=4)
    dense = build_random_model(cfg, torch.float32, "cpu", seed=3, mtp=mtp)
    largest = max(
        sum(p.numel() * p.element_size() for p in m.parameters())
        for m in dense.modules()
        if isinstance(m, (torch.nn.Linear, Experts))
    )
    built, seen = [], []
    build = presets.Qwen35ForCausalLM

    def capture(*args, **kwargs):
        built.append(build(*args, **kwargs))
        return built[-1]

    draw = presets._init_param

    def spy(name, p, gen, std):
        draw(name, p, gen, std)
        seen.append(_dense_target_bytes(built[-1]))

    monkeypatch.setattr(presets, "Qwen35ForCausalLM", capture)
    monkeypatch.setattr(presets, "_init_param", spy)
    fp8 = build_random_model(cfg, torch.float32, "cpu", seed=3, quantization="fp8", mtp=mtp)
    monkeypatch.undo()
    assert seen and max(seen) <= largest < _dense_target_bytes(dense), (max(seen), largest)
    want = quantize_(dense, on_the_fly("fp8")).state_dict()
    got = fp8.state_dict()
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name].view(torch.uint8), value.view(torch.uint8)), name


def test_quantised_at_load_is_another_cache_identity():
    from ninfer.persist.fingerprint import path_identity

    assert path_identity(None, "fp8") != path_identity(None)
    assert path_identity(None, None) == path_identity(None)


def test_dense_state_dict_is_the_dequantised_model():
    fp8 = quantize_(_model("35B-A3B"), _scheme())
    state = dense_state_dict(fp8, torch.float32)
    twin = dequantize_(copy.deepcopy(fp8), torch.float32)
    assert set(state) == set(twin.state_dict())
    assert all(torch.equal(state[k], v) for k, v in twin.state_dict().items())
    assert fp8.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.float8_e4m3fn
