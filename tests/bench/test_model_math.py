"""The FLOP and byte counts behind the benchmarks' bounds, against hand counts of the shapes."""

from __future__ import annotations

import pytest

from ninfer.bench.model_math import prefill_flops
from ninfer.models.presets import PRESETS


def hand_matmul_params_per_token(cfg) -> int:
    """Matmul weights one prompt token multiplies, written out from the layer shapes (the LM
    head excluded: it projects only the rows whose logits are computed)."""
    h, hd = cfg.hidden_size, cfg.head_dim
    attn = h * cfg.num_attention_heads * hd * 2 + 2 * h * cfg.num_key_value_heads * hd
    attn += cfg.num_attention_heads * hd * h
    gdn = h * (cfg.conv_dim + cfg.value_dim + 2 * cfg.linear_num_value_heads)
    gdn += cfg.value_dim * h
    if cfg.is_moe:
        k, i = cfg.num_experts_per_tok, cfg.moe_intermediate_size
        mlp = (
            h * (cfg.num_experts + 1) + k * 3 * h * i + 3 * h * cfg.shared_expert_intermediate_size
        )
    else:
        mlp = 3 * h * cfg.intermediate_size
    layers = len(cfg.full_layer_ids) * attn + len(cfg.gdn_layer_ids) * gdn
    return layers + cfg.num_hidden_layers * mlp


@pytest.mark.parametrize("name", ["0.8B", "9B", "27B", "35B-A3B"])
def test_prefill_flops_count_the_lm_head_once_per_logits_row(name):
    cfg = PRESETS[name]
    lm_head = cfg.vocab_size * cfg.hidden_size
    tokens = 8192
    attn = 4 * cfg.num_attention_heads * cfg.head_dim * tokens * (tokens + 1) / 2
    attn *= len(cfg.full_layer_ids)
    gdn = 6 * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
    gdn *= tokens * len(cfg.gdn_layer_ids)
    expect = 2 * hand_matmul_params_per_token(cfg) * tokens + 2 * lm_head + attn + gdn
    got = prefill_flops(cfg, tokens)
    # conv taps and norm weights are parameters too, but no matmul: < 0.1 % of the count
    assert got == pytest.approx(expect, rel=1e-3)
    # each further logits row adds one LM-head product
    assert prefill_flops(cfg, tokens, logits_rows=3) - got == pytest.approx(4 * lm_head)
