"""The checkpoints' multi-token-prediction (MTP) draft head: `mtp.*`.

One more decoder step on top of the target model, predicting the token after next:

    e = rms_norm(embed_tokens[t_{p+1}], mtp.pre_fc_norm_embedding)     (1 + w) norms
    h = rms_norm(hidden_p,              mtp.pre_fc_norm_hidden)         hidden_p: the target's
    x = mtp.fc(cat[e, h])                                               final-norm hidden state
    x = mtp.layers.0(x, position p)       one full-attention layer (MoE on MoE checkpoints),
                                          its K/V in its own entry of the paged KV cache
    o = rms_norm(x + residual, mtp.norm)  -> logits = lm_head(o)   (the target's head)

Position p of the head reads the target's hidden state at p and the embedding of the token at
p + 1, so its K/V lag the target's by one token. A chain of drafts feeds `o` back as the next
step's `hidden` with the embedding of the token just drafted. The head has no embedding or LM
head of its own: `forward` is handed the target's. Attribute names mirror the checkpoint keys.

A trimmed draft vocabulary (`set_vocab`) scores only the LM head's first n rows (a view: no
copy) and a few more ids (their rows copied): the logits' column j is then token `d2t[j]`.

Knows nothing about drafting, acceptance or the engine (`ninfer.engine.speculative`).
"""

from __future__ import annotations

import torch
from torch import nn

from ninfer.forward import ForwardBatch, ModelCache
from ninfer.models.config import Qwen35Config
from ninfer.models.qwen3_5 import DecoderLayer, Qwen35ForCausalLM, RMSNorm, weight_of
from ninfer.ops.base import Ops


class Qwen35MTP(nn.Module):
    """`mtp.*`: pre_fc_norm_embedding, pre_fc_norm_hidden, fc [H, 2H], layers.0, norm.
    `kv_index`: the head's attention layer's entry in `cache.kv` (after the target's)."""

    def __init__(self, cfg: Qwen35Config, kv_index: int, factory: dict) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.pre_fc_norm_embedding = RMSNorm(h, eps, **factory)
        self.pre_fc_norm_hidden = RMSNorm(h, eps, **factory)
        self.fc = nn.Linear(2 * h, h, bias=False, **factory)
        self.layers = nn.ModuleList([DecoderLayer(cfg, 0, factory, kv_index=kv_index)])
        self.norm = RMSNorm(h, eps, **factory)
        self.d2t: torch.Tensor | None = None  # logits column -> token id (None: the identity)
        self.vocab_head = 0  # with d2t: the LM head's first rows scored
        self.extra_rows: torch.Tensor | None = None  # with d2t: the other ids' rows

    def set_vocab(self, ids: list[int] | None, lm_head: torch.Tensor) -> None:
        """Score only `ids` (sorted, unique token ids; None: every token): the run of ids
        0 .. n-1 it starts with reads the LM head's first n rows in place, the rest are
        gathered once here. `lm_head` [V, H]: the target's."""
        if ids is None or len(ids) >= lm_head.shape[0]:
            self.d2t, self.vocab_head, self.extra_rows = None, 0, None
            return
        n = 0
        while n < len(ids) and ids[n] == n:
            n += 1
        self.vocab_head = n
        self.extra_rows = lm_head[torch.tensor(ids[n:], dtype=torch.long)].clone()
        self.d2t = torch.tensor(ids, dtype=torch.long, device=lm_head.device)

    def fuse(self) -> None:
        self.layers[0].fuse()

    @torch.no_grad()
    def forward(
        self,
        batch: ForwardBatch,
        hidden: torch.Tensor,
        cache: ModelCache,
        ops: Ops,
        target: Qwen35ForCausalLM,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`batch.input_ids` [T]: the token after each position; `hidden` [T, H]: the target's
        (or the previous draft step's) hidden state at each position. Returns (fp32 logits of
        the tokens at `batch.logits_indices`, the head's output hidden state [T, H]); with a
        trimmed vocabulary (`set_vocab`) the logits' columns are `d2t`'s tokens."""
        tm = target.model
        e = ops.rms_norm(tm.embed_tokens(batch.input_ids), *_norm(self.pre_fc_norm_embedding))
        h = ops.rms_norm(hidden, *_norm(self.pre_fc_norm_hidden))
        x = ops.linear(torch.cat([e, h], dim=-1), self.fc.weight)
        x, delta = self.layers[0](x, None, batch, cache, ops, tm.inv_freq)
        _, out = ops.add_rms_norm(x, delta, *_norm(self.norm))
        o = out[batch.logits_indices]
        if self.d2t is None:
            return ops.linear(o, weight_of(target.lm_head)).float(), out
        logits = ops.linear(o, target.lm_head.weight[: self.vocab_head])
        if self.extra_rows.shape[0]:
            logits = torch.cat([logits, ops.linear(o, self.extra_rows)], dim=-1)
        return logits.float(), out


def _norm(norm: RMSNorm) -> tuple[torch.Tensor, float]:
    return norm.weight, norm.eps


def add_mtp_head(
    model: Qwen35ForCausalLM, dtype: torch.dtype | None, device: torch.device | str
) -> Qwen35MTP:
    """Give `model` an (uninitialised) MTP head as `model.mtp`, its K/V in the entry after the
    target's full-attention layers; registered last, so the target's parameters keep their
    order."""
    cfg = model.config
    head = Qwen35MTP(cfg, len(cfg.full_layer_ids), {"dtype": dtype, "device": device})
    model.mtp = head
    return head
