"""FP8 checkpoints built the official way (`tests.models.fp8_fixtures`): they load, their logits
equal those of the dense model they stand for, transformers agrees where it can load them, the
engine generates the same greedy tokens, and a malformed config or a missing scale is a
ValueError naming it.

Tolerance: on the CPU in fp32 the FP8 model's reference linear multiplies by exactly the dense
model's weights (e4m3 value times its scale, in fp32), so the logits agree to fp32 reduction
order: max |diff| <= 1e-5 (in practice 0). In bf16 both round the same fp32 products to bf16.
transformers (which dequantises FP8 checkpoints on the CPU; it needs accelerate) agrees within
1e-4 on logits of about 10 (its own fp32 kernels: 1e-5 in practice).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer.models.fp8 import Fp8Linear
from ninfer.models.weights import load_model
from tests.models.fp8_fixtures import SHAPES, dequantized_checkpoint, write_fp8_checkpoint
from tests.models.hf_util import CONFIGS, hf_logits, random_hf_model
from tests.models.util import Row, make_batch, make_cache

IDS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]
TOL = 1e-5


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(kind, shape) -> (fp8 dir, dense dir, transformers model), built on first use."""
    made = {}

    def get(kind: str, shape: str):
        if (kind, shape) not in made:
            with pytest.MonkeyPatch.context() as mp:
                mp.setitem(CONFIGS, shape, SHAPES[shape])
                hf = random_hf_model(shape)
            root = tmp_path_factory.mktemp(f"{kind}-{shape}")
            write_fp8_checkpoint(root / "fp8", hf, kind)
            dequantized_checkpoint(root / "fp8", root / "dense")
            made[kind, shape] = (root / "fp8", root / "dense", hf)
        return made[kind, shape]

    return get


def _logits(model, ids=IDS, dtype=torch.float32):
    from ninfer.ops.reference import ReferenceOps

    cache = make_cache(model.config, num_pages=2, num_slots=1, dtype=dtype)
    return model(make_batch([Row(ids, 0, 0, [1])]), cache, ReferenceOps())


@pytest.mark.parametrize("kind", ["fine", "compressed"])
@pytest.mark.parametrize("shape", ["dense-fp8", "moe-fp8"])
def test_fp8_checkpoint_equals_the_dense_model(checkpoints, kind, shape):
    fp8_dir, dense_dir, _ = checkpoints(kind, shape)
    fp8 = load_model(fp8_dir, torch.float32)
    dense = load_model(dense_dir, torch.float32)
    attn = fp8.model.layers[1].self_attn
    assert isinstance(attn.o_proj, Fp8Linear)
    assert attn.o_proj.weight.dtype == torch.float8_e4m3fn
    assert (_logits(fp8) - _logits(dense)).abs().max() <= TOL
    fp8.fuse_projections()
    dense.fuse_projections()
    assert (_logits(fp8) - _logits(dense)).abs().max() <= TOL
    bf16 = torch.bfloat16
    got = _logits(load_model(fp8_dir, bf16), dtype=bf16)
    assert torch.equal(got, _logits(load_model(dense_dir, bf16), dtype=bf16))


def test_fine_grained_layout_follows_the_not_convert_list(checkpoints):
    fp8 = load_model(checkpoints("fine", "moe-fp8")[0], torch.float32)
    gdn, moe = fp8.model.layers[0].linear_attn, fp8.model.layers[0].mlp
    assert isinstance(gdn.in_proj_qkv, Fp8Linear) and isinstance(gdn.out_proj, Fp8Linear)
    assert not isinstance(gdn.in_proj_a, Fp8Linear)
    assert isinstance(moe.shared_expert.gate_proj, Fp8Linear)
    assert moe.experts.blocks == {"gate_up_proj": (32, 32), "down_proj": (32, 32)}
    assert moe.experts.gate_up_proj_scale_inv.dtype == torch.float32  # bf16 in the file
    assert not isinstance(fp8.lm_head, Fp8Linear)


def test_compressed_layout_follows_the_ignore_list(checkpoints):
    fp8 = load_model(checkpoints("compressed", "moe-fp8")[0], torch.float32)
    gdn, moe = fp8.model.layers[0].linear_attn, fp8.model.layers[0].mlp
    assert not isinstance(gdn.in_proj_qkv, Fp8Linear)
    assert not isinstance(moe.shared_expert.gate_proj, Fp8Linear)
    assert moe.experts.blocks == {"gate_up_proj": (1, 64), "down_proj": (1, 32)}
    attn = fp8.model.layers[1].self_attn
    assert isinstance(attn.q_proj, Fp8Linear) and attn.q_proj.weight_scale_inv.shape == (128, 1)


@pytest.mark.parametrize("shape", ["dense-fp8", "moe-fp8"])
def test_transformers_agrees_on_the_fine_grained_checkpoint(checkpoints, shape):
    pytest.importorskip("accelerate", reason="transformers loads FP8 checkpoints via accelerate")
    from transformers import AutoConfig, AutoModelForCausalLM

    fp8_dir = checkpoints("fine", shape)[0]
    config = AutoConfig.from_pretrained(fp8_dir)
    hf = AutoModelForCausalLM.from_pretrained(fp8_dir, config=config, dtype=torch.float32)
    ours = load_model(fp8_dir, torch.float32)
    assert (_logits(ours) - hf_logits(hf.eval(), IDS)).abs().max() < 1e-4


