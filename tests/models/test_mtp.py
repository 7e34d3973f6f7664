"""The MTP draft head (`ninfer.models.mtp`) against a reference written here: plain-PyTorch
(1 + w) norms and `fc` over [embedding; hidden], then transformers' own full-attention decoder
layer and final norm (a one-layer transformers model holding the head's `layers.0` and `norm`),
then the target's LM head. transformers has no MTP module of its own. Also: loading `mtp.*`
from a checkpoint, and the ValueError naming `speculative` for a checkpoint without it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM

from ninfer.models.config import Qwen35Config
from ninfer.models.mtp import add_mtp_head
from ninfer.models.qwen3_5 import Qwen35ForCausalLM
from ninfer.models.weights import load_model
from tests.models.hf_util import _torch_kernels, hf_config
from tests.models.util import Row, make_batch, make_cache


def _one_layer_hf(name: str, seed: int):
    """A random one-layer, full-attention transformers model: its layer and norm are the MTP
    head's, its embedding and LM head the target's."""
    cfg = hf_config(name)
    cfg.num_hidden_layers, cfg.layer_types = 1, ["full_attention"]
    torch.manual_seed(seed)
    cls = Qwen3_5MoeForCausalLM if getattr(cfg, "num_experts", 0) else Qwen3_5ForCausalLM
    model = cls(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            scale = 0.3 if p.dim() == 1 else (1.0 if "embed" in pname else p.shape[-1] ** -0.5)
            p.copy_(torch.randn_like(p) * scale)
    return model


def _with_head(hf) -> Qwen35ForCausalLM:
    """The ninfer model over hf's embedding and head (its own layer too), with an MTP head whose
    layers.0 and norm are hf's and whose fc and pre-fc norms are random."""
    cfg = Qwen35Config.from_hf_dict(hf.config.to_dict())
    model = Qwen35ForCausalLM(cfg)
    model.load_state_dict(hf.state_dict(), strict=True)
    head = add_mtp_head(model, torch.float32, "cpu")
    h = cfg.hidden_size
    sd = {"fc.weight": torch.randn(h, 2 * h) * (2 * h) ** -0.5,
          "pre_fc_norm_embedding.weight": torch.randn(h) * 0.3,
          "pre_fc_norm_hidden.weight": torch.randn(h) * 0.3}  # fmt: skip
    for key, t in hf.state_dict().items():
        if key.startswith("model.layers.0.") or key == "model.norm.weight":
            sd[key.removeprefix("model.")] = t
    head.load_state_dict(sd, strict=True)
    return model.eval()


def _rms1p(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


@torch.no_grad()
def _reference(model, hf, ids: list[int], hidden: torch.Tensor):
    """(logits, output hidden) of the head over positions 0 .. len(ids)-1 in one pass."""
    head, eps = model.mtp, model.config.rms_norm_eps
    e = _rms1p(hf.model.embed_tokens(torch.tensor(ids)), head.pre_fc_norm_embedding.weight, eps)
    h = _rms1p(hidden, head.pre_fc_norm_hidden.weight, eps)
    x = torch.cat([e, h], dim=-1) @ head.fc.weight.T
    with _torch_kernels(hf):
        out = hf.model(inputs_embeds=x[None], position_ids=torch.arange(len(ids))[None])
    out = out.last_hidden_state[0]
    return hf.lm_head(out), out


@pytest.mark.parametrize("name", ["dense-untied-odd", "moe-untied"])
@pytest.mark.parametrize("split", [0, 5, 64, 70])
def test_head_matches_the_reference_in_chunks(ref_ops, name, split):
    """The head over positions [0, n) as two rows in two passes, the first `split` positions
    then the rest (0: one pass), its K/V paged in its own cache entry, equals the one-pass
    reference: logits and the hidden state it feeds back."""
    hf = _one_layer_hf(name, seed=3)
    model = _with_head(hf)
    n, hsz = 90, model.config.hidden_size
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist()
    hidden = torch.randn(n, hsz, generator=gen)
    want_logits, want_out = _reference(model, hf, ids, hidden)
    cache = make_cache(model.config, num_pages=4, num_slots=1)
    cache.kv.append(torch.full_like(cache.kv[0], float("nan")))  # the head's entry
    cache.kv[0].zero_()  # the target's layer: never read by the head
    pages = [2, 0]
    got_logits, got_out = [], []
    for start, end in [(0, n)] if split == 0 else [(0, split), (split, n)]:
        batch = make_batch([Row(ids[start:end], start, 0, pages)])
        logits, out = model.mtp(batch, hidden[start:end], cache, ref_ops, model)
        got_logits.append(logits)
        got_out.append(out)
    assert not cache.kv[0].any()  # nothing written to the target's entry
    torch.testing.assert_close(torch.cat(got_out), want_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat(got_logits), want_logits, atol=1e-4, rtol=1e-4)


def _checkpoint(path, hf, model: Qwen35ForCausalLM, with_mtp: bool, per_expert: bool) -> None:
    """`model`'s tensors (its head's MoE experts per expert with `per_expert`), hf's config."""
    (path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    tensors = {}
    for key, t in model.state_dict().items():
        if key.startswith("mtp.") and not with_mtp:
            continue
        if per_expert and key.startswith("mtp.") and "experts." in key:
            for e, w in enumerate(t):
                if key.endswith("gate_up_proj"):
                    gate, up = w.chunk(2)
                    tensors[key.replace("gate_up_proj", f"{e}.gate_proj.weight")] = gate
                    tensors[key.replace("gate_up_proj", f"{e}.up_proj.weight")] = up
                else:
                    tensors[key.replace("down_proj", f"{e}.down_proj.weight")] = w
            continue
        tensors[key] = t.contiguous()
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize(
    ("name", "per_expert"), [("dense-untied-odd", False), ("moe-untied", True)]
)
def test_loader_reads_the_head_when_asked(tmp_path, name, per_expert):
    hf = _one_layer_hf(name, seed=5)
    model = _with_head(hf)
    _checkpoint(tmp_path, hf, model, with_mtp=True, per_expert=per_expert)
    loaded = load_model(tmp_path, torch.float32, "cpu", mtp=True)
    want = model.state_dict()
    got = loaded.state_dict()
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert load_model(tmp_path, torch.float32, "cpu").mtp is None  # skipped unless asked


def test_a_checkpoint_without_a_head_names_speculative(tmp_path):
    hf = _one_layer_hf("dense-untied-odd", seed=6)
    _checkpoint(tmp_path, hf, _with_head(hf), with_mtp=False, per_expert=False)
    with pytest.raises(ValueError, match="speculative"):
        load_model(tmp_path, torch.float32, "cpu", mtp=True)
