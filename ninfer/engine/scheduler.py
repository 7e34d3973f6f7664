"""Step planning: which lanes run which tokens in the next ragged forward pass.

Pure arithmetic over lanes (no tensors, no cache). FIFO admission order is kept by the engine;
this module decides, for the admitted lanes, the rows of one step:

  * every decoding lane contributes one row of one token (its last sampled token);
  * prefilling lanes (one at a time unless `concurrent_prefill`) share a budget of
    `prefill_chunk` tokens, in admission order.

Chunk ends, for a lane at frontier s with prompt length n (planned exact tap e_x, spec §7.1):

    s                 e_x            s + budget          n
    |-----------------|- - - - - - - - -|- - - - - - - - -|
    end = min(n, s + budget), cut at the first exact tap e_x in (s, end),
    otherwise floored to a 64-token page boundary when that is still > s (and end < n), so that
    after a non-aligned resume every later chunk boundary is page-aligned and flexible taps,
    which land on chunk boundaries, are aligned too.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.engine.lane import Lane
from ninfer.models.batch import PAGE_SIZE


@dataclass(slots=True)
class Slice:
    """Tokens [start, end) of `lane` in this step."""

    lane: Lane
    start: int
    end: int

    @property
    def samples(self) -> bool:
        """The row's last token is the last known token: its logits give the next token."""
        return self.end == len(self.lane.tokens)


def chunk_end(lane: Lane, budget: int) -> int:
    """End of the next prefill chunk of `lane` with `budget` tokens available (see above)."""
    s, n = lane.computed, lane.prompt_len
    end = min(n, s + budget)
    for pos, exact in lane.taps:
        if exact and s < pos < end:
            return pos
    if end < n:
        aligned = end - end % PAGE_SIZE
        if aligned > s:
            end = aligned
    return end


def plan_step(lanes: list[Lane], prefill_chunk: int) -> list[Slice]:
    """Rows of the next step: decode rows first (one token each), then prefill chunks."""
    rows: list[Slice] = []
    budget = prefill_chunk
    for lane in lanes:
        if not lane.prefilling:
            rows.append(Slice(lane, lane.computed, lane.computed + 1))
    for lane in lanes:
        if lane.prefilling and budget > 0:
            end = chunk_end(lane, budget)
            rows.append(Slice(lane, lane.computed, end))
            budget -= end - lane.computed
    return rows


def may_admit(lanes: list[Lane], max_concurrency: int, concurrent_prefill: bool) -> bool:
    """Whether the FIFO head may be considered for admission now."""
    if len(lanes) >= max_concurrency:
        return False
    return concurrent_prefill or not any(lane.prefilling for lane in lanes)
