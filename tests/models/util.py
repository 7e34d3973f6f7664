"""Test helpers: ragged `ForwardBatch` / `ModelCache` from plain lists, and a tiny driver that
runs sequences through a model in arbitrary chunks with shuffled page ids and state slots.

Page and slot choice here is deliberately random; the engine allocates its own.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

import torch

from ninfer.forward import ForwardBatch, ModelCache
from ninfer.models.config import Qwen35Config
from ninfer.page import PAGE_SIZE


def narrow(cfg: Qwen35Config, layers: int | None = None) -> Qwen35Config:
    """A preset's layer pattern (its first `layers` layers, or all) at tiny widths (CPU)."""
    depth = {} if layers is None else {
        "num_hidden_layers": layers, "layer_types": cfg.layer_types[:layers],
    }  # fmt: skip
    return dataclasses.replace(
        cfg, vocab_size=512, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32, intermediate_size=128 if cfg.intermediate_size else 0,
        num_experts=8 if cfg.is_moe else 0, moe_intermediate_size=32 if cfg.is_moe else 0,
        shared_expert_intermediate_size=32 if cfg.is_moe else 0, **depth,
    )  # fmt: skip


@dataclass
class Row:
    """One row of a batch: `ids` are the new tokens, placed after `ctx_len` cached ones."""

    ids: list[int]
    ctx_len: int
    slot: int
    pages: list[int]  # page ids in position order, enough for ctx_len + len(ids)


def make_batch(
    rows: list[Row], device: str | torch.device = "cpu", logits_indices: list[int] | None = None
) -> ForwardBatch:
    """A ForwardBatch over `rows`; logits for every token unless `logits_indices` is given."""
    q_lens = [len(r.ids) for r in rows]
    positions, slot_mapping, cu = [], [], [0]
    for r in rows:
        pos = range(r.ctx_len, r.ctx_len + len(r.ids))
        positions += pos
        slot_mapping += [r.pages[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for p in pos]
        cu.append(cu[-1] + len(r.ids))
    width = max(len(r.pages) for r in rows)
    table = [r.pages + [0] * (width - len(r.pages)) for r in rows]
    n = cu[-1]

    def t(x, dtype=torch.int64):
        return torch.tensor(x, dtype=dtype, device=device)

    return ForwardBatch(
        input_ids=t([i for r in rows for i in r.ids]),
        positions=t(positions),
        q_lens=q_lens,
        ctx_lens=[r.ctx_len for r in rows],
        cu_q=t(cu, torch.int32),
        state_slots=t([r.slot for r in rows]),
        block_table=t(table, torch.int32),
        slot_mapping=t(slot_mapping),
        logits_indices=t(list(range(n)) if logits_indices is None else logits_indices),
    )


def make_cache(
    cfg: Qwen35Config,
    num_pages: int,
    num_slots: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    kv_dtype: torch.dtype | None = None,
) -> ModelCache:
    """Pools filled with NaN (zero for fp8), so that reading unwritten state shows up."""
    kv_dtype = kv_dtype or dtype
    fill = float("nan") if kv_dtype.is_floating_point and kv_dtype.itemsize > 1 else 0.0
    kv_shape = (num_pages, 2, PAGE_SIZE, cfg.num_key_value_heads, cfg.head_dim)
    n_gdn, width = len(cfg.gdn_layer_ids), cfg.linear_conv_kernel_dim - 1
    hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    return ModelCache(
        kv=[torch.full(kv_shape, fill, device=device).to(kv_dtype) for _ in cfg.full_layer_ids],
        conv=torch.full((num_slots, n_gdn, cfg.conv_dim, width), float("nan"), dtype=dtype,
                        device=device),
        ssm=torch.full((num_slots, n_gdn, hv, dk, dv), float("nan"), device=device),
    )  # fmt: skip


@dataclass
class _Seq:
    tokens: list[int]
    slot: int
    pages: list[int] = field(default_factory=list)
    done: int = 0  # tokens already run


class ChunkRunner:
    """Runs several sequences through `model` step by step, each step a ragged batch of
    (sequence, n_new_tokens) pieces; pages and slots are handed out in shuffled order."""

    def __init__(self, model, cache: ModelCache, ops, num_slots: int, seed: int = 0) -> None:
        self.model, self.cache, self.ops = model, cache, ops
        rng = random.Random(seed)
        self.free_pages = list(range(cache.kv[0].shape[0] if cache.kv else 1024))
        self.free_slots = list(range(num_slots))
        rng.shuffle(self.free_pages)
        rng.shuffle(self.free_slots)
        self.seqs: dict[int, _Seq] = {}

    def add(self, seq_id: int, tokens: list[int]) -> None:
        self.seqs[seq_id] = _Seq(list(tokens), self.free_slots.pop())

    def step(self, work: list[tuple[int, int]]) -> dict[int, torch.Tensor]:
        """Runs one forward over `work`; returns each sequence's logits [n, vocab]."""
        rows = []
        for seq_id, n in work:
            s = self.seqs[seq_id]
            while len(s.pages) * PAGE_SIZE < s.done + n:
                s.pages.append(self.free_pages.pop())
            rows.append(Row(s.tokens[s.done : s.done + n], s.done, s.slot, list(s.pages)))
        logits = self.model(make_batch(rows, self.cache.ssm.device), self.cache, self.ops)
        out, start = {}, 0
        for seq_id, n in work:
            out[seq_id] = logits[start : start + n]
            self.seqs[seq_id].done += n
            start += n
        return out
