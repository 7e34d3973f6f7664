"""Qwen3.5's interleaved multimodal RoPE: the per-frequency positions the model builds from
(t, h, w) (`Qwen35Config.rope_axes`, `Qwen35ForCausalLM.rope_positions`) give transformers'
`Qwen3_5TextRotaryEmbedding` cos / sin exactly, for several `mrope_section`s and rotary widths;
the ops' per-frequency RoPE equals the 1-D RoPE when the axes agree; the config fields."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

from ninfer.models.config import Qwen35Config
from ninfer.models.qwen3_5 import Qwen35ForCausalLM
from ninfer.ops.reference import ReferenceOps, rope_cos_sin
from tests.models.hf_util import hf_config
from tests.models.util import Row, make_batch


def _config(head_dim: int, partial: float, section: list[int] | None) -> Qwen3_5TextConfig:
    rope = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": partial}
    if section is not None:
        rope |= {"mrope_section": section, "mrope_interleaved": True}
    return Qwen3_5TextConfig(
        vocab_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=head_dim, rope_parameters=rope,
    )  # fmt: skip


@pytest.mark.parametrize(
    "head_dim,partial,section",
    [(256, 0.25, None), (256, 0.25, [11, 11, 10]), (32, 0.5, [3, 3, 2]), (64, 0.5, [4, 2, 10]),
     (16, 1.0, [1, 1, 6])],
)  # fmt: skip
def test_cos_sin_match_transformers(head_dim, partial, section):
    hf_cfg = _config(head_dim, partial, section)
    cfg = Qwen35Config.from_hf_dict(hf_cfg.to_dict())
    model = Qwen35ForCausalLM(cfg)
    pos3 = torch.randint(0, 5000, (3, 50), generator=torch.Generator().manual_seed(0))
    batch = make_batch([Row(list(range(50)), 0, 0, [0])])
    batch.mrope_positions = pos3
    rotary = Qwen3_5TextRotaryEmbedding(hf_cfg)
    want_cos, want_sin = rotary(torch.zeros(1, dtype=torch.float32), pos3[:, None])
    cos, sin = rope_cos_sin(model.rope_positions(batch), model.model.inv_freq, torch.float32)
    assert torch.equal(cos, want_cos[0]) and torch.equal(sin, want_sin[0])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 300_000), min_size=1, max_size=20))
def test_equal_axes_are_the_1d_rope(positions):
    """Text tokens (t = h = w): the per-frequency path is the 1-D path, bit for bit."""
    cfg = Qwen35Config.from_hf_dict(hf_config("dense-untied-odd").to_dict())
    model = Qwen35ForCausalLM(cfg)
    ref_ops = ReferenceOps()
    g = torch.Generator().manual_seed(len(positions))
    q, k = torch.randn(len(positions), 4, 32, generator=g), torch.randn(len(positions), 2, 32)
    pos = torch.tensor(positions)
    batch = make_batch([Row([0] * len(positions), 0, 0, [0])])
    batch.mrope_positions = pos.expand(3, -1)
    per_freq = model.rope_positions(batch)
    assert per_freq.shape == (len(positions), cfg.rotary_dim // 2)
    got = ref_ops.rope(q, k, per_freq, model.model.inv_freq, cfg.rotary_dim)
    want = ref_ops.rope(q, k, pos, model.model.inv_freq, cfg.rotary_dim)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_config_fields():
    cfg = Qwen35Config.from_hf_dict(_config(256, 0.25, None).to_dict())
    assert cfg.mrope_section == (11, 11, 10) and cfg.to_dict()["mrope_section"] == [11, 11, 10]
    assert cfg.rope_axes[:7] == (0, 1, 2, 0, 1, 2, 0) and len(cfg.rope_axes) == 32
    assert cfg.rope_axes[29:] == (2, 0, 1)
    cfg = Qwen35Config.from_hf_dict(_config(64, 0.5, [4, 2, 10]).to_dict())
    assert cfg.rope_axes == (0, 1, 2, 0, 1, 2, 0, 0, 2, 0, 0, 2, 0, 0, 2, 0)  # h stops at 3 * 2
    raw = _config(32, 0.5, [3, 3, 2]).to_dict()
    for bad, match in (({"mrope_interleaved": False}, "mrope_interleaved"),
                       ({"mrope_section": [8, 8]}, "mrope_section")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            Qwen35Config.from_hf_dict({**raw, "rope_parameters": {**raw["rope_parameters"], **bad}})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_ops_take_per_frequency_positions():
    """`CudaOps.qk_norm_rope` with [T, R/2] positions runs the torch path (its Triton kernel
    reads 1-D positions): the reference's result, bit for bit; with t = h = w, the Triton
    kernel's 1-D result within bf16 rounding."""
    for module in ("flashinfer", "fla", "triton"):
        pytest.importorskip(module)
    from ninfer.ops.cuda import CudaOps

    cfg = Qwen35Config.from_hf_dict(_config(256, 0.25, None).to_dict())
    model = Qwen35ForCausalLM(cfg, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(37, h, 256, device="cuda", generator=g).bfloat16() for h in (4, 2))
    wq, wk = (torch.randn(256, device="cuda", generator=g).bfloat16() * 0.1 for _ in "qk")
    pos3 = torch.randint(0, 100_000, (3, 37), device="cuda", generator=g)
    batch = make_batch([Row(list(range(37)), 0, 0, [0])], device="cuda")
    batch.mrope_positions = pos3
    args = (wq, wk, 1e-6, model.rope_positions(batch), model.model.inv_freq, cfg.rotary_dim)
    got = CudaOps("cuda").qk_norm_rope(q, k, *args)
    want = ReferenceOps().qk_norm_rope(q, k, *args)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    batch.mrope_positions = pos3[:1].expand(3, -1)
    per_freq = CudaOps("cuda").qk_norm_rope(q, k, *args[:3], model.rope_positions(batch), *args[4:])
    one_d = CudaOps("cuda").qk_norm_rope(q, k, *args[:3], pos3[0], *args[4:])
    for a, b in zip(per_freq, one_d, strict=True):
        assert ((a.float() - b.float()).norm() / b.float().norm()).item() < 1e-2
