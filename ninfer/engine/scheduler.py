"""Step planning: which lanes run which tokens in the next ragged forward pass.

Pure arithmetic over lanes (no tensors, no cache). FIFO admission order is kept by the engine;
this module decides, for the admitted lanes, the rows of one step:

  * every decoding lane contributes one row of one token (its last sampled token);
  * prefilling lanes (one at a time unless `concurrent_prefill`) share a budget of
    `prefill_chunk` tokens, in admission order; of `solo_chunk` tokens when no lane decodes
    (nobody waits between tokens, so a lone prompt takes fewer, longer passes: on the H200 the
    9B's 32k prompt in five passes instead of sixteen took 892 ms instead of 926).

Chunk ends, for a lane at frontier s with prompt length n (planned exact tap e_x, spec §7.1):

    s                 e_x            s + budget          n
    |-----------------|- - - - - - - - -|- - - - - - - - -|
    end = min(n, s + budget), cut at the first exact tap e_x in (s, end),
    otherwise floored to a 64-token page boundary when that is still > s (and end < n), so that
    after a non-aligned resume every later chunk boundary is page-aligned and flexible taps,
    which land on chunk boundaries, are aligned too.

A final chunk (end = n) longer than `final_cap` (= prefill_chunk) that holds a flexible tap is
cut at the page boundary ceil64(n - final_cap) instead: flexible taps inside the final chunk
are taken at its start (spec §7.1; the prompt tail always is one), so this keeps the tail
snapshot within prefill_chunk of the end whatever the budget. With budget = final_cap it never
fires: a final chunk is at most the budget.
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


def chunk_end(lane: Lane, budget: int, final_cap: int | None = None) -> int:
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
    elif final_cap is not None and n - s > final_cap and _flexible_tap_in(lane, s, n):
        cut = -(-(n - final_cap) // PAGE_SIZE) * PAGE_SIZE
        if s < cut < n:
            end = cut
    return end


def _flexible_tap_in(lane: Lane, s: int, n: int) -> bool:
    return any(not exact and s < pos <= n for pos, exact in lane.taps)


def plan_step(lanes: list[Lane], prefill_chunk: int, solo_chunk: int | None = None) -> list[Slice]:
    """Rows of the next step: decode rows first (one token each), then prefill chunks of
    `prefill_chunk` tokens in all, or of `solo_chunk` when there is no decode row."""
    rows: list[Slice] = []
    for lane in lanes:
        if not lane.prefilling:
            rows.append(Slice(lane, lane.computed, lane.computed + 1))
    budget = prefill_chunk if rows or solo_chunk is None else max(solo_chunk, prefill_chunk)
    for lane in lanes:
        if lane.prefilling and budget > 0:
            end = chunk_end(lane, budget, prefill_chunk)
            rows.append(Slice(lane, lane.computed, end))
            budget -= end - lane.computed
    return rows


def may_admit(lanes: list[Lane], max_concurrency: int, concurrent_prefill: bool) -> bool:
    """Whether the FIFO head may be considered for admission now."""
    if len(lanes) >= max_concurrency:
        return False
    return concurrent_prefill or not any(lane.prefilling for lane in lanes)
