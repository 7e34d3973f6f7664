"""ninfer logits equal transformers' Qwen3_5(Moe)ForCausalLM (fp32, eager) within 1e-4, in one
pass and when the same sequences run as ragged batches of prefill chunks and decode rows."""

from __future__ import annotations

import random

import pytest
import torch

from ninfer.ops.reference import ReferenceOps
from tests.models.hf_util import CONFIGS, hf_logits, ninfer_twin, random_hf_model
from tests.models.util import ChunkRunner, Row, make_batch, make_cache

TOL = 1e-4
# An MoE config whose shared expert has the routed experts' size (as Qwen3.5-35B-A3B's), the
# case `CudaOps.moe_block` runs as one more expert pair; registered only for the tests below.
MOE_EQUAL = "moe-equal-shared"
MOE_EQUAL_KWARGS = dict(
    vocab_size=89, hidden_size=32, num_hidden_layers=2, full_attention_interval=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
    linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=8,
    num_experts_per_tok=3, moe_intermediate_size=16, shared_expert_intermediate_size=16,
    tie_word_embeddings=False,
)  # fmt: skip
MOE_NAMES = [name for name, (moe, _) in CONFIGS.items() if moe] + [MOE_EQUAL]


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request):
    hf = random_hf_model(request.param, seed=len(request.param))
    return hf, ninfer_twin(hf)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def test_one_pass_matches_transformers(pair, ref_ops):
    hf, model = pair
    ids = torch.randint(
        0, model.config.vocab_size, (2, 37), generator=torch.Generator().manual_seed(1)
    )
    want = [hf_logits(hf, seq.tolist()) for seq in ids]
    assert want[0].abs().max() > 1.0  # logits are not degenerate
    cache = make_cache(model.config, num_pages=4, num_slots=3)
    rows = [Row(ids[0].tolist(), 0, 2, [3]), Row(ids[1].tolist(), 0, 0, [1])]
    got = model(make_batch(rows), cache, ref_ops)
    assert got.dtype == torch.float32 and got.shape == (74, model.config.vocab_size)
    assert _max_diff(got[:37], want[0]) < TOL
    assert _max_diff(got[37:], want[1]) < TOL


def _random_schedule(lengths: list[int], rng: random.Random) -> list[list[tuple[int, int]]]:
    """Steps of (sequence, n_tokens): prefill chunks of random size (not multiples of 64),
    then single-token decode rows, sequences joining and finishing at different steps."""
    done = [0] * len(lengths)
    prompt = [max(1, n - rng.randint(0, 4)) for n in lengths]  # the rest is decoded 1 by 1
    steps = []
    while any(d < n for d, n in zip(done, lengths, strict=True)):
        step = []
        for s, n in enumerate(lengths):
            if done[s] >= n or rng.random() < 0.3:
                continue
            size = min(rng.choice([1, 3, 17, 50, 64, 71]), prompt[s] - done[s])
            size = size if done[s] < prompt[s] else 1
            step.append((s, size))
            done[s] += size
        if step:
            rng.shuffle(step)
            steps.append(step)
    return steps


@pytest.mark.parametrize("seed", [0, 1])
def test_ragged_chunks_match_one_pass(pair, ref_ops, seed):
    hf, model = pair
    rng = random.Random(seed)
    lengths = [150, 97, 1, 5, 66]
    seqs = [[rng.randrange(model.config.vocab_size) for _ in range(n)] for n in lengths]
    cache = make_cache(model.config, num_pages=16, num_slots=8)
    runner = ChunkRunner(model, cache, ref_ops, num_slots=8, seed=seed)
    for s, tokens in enumerate(seqs):
        runner.add(s, tokens)
    got: list[list[torch.Tensor]] = [[] for _ in seqs]
    for step in _random_schedule(lengths, rng):
        for s, logits in runner.step(step).items():
            got[s].append(logits)
    for s, tokens in enumerate(seqs):
        assert _max_diff(torch.cat(got[s]), hf_logits(hf, tokens)) < TOL, f"sequence {s}"


def test_logits_indices_and_before_layer(pair, ref_ops):
    _, model = pair
    ids = list(range(1, 12))
    cache = make_cache(model.config, num_pages=2, num_slots=1)
    full = model(make_batch([Row(ids, 0, 0, [1])]), cache, ref_ops)
    calls = []
    batch = make_batch([Row(ids, 0, 0, [0])], logits_indices=[10, 3])
    batch.before_layer = calls.append
    picked = model(batch, cache, ref_ops)
    assert calls == list(range(model.config.num_hidden_layers))
    assert _max_diff(picked, full[[10, 3]]) < 1e-5