@pytest.mark.parametrize("kind", ["fine", "compressed"])
def test_engine_greedy_tokens_equal_the_dense_model(checkpoints, kind):
    from ninfer.llm import LLM
    from ninfer.request import SamplingParams

    fp8_dir, dense_dir, _ = checkpoints(kind, "moe-fp8")
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [{"prompt_token_ids": IDS}, {"prompt_token_ids": IDS[:7]}]
    opts = dict(device="cpu", host_cache_mib=0, max_concurrency=2, kv_capacity=1024)
    with LLM(str(fp8_dir), **opts) as llm:
        got = [o.token_ids for o in llm.generate(prompts, params)]
    with LLM(str(dense_dir), **opts) as llm:
        want = [o.token_ids for o in llm.generate(prompts, params)]
    assert got == want and len(got[0]) == 12


def test_quantization_fp8_quantises_a_dense_checkpoint_at_load(checkpoints):
    from ninfer.llm import LLM

    dense_dir = checkpoints("fine", "dense-fp8")[1]
    model = load_model(dense_dir, torch.float32, quantization="fp8")
    assert isinstance(model.model.layers[0].linear_attn.in_proj_z, Fp8Linear)
    assert model.model.layers[0].linear_attn.in_proj_z.block == (128, 128)
    with pytest.raises(ValueError, match="quantization"):
        load_model(dense_dir, torch.float32, quantization="int4")
    with pytest.raises(ValueError, match="quantization"):
        LLM(str(dense_dir), device="cpu", quantization="fp4")


def _dense_target_bytes(model) -> tuple[int, int]:
    """(bytes of the loaded dense weights of the modules `quantization="fp8"` converts, the
    largest such module's dense bytes)."""
    from ninfer.models.quant import on_the_fly
    from ninfer.models.quantize import fp8_targets

    linears, experts = fp8_targets(model, on_the_fly("fp8"))
    sizes = []
    for name in [*linears, *experts]:
        module = model.get_submodule(name)
        if getattr(module, "blocks", None):
            continue  # experts already FP8
        params = [p for p in module.parameters() if not p.is_meta]
        sizes.append(sum(p.numel() * p.element_size() for p in params))
    return sum(sizes), max(sizes, default=0)


@pytest.mark.parametrize("shape", ["dense-fp8", "moe-fp8"])
def test_quantization_fp8_never_holds_the_dense_model(checkpoints, monkeypatch, shape):
    """`quantization="fp8"` makes each module FP8 as soon as its weights load: at no point of
    the load does the model hold the dense weights of more than one module it converts (peak
    memory is the FP8 model plus one module, not the dense model), and the result is the
    dense model quantised after a full load, bit for bit."""
    from ninfer.models import weights
    from ninfer.models.quant import on_the_fly
    from ninfer.models.quantize import quantize_

    dense_dir = checkpoints("fine", shape)[1]
    seen = []
    add = weights._Loader.add

    def spy(self, key, source):
        add(self, key, source)
        seen.append(_dense_target_bytes(self.model)[0])

    whole = _dense_target_bytes(load_model(dense_dir, torch.float32))
    monkeypatch.setattr(weights._Loader, "add", spy)
    model = load_model(dense_dir, torch.float32, quantization="fp8")
    monkeypatch.undo()
    assert seen and max(seen) <= whole[1] < whole[0], (max(seen), whole)
    want = quantize_(load_model(dense_dir, torch.float32), on_the_fly("fp8")).state_dict()
    got = model.state_dict()
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name].view(torch.uint8), value.view(torch.uint8)), name


def _rewrite(src, dst, edit_tensors=None, edit_config=None):
    dst.mkdir()
    tensors = load_file(str(src / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config["quantization_config"])
    save_file(tensors, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(config))


SCALE = "model.language_model.layers.1.self_attn.o_proj.weight_scale_inv"
EXPERT_SCALE = "model.language_model.layers.0.mlp.experts.3.up_proj.weight_scale_inv"


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda t: t.pop(SCALE), SCALE.replace("language_model.", "")),
        (lambda t: t.pop(EXPERT_SCALE), EXPERT_SCALE.replace("language_model.", "")),
        (lambda t: t.update({SCALE: t[SCALE][:1]}), SCALE),
        (lambda t: t.update({EXPERT_SCALE: t[EXPERT_SCALE].T}), EXPERT_SCALE),
        (
            lambda t: t.update(
                {SCALE.removesuffix("_scale_inv"): t[SCALE.removesuffix("_scale_inv")].float()}
            ),
            "o_proj.weight",
        ),  # fmt: skip
    ],
    ids=["missing", "missing-expert", "shape", "expert-shape", "dense-for-fp8"],
)
def test_missing_or_misshaped_scale_names_the_tensor(checkpoints, tmp_path, edit, match):
    _rewrite(checkpoints("fine", "moe-fp8")[0], tmp_path / "bad", edit_tensors=edit)
    with pytest.raises(ValueError, match=match.replace(".", r"\.")):
        load_model(tmp_path / "bad", torch.float32)


