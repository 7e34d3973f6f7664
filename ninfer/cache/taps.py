"""TapPlanner (design §7.1): where a prefilling lane snapshots its recurrent state.

Candidates, in priority order:

    prio  source                                   placement
    1     explicit markers (client breakpoints)    exact      published as Boundary
    2     final generation opener                  exact      (not tapped after an endpoint resume)
    3     structural ends (tools, System block)    exact      Boundary unless protocol-automatic
    4     prompt tail n-1                          flexible
    5     ladder n - G*2^k, snapped back to a      flexible
          message boundary within min_gap
    6     forward ladder base + R*2^k <= n-1,      flexible   off when R (forward_tokens) = 0
          deepest first

The forward ladder serves forks that arrive later at a depth nothing marks (sub-agents over
one raw preamble, forks of a conversation, best-of-n one after another): a fork at depth
p >= base + R finds a rung at or below it at least halfway from the base to p (less the floor
to a block), before any sibling proved the fork (the admission's fork tap serves the siblings
after that). Rungs are Tap kind, and each tap of
a prompt supersedes the previous one (§9.3), so unused rungs are the first snapshots evicted.
Like every flexible tap a rung never splits a pass: a pass that snapshots inside itself (a long
eager pass, `scheduler.InPass`) takes it at the rung itself; any other takes it at the end of
the pass that reaches it, and the rungs such a pass covers make one snapshot (all of a final
chunk's flexible taps make its one snapshot, §7.1).

Every tap lies in (base, n-1] and never strictly inside a Vision span (a candidate inside one
moves to the span start). Exact taps keep their token position (a tail snapshot when p % 64 !=
0, §7.4); flexible taps are 64-aligned targets the engine realizes inside a pass or at a chunk
boundary, so they are floored to a block boundary here. The plan is a pure function of its
inputs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ninfer.cache.common import Span, floor_page
from ninfer.page import PAGE_SIZE


class HintKind(enum.IntEnum):
    EXPLICIT = 1  # client-named breakpoint (explicit evidence)
    OPENER = 2  # start of the final assistant generation
    STRUCTURAL = 3  # end of tools / leading System-Developer block
    AUTOMATIC = 4  # protocol-automatic marker: planned as structural, published as a plain Tap
    MESSAGE = 5  # a message boundary: only a snap target for ladder taps


class Placement(enum.IntEnum):
    EXACT = 0  # splits the prefill chunk at `position`
    FLEXIBLE = 1  # taken at a chunk boundary, no split


class TapHint(NamedTuple):
    position: int
    kind: HintKind


class Tap(NamedTuple):
    position: int  # where the snapshot goes (64-aligned for flexible taps)
    placement: Placement
    priority: int
    boundary: bool  # publish as SnapshotKind.BOUNDARY
    target: int  # the candidate's own position (n-1, a snapped ladder rung); proximity uses it


@dataclass(slots=True, frozen=True)
class TapConfig:
    """Design §14.2 defaults with a Host tier: 8 taps, G = max(4096, 2*chunk),
    min gap max(1024, chunk); `forward_tokens` R of the forward ladder (0 = none; the engine
    derives it, `CachePolicy.cache_tap_forward`)."""

    max_new_taps: int = 8
    ladder_tokens: int = 4096
    min_gap_tokens: int = 1024
    forward_tokens: int = 0

    def __post_init__(self) -> None:
        # A ladder step of 0 never passes the base: plan_taps would loop forever.
        limits = (("max_new_taps", 0), ("ladder_tokens", 1), ("min_gap_tokens", 0))
        for name, least in (*limits, ("forward_tokens", 0)):
            value = getattr(self, name)
            if value < least:
                raise ValueError(f"TapConfig.{name} must be >= {least}, got {value}")


def _out_of_spans(position: int, spans: Sequence[Span], align: bool) -> int:
    """Move `position` back until it is outside every span (and 64-aligned when `align`).

    Both moves only decrease the position, so the loop ends.
    """
    p = floor_page(position) if align else position
    moved = True
    while moved:
        moved = False
        for s in spans:
            if s.strictly_inside(p):
                p = floor_page(s.begin) if align else s.begin
                moved = True
    return p


def _semantic_clusters(hints: Iterable[TapHint]) -> list[tuple[int, bool]]:
    """Cluster structural/automatic positions closer than 64 tokens; keep each cluster's
    earliest. Returns (position, boundary) per cluster, by position: Boundary if any member
    (dropped ones included) was a non-automatic structural boundary."""
    ordered = sorted(hints, key=lambda h: (h.position, h.kind))
    clusters: list[tuple[int, bool]] = []
    last = None
    for h in ordered:
        boundary = h.kind == HintKind.STRUCTURAL
        if last is not None and h.position - last < PAGE_SIZE:
            p, b = clusters[-1]
            clusters[-1] = (p, b or boundary)
        else:
            clusters.append((h.position, boundary))
        last = h.position
    return clusters


def plan_taps(
    n_tokens: int,
    base: int,
    hints: Sequence[TapHint] = (),
    existing: Sequence[int] = (),
    vision_spans: Sequence[Span] = (),
    config: TapConfig = TapConfig(),
    resumed_from_endpoint: bool = False,
) -> list[Tap]:
    """Plan the new taps of a prompt of `n_tokens` prefilled from frontier `base`.

    `existing`: frontiers of snapshots already on this prompt's path. Returns taps sorted by
    position; at most `config.max_new_taps`, accepted in priority order.
    """
    spans = sorted(vision_spans)
    cands = _marked(hints, spans, resumed_from_endpoint)
    cands += _structural(n_tokens, base, hints, existing, spans)
    cands.append(_flexible(n_tokens - 1, 4, spans))
    cands += _ladder(n_tokens, base, hints, config, spans)
    cands += _forward_ladder(n_tokens, base, config.forward_tokens, spans)
    return _accept(cands, n_tokens, base, existing, config)


def _marked(hints: Sequence[TapHint], spans: Sequence[Span], resumed: bool) -> list[Tap]:
    """Priorities 1 and 2: the explicit markers, then the final generation opener."""
    explicit = {
        _out_of_spans(h.position, spans, False) for h in hints if h.kind == HintKind.EXPLICIT
    }
    cands = [Tap(p, Placement.EXACT, 1, True, p) for p in sorted(explicit)]
    # The final generation opener is its own candidate, deduplicated only by position: the
    # next turn re-renders the history after it, so it resumes there even when the opener is
    # close to the base or to a structural boundary (a short turn).
    opener = [h.position for h in hints if h.kind == HintKind.OPENER]
    if opener and not resumed:  # else the lane's own endpoint serves (§7.1)
        p = _out_of_spans(max(opener), spans, False)
        cands.append(Tap(p, Placement.EXACT, 2, False, p))
    return cands


def _structural(
    n: int, base: int, hints: Sequence[TapHint], existing: Sequence[int], spans: Sequence[Span]
) -> list[Tap]:
    """Priority 3: structural and automatic boundaries in (base, n-1], one per cluster."""
    semantic = []
    for h in hints:
        if h.kind in (HintKind.STRUCTURAL, HintKind.AUTOMATIC):
            p = _out_of_spans(h.position, spans, False)
            # A boundary within 64 tokens past the base or an existing snapshot is served
            # there already; left in, it would head a cluster that is then dropped whole.
            covered = any(0 <= p - y <= PAGE_SIZE for y in (base, *existing))
            if base < p <= n - 1 and not covered:
                semantic.append(TapHint(p, h.kind))
    return [Tap(p, Placement.EXACT, 3, b, p) for p, b in _semantic_clusters(semantic)]


def _flexible(target: int, priority: int, spans: Sequence[Span]) -> Tap:
    target = _out_of_spans(target, spans, False)
    return Tap(_out_of_spans(target, spans, True), Placement.FLEXIBLE, priority, False, target)


def _ladder(
    n: int, base: int, hints: Sequence[TapHint], config: TapConfig, spans: Sequence[Span]
) -> list[Tap]:
    """Priority 5. Rungs n - G*2^k for k = 0, 1, ... while above the base, each snapped back
    to the latest message boundary within min_gap below it:

      base        n-8G           n-4G       n-2G    n-G   n
      |------------|--------------|----------|-------|-----|
    """
    messages = sorted(h.position for h in hints if h.kind == HintKind.MESSAGE)
    gap, step, rungs = config.min_gap_tokens, config.ladder_tokens, []
    while n - step > base:
        q = n - step
        snapped = [m for m in messages if q - gap <= m <= q]
        rungs.append(_flexible(snapped[-1] if snapped else q, 5, spans))
        step *= 2
    return rungs


def _forward_ladder(n: int, base: int, forward: int, spans: Sequence[Span]) -> list[Tap]:
    """Priority 6. Rungs base + R*2^k for k = 0, 1, ... up to n-1, deepest first (a short
    budget keeps the rungs that serve the deepest forks):

      base   base+R   base+2R       base+4R                    n
      |--------|--------|-------------|--------------------------|
    """
    rungs, step = [], forward
    while step and base + step < n:
        rungs.append(_flexible(base + step, 6, spans))
        step *= 2
    return rungs[::-1]


def _accept(
    cands: list[Tap], n: int, base: int, existing: Sequence[int], config: TapConfig
) -> list[Tap]:
    """The candidates in priority order, each kept unless out of (base, n-1], already planned
    or present, too close to what is (min_gap for ladder rungs, 64 tokens below for the rest
    past the opener), or past `config.max_new_taps`; sorted by position."""
    accepted: list[Tap] = []
    fixed, gap = [base, *existing], config.min_gap_tokens
    for c in cands:
        if len(accepted) >= config.max_new_taps:
            break
        p, x = c.position, c.target
        if not base < p <= n - 1 or p in fixed or any(p == a.position for a in accepted):
            continue  # out of range, or a snapshot is already planned or present there
        near = fixed + [a.target for a in accepted]
        if c.priority == 5:  # ladder: min_gap on both sides
            redundant = any(abs(x - y) < gap for y in near)
        elif c.priority > 2:  # structural, tail, forward: nothing at or 64 below the target
            redundant = any(0 <= x - y <= PAGE_SIZE for y in near)
        else:
            redundant = False
        if not redundant:
            accepted.append(c)
    return sorted(accepted)
