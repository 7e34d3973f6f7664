"""The vision tower alone (`ninfer.models.vision`) against transformers' `Qwen3_5VisionModel`
on fp32 inputs: images of several grids (square, wide, tall, a 2-frame grid), configs with
every field away from its default; the config parsing; loading the tower from a checkpoint
(bf16, and a checkpoint without one); on CUDA, the bf16 tower against the fp32 one."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5VisionConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

from ninfer.models.config import Qwen35Config
from ninfer.models.quant import FINE_GRAINED, OFFICIAL_NOT_CONVERT, QuantScheme
from ninfer.models.quantize import quantize_
from ninfer.models.qwen3_5 import Qwen35ForCausalLM
from ninfer.models.vision import VisionConfig, VisionModel, add_vision_tower
from ninfer.models.weights import load_model
from tests.models.hf_util import random_hf_model
from tests.models.vision_util import load_pair

# name -> Qwen3_5VisionConfig kwargs
CONFIGS = {
    "merge-2": dict(
        depth=2, hidden_size=32, num_heads=2, intermediate_size=48, patch_size=4,
        temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=40,
        num_position_embeddings=16,
    ),
    "merge-3-odd": dict(
        depth=3, hidden_size=48, num_heads=3, intermediate_size=40, patch_size=3,
        temporal_patch_size=1, spatial_merge_size=3, out_hidden_size=24,
        num_position_embeddings=36, hidden_act="silu", in_channels=2,
        rope_parameters={"rope_type": "axial", "rope_theta": 777.0},
    ),
}  # fmt: skip


@torch.no_grad()
def _random_tower(name: str, seed: int = 0) -> Qwen3_5VisionModel:
    torch.manual_seed(seed)
    hf = Qwen3_5VisionModel(Qwen3_5VisionConfig(**CONFIGS[name], attn_implementation="sdpa"))
    for n, p in hf.named_parameters():
        if p.dim() == 1:
            p.copy_(torch.randn_like(p) * 0.1 + ("norm" in n and n.endswith("weight")))
        else:
            p.copy_(torch.randn_like(p) * (1.0 if "pos_embed" in n else p[0].numel() ** -0.5))
    return hf.eval()


def _twin(hf: Qwen3_5VisionModel) -> VisionModel:
    cfg = VisionConfig.from_hf_dict({"vision_config": hf.config.to_dict()})
    model = VisionModel(cfg)
    model.load_state_dict(hf.state_dict(), strict=True)
    return model.eval()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tower_matches_transformers(name):
    hf = _random_tower(name, seed=len(name))
    model = _twin(hf)
    m = model.config.spatial_merge_size
    grids = [(1, 2 * m, 5 * m), (1, 4 * m, m), (2, 3 * m, 3 * m), (1, m, m)]
    n = sum(t * h * w for t, h, w in grids)
    pixels = torch.randn(n, model.config.patch_dim, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = hf(pixels, torch.tensor(grids)).pooler_output
    got = model(pixels, grids)
    assert got.shape == (n // m**2, model.config.out_hidden_size) == want.shape
    assert want.abs().max() > 0.1
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    # each image is encoded on its own: the same output alone as in the batch
    alone = model(pixels[-m * m :], grids[-1:])
    torch.testing.assert_close(alone, got[-1:], atol=1e-6, rtol=1e-6)


def test_config_reads_every_field():
    raw = {
        "vision_config": {**CONFIGS["merge-3-odd"], "model_type": "qwen3_5_vision"},
        "image_token_id": 7, "video_token_id": 8, "vision_start_token_id": 9,
        "vision_end_token_id": 10,
    }  # fmt: skip
    cfg = VisionConfig.from_hf_dict(raw)
    want = {k: v for k, v in CONFIGS["merge-3-odd"].items() if k != "rope_parameters"}
    assert {k: getattr(cfg, k) for k in want} == want
    assert cfg.rope_theta == 777.0 and cfg.head_dim == 16 and cfg.patch_dim == 2 * 1 * 3 * 3
    assert (cfg.image_token_id, cfg.video_token_id) == (7, 8)
    assert (cfg.vision_start_token_id, cfg.vision_end_token_id) == (9, 10)
    assert VisionConfig.from_hf_dict({"text_config": {}}) is None


@pytest.mark.parametrize(
    "change,match",
    [
        ({"hidden_act": "relu6"}, "hidden_act"),
        ({"num_position_embeddings": 15}, "square"),
        ({"depth": "2"}, "depth"),
        ({"patch_size": None}, "patch_size"),
        ({"spatial_merge_size": 0}, "spatial_merge_size"),
    ],
)
def test_config_refuses_bad_fields(change, match):
    vision = {**CONFIGS["merge-2"], **change}
    with pytest.raises(ValueError, match=match):
        VisionConfig.from_hf_dict({"vision_config": vision})


def test_tower_loads_in_bf16(tmp_path):
    hf, model, _, path = load_pair("section-3-3-2", tmp_path)
    bf16 = load_model(path, dtype=torch.bfloat16, vision=True)
    tower = bf16.model.visual
    assert all(p.dtype == torch.bfloat16 for p in tower.parameters())
    assert tower.inv_freq.dtype == torch.float32 and not tower.inv_freq.is_meta
    want = hf.model.visual.state_dict()
    for n, p in tower.state_dict().items():
        assert torch.equal(p, want[n].bfloat16()), n
    grids = [(1, 4, 6)]
    pixels = torch.randn(24, tower.config.patch_dim)
    out = tower(pixels, grids)
    ref = model.model.visual(pixels, grids)
    assert out.dtype == torch.bfloat16
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2


def test_vision_on_a_text_only_checkpoint_loads_text_only(tmp_path):
    hf = random_hf_model("dense-untied-odd")
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path, dtype=torch.float32, vision=True)
    assert model.model.visual is None
    assert not any(n.startswith("model.visual") for n, _ in model.named_parameters())


def test_missing_tower_tensor_is_named(tmp_path):
    _, _, _, path = load_pair("section-3-3-2", tmp_path)
    file = path / "model.safetensors"
    tensors = load_file(file)
    del tensors["model.visual.blocks.1.attn.qkv.bias"]
    save_file(tensors, file, metadata={"format": "pt"})
    assert load_model(path, dtype=torch.float32).model.visual is None  # not asked for: fine
    with pytest.raises(ValueError, match=r"model\.visual\.blocks\.1\.attn\.qkv\.bias"):
        load_model(path, dtype=torch.float32, vision=True)


def test_add_vision_tower_names_parameters_as_the_checkpoint():
    model = random_hf_model("dense-tied")
    ours = Qwen35ForCausalLM(Qwen35Config.from_hf_dict(model.config.to_dict()), device="meta")
    cfg = VisionConfig.from_hf_dict({"vision_config": {**CONFIGS["merge-2"]}})
    add_vision_tower(ours, cfg, device="meta")
    names = {n for n, _ in ours.named_parameters() if n.startswith("model.visual.")}
    hf_names = set(_random_tower("merge-2").state_dict())
    assert names == {f"model.visual.{n}" for n in hf_names}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tower_on_cuda_bf16_matches_fp32_cpu():
    hf = _random_tower("merge-2")
    model = _twin(hf)
    grids = [(1, 8, 12), (1, 2, 2)]
    pixels = torch.randn(100, model.config.patch_dim)
    ref = model(pixels, grids)
    gpu = _twin(hf).to("cuda", torch.bfloat16)
    gpu.init_buffers()
    out = gpu(pixels.cuda(), grids).float().cpu()
    assert ((out - ref).norm() / ref.norm()).item() < 2e-2


@pytest.mark.parametrize("keep", [OFFICIAL_NOT_CONVERT, ("lm_head",)], ids=["official", "bare"])
def test_fp8_quantisation_keeps_the_tower_dense(tmp_path, keep):
    """Whatever the scheme's keep list, the tower stays in the model dtype."""
    _, model, _, path = load_pair("section-3-3-2", tmp_path)
    fp8 = quantize_(load_model(path, dtype=torch.float32, vision=True), _scheme(keep))
    assert any(type(m).__name__ == "Fp8Linear" for m in fp8.model.layers.modules())
    dense = dict(model.model.visual.named_parameters())
    for n, p in fp8.model.visual.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p, dense[n]), n


def _scheme(keep: tuple[str, ...]) -> QuantScheme:
    return QuantScheme(FINE_GRAINED, (16, 16), keep, "weight_scale_inv")