def test_missing_compressed_scale_names_it(checkpoints, tmp_path):
    key = "model.language_model.layers.1.self_attn.q_proj.weight_scale"
    _rewrite(checkpoints("compressed", "dense-fp8")[0], tmp_path / "bad",
             edit_tensors=lambda t: t.pop(key))  # fmt: skip
    with pytest.raises(ValueError, match=r"layers\.1\.self_attn\.q_proj\.weight_scale'"):
        load_model(tmp_path / "bad", torch.float32)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda qc: qc.update(weight_block_size=[32]), "weight_block_size"),
        (lambda qc: qc.update(fmt="e5m2"), "fmt"),
        (lambda qc: qc.update(quant_method="gptq"), "quant_method"),
        # the list no longer keeps in_proj_a: its bf16 weight meets an FP8 module
        (lambda qc: qc.update(modules_to_not_convert=["lm_head"]), "in_proj_a.weight"),
    ],
)
def test_malformed_config_is_a_value_error_naming_it(checkpoints, tmp_path, edit, match):
    _rewrite(checkpoints("fine", "dense-fp8")[0], tmp_path / "bad", edit_config=edit)
    with pytest.raises(ValueError, match=match):
        load_model(tmp_path / "bad", torch.float32)


def test_fp8_checkpoint_with_quantization_fp8_loads_as_it_is(checkpoints):
    fp8_dir = checkpoints("fine", "dense-fp8")[0]
    model = load_model(fp8_dir, torch.float32, quantization="fp8")
    assert model.quant_scheme.block == (32, 32)  # the checkpoint's, not re-quantised
    with pytest.raises(ValueError, match="quantization"):
        load_model(fp8_dir, torch.float32, quantization="int4")


def test_a_layer_without_expert_scales_names_them(checkpoints, tmp_path):
    prefix = "model.language_model.layers.0.mlp.experts."

    def drop(tensors):
        for key in [k for k in tensors if k.startswith(prefix) and k.endswith("_scale_inv")]:
            del tensors[key]

    _rewrite(checkpoints("fine", "moe-fp8")[0], tmp_path / "bad", edit_tensors=drop)
    with pytest.raises(
        ValueError, match=r"layers\.0\.mlp\.experts\.0\.gate_proj\.weight_scale_inv"
    ):
        load_model(tmp_path / "bad", torch.float32)


@pytest.mark.parametrize("shape", ["dense-fp8", "moe-fp8"])
def test_fp8_checkpoint_with_its_mtp_head(tmp_path, shape):
    """An FP8 checkpoint laid out as the releases are, with its MTP head (`mtp.*`: attention,
    MLP or per-expert projections FP8 with `weight_scale_inv`; `mtp.fc`, norms and router
    bf16) loads with mtp=True: the head's projections are FP8, `mtp.fc` is not, and the
    head's logits and output hidden states equal those of the dense checkpoint it stands
    for, as the target's do."""
    from ninfer.models.config import Qwen35Config
    from ninfer.models.mtp import add_mtp_head
    from ninfer.models.qwen3_5 import Qwen35ForCausalLM
    from ninfer.ops.reference import ReferenceOps

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(CONFIGS, shape, SHAPES[shape])
        hf = random_hf_model(shape, seed=4)
    holder = Qwen35ForCausalLM(Qwen35Config.from_hf_dict(hf.config.to_dict()), device="meta")
    head = add_mtp_head(holder, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, p in head.named_parameters():
            scale = 0.3 if p.dim() == 1 else p.shape[-1] ** -0.5
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    mtp = {f"mtp.{k}": v for k, v in head.state_dict().items()}
    write_fp8_checkpoint(tmp_path / "fp8", hf, "fine", mtp=mtp)
    dequantized_checkpoint(tmp_path / "fp8", tmp_path / "dense")
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert "mtp.fc" in config["quantization_config"]["modules_to_not_convert"]
    fp8 = load_model(tmp_path / "fp8", torch.float32, mtp=True)
    dense = load_model(tmp_path / "dense", torch.float32, mtp=True)
    attn = fp8.mtp.layers[0].self_attn
    assert isinstance(attn.q_proj, Fp8Linear) and not isinstance(fp8.mtp.fc, Fp8Linear)
    ops = ReferenceOps()
    out = []
    for model in (fp8, dense):
        cache = make_cache(model.config, num_pages=2, num_slots=1)
        cache.kv.append(torch.full_like(cache.kv[0], float("nan")))  # the head's entry
        logits, hidden = model.forward_hidden(make_batch([Row(IDS, 0, 0, [1])]), cache, ops)
        batch = make_batch([Row(IDS[1:], 0, 0, [1])])  # head position p: token p + 1
        head_logits, head_out = model.mtp(batch, hidden[:-1], cache, ops, model)
        out.append((logits, head_logits, head_out))
    for got, want in zip(*out, strict=True):
        assert (got - want).abs().max() <= TOL
