"""Bytes and FLOPs a Qwen3.5 forward must move or compute: the numerators of the bounds.

Counts come from the model's own parameters (built on the meta device, so nothing is
allocated), which keeps them exact for dense and MoE shapes alike.

    decode step, batch B at context L:
        bytes = weights read once (MoE: experts touched, E * (1 - (1 - k/E)^B) expected)
              + B * L * kv_bytes_per_token            (K and V of every full-attention layer)
              + B * 2 * state_image_bytes             (GDN state read and written)
    prefill of T tokens after L cached, logits for R of them (one per row: the last):
        flops = 2 * active matmul params except the LM head * T
              + 2 * LM head params * R                (the forward projects only those rows)
              + 4 * heads * head_dim * sum over full layers of the attended keys (causal)
              + 6 * Hv * dk * dv * T per GDN layer    (state update and read-out)

The LM head (vocab x hidden: 11 % of the 9B's matmul parameters, 5 % of the 27B's) multiplies
only the rows whose logits are computed. Counting it for every prompt token would overstate
prefill FLOPs by those fractions.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.models.config import Qwen35Config


@dataclass(frozen=True, slots=True)
class ParamCounts:
    total: int  # every parameter (tied embeddings once)
    matmul: int  # parameters used as matmul weights per token, experts counted in full
    experts: int  # routed expert parameters (0 for dense)
    embed_lookup: int  # embedding rows read by lookup only (0 when tied to lm_head)
    lm_head: int  # LM head parameters (vocab x hidden; the embedding itself when tied)


def param_counts(cfg: Qwen35Config) -> ParamCounts:
    from ninfer.models.qwen3_5 import Qwen35ForCausalLM

    model = Qwen35ForCausalLM(cfg, device="meta")
    total = experts = embed = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if ".mlp.experts." in name:
            experts += p.numel()
        if name.endswith("embed_tokens.weight") and not cfg.tie_word_embeddings:
            embed += p.numel()
    lm_head = cfg.vocab_size * cfg.hidden_size
    return ParamCounts(
        total=total, matmul=total - embed, experts=experts, embed_lookup=embed, lm_head=lm_head
    )


def active_matmul_params(cfg: Qwen35Config, counts: ParamCounts, tokens: int = 1) -> float:
    """Matmul parameters touched by `tokens` tokens (MoE: the expected fraction of experts that
    `tokens` uniform top-k picks touch, 1 - (1 - k/E)^tokens)."""
    if not cfg.is_moe:
        return counts.matmul
    frac = 1.0 - (1.0 - cfg.num_experts_per_tok / cfg.num_experts) ** tokens
    return counts.matmul - counts.experts + counts.experts * frac


def decode_step_bytes(
    cfg: Qwen35Config, counts: ParamCounts, batch: int, context: int, itemsize: int,
    kv_itemsize: int,
) -> float:  # fmt: skip
    weights = active_matmul_params(cfg, counts, batch) * itemsize
    kv = batch * context * cfg.kv_bytes_per_token(kv_itemsize)
    state = batch * 2 * cfg.state_image_bytes(itemsize)
    return weights + kv + state


def prefill_flops(
    cfg: Qwen35Config, counts: ParamCounts, tokens: int, cached: int = 0, logits_rows: int = 1
) -> float:
    """FLOPs of one row's prefill of `tokens` tokens after `cached` (module docstring);
    `logits_rows`: the rows the LM head projects (1: the prompt's last token)."""
    matmul = counts.matmul - counts.lm_head  # per token: each meets top_k of the E experts
    if cfg.is_moe:
        matmul -= counts.experts * (1 - cfg.num_experts_per_tok / cfg.num_experts)
    attended = tokens * cached + tokens * (tokens + 1) / 2
    attn = 4 * cfg.num_attention_heads * cfg.head_dim * attended * len(cfg.full_layer_ids)
    gdn = 6 * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
    head = 2 * counts.lm_head * min(logits_rows, tokens)
    return 2 * matmul * tokens + head + attn + gdn * tokens * len(cfg.gdn_layer_ids)
