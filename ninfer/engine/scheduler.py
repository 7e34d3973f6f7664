"""Step planning: which lanes run which tokens in the next ragged forward pass.

Pure arithmetic over lanes (no tensors, no cache). FIFO admission order is kept by the engine;
this module decides, for the admitted lanes, the rows of one step:

  * every decoding lane contributes one row of one token (its last sampled token);
  * prefilling lanes (one at a time unless `concurrent_prefill`) share a budget of
    `prefill_chunk` tokens, in admission order; of `solo_chunk` tokens when no lane decodes
    (nobody waits between tokens, so a lone prompt takes fewer, longer passes, each with less
    host time per token; measured: docs/results-h200.md, "longer passes for a lone prompt").

Chunk ends, for a lane at frontier s with prompt length n (planned exact tap e_x, design §7.1):

    s                 e_x            s + budget          n
    |-----------------|- - - - - - - - -|- - - - - - - - -|
    end = min(n, s + budget), cut at the first exact tap e_x in (s, end) that the pass cannot
    take inside itself (`InPass.takes`),
    otherwise floored to a 64-token page boundary when that is still > s (and end < n), so that
    after a non-aligned resume every later chunk boundary is page-aligned and flexible taps,
    which land on chunk boundaries, are aligned too.

A final chunk (end = n) longer than `final_cap` (= prefill_chunk) that holds a flexible tap
takes its tail snapshot at the page boundary c = ceil64(n - final_cap), so that a retry resumes
within prefill_chunk of the end whatever the budget (flexible taps in the prompt's last page
inside a shorter final chunk are taken at its start, design §7.1; the prompt tail always is
one; a snapshot nearer the end would leave the endpoint of a short reply unpublished, §7.7).

Snapshots inside a pass (`InPass.allows`; `forward.StateTap`): a row longer than the
CUDA-graph bucket (such a pass runs eagerly anyway) whose start lies on the op set's tap grid
takes its flexible taps strictly inside it at their own positions, in the pass, without a
split, and the tail snapshot at c (`Slice.in_pass`, `Slice.tail_at`; `Publisher.before_chunk`
reserves the slots). Any rows of a step may. A final chunk that cannot is cut at c. Such a
row takes its exact taps inside the pass too, each at its own position, where the op set
serves the offset (at least `Ops.tap_stride` from the row's start): a cold prompt then runs
as one pass however many exact taps it holds (the end of its last user message, before the
generation opener, is one).
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.engine.kv.lane import KVLane
from ninfer.page import PAGE_SIZE


@dataclass(frozen=True, slots=True)
class InPass:
    """Which rows may snapshot inside their pass: longer than `above` tokens (shorter ones may
    replay a CUDA graph, which takes no taps) and starting at a multiple of `stride` (the op
    set's `Ops.tap_stride`, 1 for ours: any offset; a divisor of the page: flexible taps are
    page boundaries)."""

    above: int = 0
    stride: int = 1

    def allows(self, start: int, end: int) -> bool:
        return end - start > self.above and start % self.stride == 0

    def takes(self, start: int, end: int, pos: int) -> bool:
        """Whether a row [start, end) that `allows` takes an exact tap at `pos` inside its
        pass: the op set serves any offset of at least its stride (`Ops.tap_stride`)."""
        return self.allows(start, end) and pos - start >= self.stride


@dataclass(slots=True)
class Slice:
    """Tokens [start, end) of `lane` in this step; `in_pass`: its flexible taps inside them are
    taken inside the pass, the prompt tail's at `tail_at` (c, above) when not None."""

    lane: KVLane
    start: int
    end: int
    in_pass: bool = False
    tail_at: int | None = None

    @property
    def samples(self) -> bool:
        """The row's last token is the last known token: its logits give the next token."""
        return self.end == len(self.lane.tokens)


def chunk_end(
    lane: KVLane, budget: int, final_cap: int | None = None, in_pass: InPass | None = None
) -> int:
    """End of the next prefill chunk of `lane` with `budget` tokens available (see above),
    cut at `final_tap` when the final chunk would exceed `final_cap`. With `in_pass`, the chunk
    is planned as a row snapshotting inside its pass: not cut at the exact taps that such a
    row takes (the caller checks that the row does)."""
    s, n = lane.computed, lane.prompt_len
    end = min(n, s + budget)
    for pos, exact in lane.taps:
        if exact and s < pos < end and not (in_pass and in_pass.takes(s, end, pos)):
            return pos
    if end < n:
        aligned = end - end % PAGE_SIZE
        if aligned > s:
            end = aligned
    elif final_cap is not None:
        cut = final_tap(lane, s, end, final_cap)
        if cut is not None:
            end = cut
    return end


def final_tap(lane: KVLane, start: int, end: int, final_cap: int) -> int | None:
    """The snapshot position c = ceil64(n - final_cap) of a final chunk [start, n) longer than
    `final_cap` that holds a flexible tap, or None."""
    n = lane.prompt_len
    if end != n or n - start <= final_cap or not _flexible_tap_in(lane, start, n):
        return None
    cut = -(-(n - final_cap) // PAGE_SIZE) * PAGE_SIZE
    return cut if start < cut < n else None


def _flexible_tap_in(lane: KVLane, s: int, n: int) -> bool:
    return any(not exact and s < pos <= n for pos, exact in lane.taps)


def plan_step(
    lanes: list[KVLane],
    prefill_chunk: int,
    solo_chunk: int | None = None,
    in_pass: InPass | None = InPass(),
) -> list[Slice]:
    """Rows of the next step: decode rows first (one token each), then prefill chunks of
    `prefill_chunk` tokens in all, or of `solo_chunk` when there is no decode row; `in_pass`:
    which chunks snapshot inside their pass (None: none)."""
    rows: list[Slice] = []
    for lane in lanes:
        if not lane.prefilling:
            rows.append(Slice(lane, lane.computed, lane.computed + 1))
    budget = prefill_chunk if rows or solo_chunk is None else max(solo_chunk, prefill_chunk)
    for lane in lanes:
        if lane.prefilling and budget > 0:
            s = lane.computed
            end = chunk_end(lane, budget, in_pass=in_pass)
            inside = in_pass is not None and in_pass.allows(s, end)
            if not inside:
                end = chunk_end(lane, budget, prefill_chunk)
            tail = final_tap(lane, s, end, prefill_chunk) if inside else None
            rows.append(Slice(lane, s, end, inside, tail))
            budget -= end - s
    return rows


def may_admit(lanes: list[KVLane], max_concurrency: int, concurrent_prefill: bool) -> bool:
    """Whether the FIFO head may be considered for admission now."""
    if len(lanes) >= max_concurrency:
        return False
    return concurrent_prefill or not any(lane.prefilling for lane in lanes)
