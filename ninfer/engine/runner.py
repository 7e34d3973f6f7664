"""The model runner: turns scheduled rows into a `ForwardBatch`, runs the model, samples.

Knows nothing about requests, lanes or the prefix cache: a `Row` says which tokens to feed,
from which context length, into which state slot and pages, and whether its last token's logits
are sampled. Index arithmetic is vectorised on the device; the only host sync of a step is the
one `.tolist()` of the sampled tokens (`StepResult`).

    flat tokens  |<- row 0 ->|<- row 1 ->| ...       position p of row r = ctx_lens[r] + i
    slot_mapping[t] = block_table[row(t), p // 64] * 64 + p % 64
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ninfer.models.batch import PAGE_SIZE, ForwardBatch, ModelCache
from ninfer.request import SamplingParams


@dataclass(slots=True)
class Row:
    """One row of a ragged step: `token_ids` at positions [ctx_len, ctx_len + len)."""

    token_ids: list[int]
    ctx_len: int
    slot: int  # physical state slot
    pages: list[int]  # block table entries covering [0, ctx_len + len(token_ids))
    sample: SamplingParams | None  # None: no logits wanted (a non-final prefill chunk)
    generator: torch.Generator | None = None
    before_layer: Callable[[int], None] | None = None  # waits for a Host restore's layer


@dataclass(slots=True)
class StepResult:
    """Per row: the sampled token (or None) and its logprob record (or None)."""

    tokens: list[int | None] = field(default_factory=list)
    logprobs: list[dict[int, float] | None] = field(default_factory=list)


class Runner:
    """Owns the model, the op set and the `ModelCache` view of the memory pools."""

    def __init__(self, model, ops, cache: ModelCache, device: torch.device, sampler) -> None:
        self.model = model
        self.ops = ops
        self.cache = cache
        self.device = device
        self.sampler = sampler  # callable(logits, params, generators) -> (tokens, logprobs)

    def build_batch(self, rows: list[Row]) -> ForwardBatch:
        q_lens = [len(r.token_ids) for r in rows]
        ctx_lens = [r.ctx_len for r in rows]
        flat = [t for r in rows for t in r.token_ids]
        width = max(len(r.pages) for r in rows)
        table = [r.pages + [0] * (width - len(r.pages)) for r in rows]
        want = [i for i, r in enumerate(rows) if r.sample is not None]
        dev = self.device
        input_ids = torch.tensor(flat, dtype=torch.int64).to(dev, non_blocking=True)
        q_t = torch.tensor(q_lens, dtype=torch.int64)
        cu = torch.zeros(len(rows) + 1, dtype=torch.int64)
        torch.cumsum(q_t, 0, out=cu[1:])
        ctx_t = torch.tensor(ctx_lens, dtype=torch.int64)
        if len(flat) == len(rows):  # decode-only step: one token per row
            row_of = torch.arange(len(rows))
        else:
            row_of = torch.repeat_interleave(torch.arange(len(rows)), q_t, output_size=len(flat))
        positions = torch.arange(len(flat)) - cu[:-1][row_of] + ctx_t[row_of]
        block_table = torch.tensor(table, dtype=torch.int32)
        page = block_table[row_of, positions // PAGE_SIZE].to(torch.int64)
        slot_mapping = page * PAGE_SIZE + positions % PAGE_SIZE
        logits_indices = cu[1:][torch.tensor(want, dtype=torch.int64)] - 1
        return ForwardBatch(
            input_ids=input_ids,
            positions=positions.to(dev, non_blocking=True),
            q_lens=q_lens,
            ctx_lens=ctx_lens,
            cu_q=cu.to(torch.int32).to(dev, non_blocking=True),
            state_slots=torch.tensor([r.slot for r in rows], dtype=torch.int64).to(dev),
            block_table=block_table.to(dev, non_blocking=True),
            slot_mapping=slot_mapping.to(dev, non_blocking=True),
            logits_indices=logits_indices.to(dev, non_blocking=True),
            before_layer=_join_hooks([r.before_layer for r in rows if r.before_layer]),
        )

    def step(self, rows: list[Row]) -> StepResult:
        """Run one ragged forward pass and sample every row that asks for it."""
        batch = self.build_batch(rows)
        logits = self.model(batch, self.cache, self.ops)
        want = [r for r in rows if r.sample is not None]
        result = StepResult(tokens=[None] * len(rows), logprobs=[None] * len(rows))
        if not want:
            return result
        tokens, logprobs = self.sampler(
            logits, [r.sample for r in want], [r.generator for r in want]
        )
        k = 0
        for i, r in enumerate(rows):
            if r.sample is not None:
                result.tokens[i] = tokens[k]
                result.logprobs[i] = logprobs[k] if logprobs is not None else None
                k += 1
        return result


def _join_hooks(hooks: list[Callable[[int], None]]) -> Callable[[int], None] | None:
    """One before_layer callback calling every row's (restores of several admitted lanes)."""
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]

    def joined(layer: int) -> None:
        for hook in hooks:
            hook(layer)

    return joined