def test_fused_projections_match_transformers(pair, ref_ops):
    """`fuse_projections` keeps names, state_dict and outputs: the parameters become views of
    one weight per group, a second call changes nothing, logits still match transformers."""
    hf, _ = pair
    model = ninfer_twin(hf)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.fuse_projections()
    fused = {
        id(layer): (layer.self_attn.qkv_proj if layer.is_full else layer.linear_attn.in_proj)
        for layer in model.model.layers
    }
    model.fuse_projections()  # idempotent: the same fused tensors
    for layer in model.model.layers:
        mixer = layer.self_attn if layer.is_full else layer.linear_attn
        now = mixer.qkv_proj if layer.is_full else mixer.in_proj
        assert now is fused[id(layer)]
        first = mixer.q_proj if layer.is_full else mixer.in_proj_qkv
        assert first.weight.data_ptr() == now.data_ptr()  # a view, no copy kept
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    ids = torch.randint(
        0, model.config.vocab_size, (45,), generator=torch.Generator().manual_seed(2)
    )
    cache = make_cache(model.config, num_pages=4, num_slots=2)
    got = model(make_batch([Row(ids.tolist(), 0, 1, [2])]), cache, ref_ops)
    assert _max_diff(got, hf_logits(hf, ids.tolist())) < TOL


def test_fused_weight_falls_back_when_parameters_are_replaced(pair, ref_ops):
    """Replacing one parameter of a fused group (a reload that assigns new tensors) makes the
    layer use the separate weights again, never the stale fused copy."""
    hf, _ = pair
    model = ninfer_twin(hf)
    model.fuse_projections()
    layer = next(x for x in model.model.layers if not x.is_full)
    gdn = layer.linear_attn
    gdn.in_proj_z.weight = torch.nn.Parameter(torch.zeros_like(gdn.in_proj_z.weight))
    x = torch.randn(3, model.config.hidden_size)
    _, z, _, _ = gdn._project(x, ref_ops)
    assert torch.equal(z, torch.zeros_like(z))


class _CountingOps(ReferenceOps):
    """ReferenceOps that count the MoE op calls."""

    def __init__(self) -> None:
        self.calls = {"moe": 0, "moe_block": 0}

    def moe(self, *args):
        self.calls["moe"] += 1
        return super().moe(*args)

    def moe_block(self, *args):
        self.calls["moe_block"] += 1
        return super().moe_block(*args)


def _moe_hf(name: str):
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(CONFIGS, MOE_EQUAL, (True, MOE_EQUAL_KWARGS))
        return random_hf_model(name, seed=len(name))


@pytest.mark.parametrize("name", MOE_NAMES)
def test_fused_moe_block_matches_transformers(name):
    """After `fuse_projections` the router and the shared expert's gate are row views of one
    weight [E + 1, H], and every MoE block is one `ops.moe_block`, bit for bit the separate ops
    (reference ops; the shared expert's gate | up fused in both, since one GEMM split by rows
    may round differently on the CPU from two); logits still match transformers."""
    hf = _moe_hf(name)
    unfused, model = ninfer_twin(hf), ninfer_twin(hf)
    model.fuse_projections()
    for layer in unfused.model.layers:  # the shared expert's gate | up, as before the MoE block
        layer.mlp.shared_expert.fuse()
    cfg = model.config
    for layer in model.model.layers:
        mlp = layer.mlp
        assert mlp.router.shape == (cfg.num_experts + 1, cfg.hidden_size)
        assert mlp.gate.weight.data_ptr() == mlp.router.data_ptr()
        assert mlp.shared_expert_gate.weight.data_ptr() == mlp.router[-1].data_ptr()
    ops = _CountingOps()
    x = torch.randn(7, cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # as the model's forward
        for fused_layer, layer in zip(model.model.layers, unfused.model.layers, strict=True):
            assert torch.equal(fused_layer.mlp(x, ops), layer.mlp(x, ops))
    layers = cfg.num_hidden_layers
    assert ops.calls == {"moe": layers, "moe_block": layers}
    ids = torch.randint(0, cfg.vocab_size, (29,), generator=torch.Generator().manual_seed(4))
    cache = make_cache(cfg, num_pages=4, num_slots=2)
    got = model(make_batch([Row(ids.tolist(), 0, 1, [2])]), cache, ops)
    assert ops.calls["moe"] == layers  # the model took the fused block everywhere
    assert _max_diff(got, hf_logits(hf, ids.tolist())) < TOL


@pytest.mark.parametrize("part", ["shared_expert_gate", "shared_expert.up_proj"])
def test_fused_moe_falls_back_when_parameters_are_replaced(part):
    """Replacing a parameter of the fused router or of the shared expert's gate | up makes the
    block use the separate ops again, with the new weight; fusing again restores the block."""
    hf = _moe_hf(MOE_EQUAL)
    model, plain_model = ninfer_twin(hf), ninfer_twin(hf)
    model.fuse_projections()
    moe, plain = model.model.layers[0].mlp, plain_model.model.layers[0].mlp
    plain.shared_expert.fuse()
    new = torch.randn_like(moe.get_submodule(part).weight)
    for m in (moe, plain):  # in both, the shared expert's gate | up stay fused only if valid
        m.get_submodule(part).weight = torch.nn.Parameter(new.clone())
    ops = _CountingOps()
    x = torch.randn(5, model.config.hidden_size)
    with torch.no_grad():
        assert torch.equal(moe(x, ops), plain(x, ops))
        assert ops.calls == {"moe": 2, "moe_block": 0}
        model.fuse_projections()
        plain.shared_expert.fuse()
        assert torch.equal(moe(x, ops), plain(x, ops))
    assert ops.calls["moe_block"] == 1
