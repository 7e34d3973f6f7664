"""Bytes and FLOPs a Qwen3.5 forward must move or compute: the numerators of the bounds.

Decode bytes come from the model's own parameters (built on the meta device, so nothing is
allocated), which keeps them exact for dense and MoE shapes alike:

    decode step, batch B at context L:
        bytes = weights read once (MoE: experts touched, E * (1 - (1 - k/E)^B) expected)
              + B * L * kv_bytes_per_token            (K and V of every full-attention layer)
              + B * 2 * state_image_bytes             (GDN state read and written)

Prefill FLOPs are the package's one count, `ninfer.costs.PrefillShape` (its docstring has the
formula; the LM head multiplies only the rows whose logits are computed), which the scheduler
and the cache's cost model also price. tests/cache/test_cost_model.py holds it to the count
from the meta model's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.costs import PrefillShape
from ninfer.models.config import Qwen35Config


@dataclass(frozen=True, slots=True)
class ParamCounts:
    total: int  # every parameter (tied embeddings once)
    matmul: int  # parameters used as matmul weights per token, experts counted in full
    experts: int  # routed expert parameters (0 for dense)
    embed_lookup: int  # embedding rows read by lookup only (0 when tied to lm_head)
    lm_head: int  # LM head parameters (vocab x hidden; the embedding itself when tied)
    # bytes a decode step reads per matmul parameter when not the dtype's (FP8 weights: about
    # 1 plus the scales, from the loaded model's `quantize.weight_bytes`)
    weight_itemsize: float | None = None


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


def matmul_params_read(cfg: Qwen35Config, counts: ParamCounts, tokens: int = 1) -> float:
    """Matmul parameters a step over `tokens` tokens reads (MoE: the expected fraction of
    experts that `tokens` uniform top-k picks touch, 1 - (1 - k/E)^tokens)."""
    if not cfg.is_moe:
        return counts.matmul
    frac = 1.0 - (1.0 - cfg.num_experts_per_tok / cfg.num_experts) ** tokens
    return counts.matmul - counts.experts + counts.experts * frac


def decode_step_bytes(
    cfg: Qwen35Config, counts: ParamCounts, batch: int, context: int, itemsize: int,
    kv_itemsize: int,
) -> float:  # fmt: skip
    weights = matmul_params_read(cfg, counts, batch) * (counts.weight_itemsize or itemsize)
    kv = batch * context * cfg.kv_bytes_per_token(kv_itemsize)
    state = batch * 2 * cfg.state_image_bytes(itemsize)
    return weights + kv + state


def prefill_flops(cfg: Qwen35Config, tokens: int, cached: int = 0, logits_rows: int = 1) -> float:
    """FLOPs of one row's prefill of `tokens` tokens after `cached` (`PrefillShape.flops`);
    `logits_rows`: the rows the LM head projects (1: the prompt's last token)."""
    return PrefillShape.of(cfg).flops(tokens, cached, logits_rows)
