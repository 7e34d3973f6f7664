"""Spec §13.1 TapPlanner: examples of each §7.1 rule, then properties over random prompts."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.cache import HintKind, Placement, Span, Tap, TapConfig, TapHint, plan_taps

E, F = Placement.EXACT, Placement.FLEXIBLE
CFG = TapConfig(max_new_taps=8, ladder_tokens=4096, min_gap_tokens=1024)


def positions(taps):
    return [(t.position, t.placement, t.priority, t.boundary) for t in taps]


def test_chat_turn_opener_absorbs_the_prompt_tail():
    # system block ends at 500, the opener is at 980 of a 1000-token prompt
    hints = [TapHint(500, HintKind.STRUCTURAL), TapHint(980, HintKind.OPENER)]
    taps = plan_taps(1000, 0, hints, config=CFG)
    # tail target 999 lies 19 tokens after the opener: redundant
    assert positions(taps) == [(500, E, 3, True), (980, E, 2, False)]


def test_semantic_cluster_keeps_earliest_and_boundary_flag():
    # structural boundaries < 64 apart: one exact tap at the earliest, Boundary from any member
    hints = [TapHint(530, HintKind.AUTOMATIC), TapHint(500, HintKind.STRUCTURAL)]
    taps = plan_taps(2000, 0, hints, config=CFG)
    assert positions(taps) == [(500, E, 3, True), (1984, F, 4, False)]
    assert taps[1].target == 1999


def test_opener_is_kept_next_to_a_boundary_or_the_base():
    # a short user turn: system end at 500, opener at 530; the next turn resumes at the opener
    hints = [TapHint(530, HintKind.OPENER), TapHint(500, HintKind.STRUCTURAL)]
    taps = plan_taps(2000, 0, hints, config=CFG)
    assert positions(taps) == [(500, E, 3, True), (530, E, 2, False), (1984, F, 4, False)]
    # a short chat turn resumed 30 tokens before its opener (a structural end near the base
    # is served by the base and heads no cluster)
    hints = [TapHint(230, HintKind.OPENER), TapHint(210, HintKind.STRUCTURAL)]
    assert positions(plan_taps(236, 200, hints, config=CFG)) == [(230, E, 2, False)]


def test_automatic_markers_are_structural_but_not_boundary():
    taps = plan_taps(700, 0, [TapHint(300, HintKind.AUTOMATIC)], config=CFG)
    assert positions(taps) == [(300, E, 3, False), (640, F, 4, False)]


def test_resume_from_endpoint_skips_the_opener():
    hints = [TapHint(950, HintKind.OPENER)]
    assert positions(plan_taps(1000, 200, hints, config=CFG)) == [(950, E, 2, False)]
    assert positions(plan_taps(1000, 200, hints, config=CFG, resumed_from_endpoint=True)) == [
        (960, F, 4, False)
    ]


def test_proximity_to_base_and_existing_snapshots():
    # base 960 lies 39 tokens before the tail target 999: nothing new
    assert plan_taps(1000, 960, config=CFG) == []
    # an existing snapshot 30 tokens before a structural boundary makes it redundant; explicit
    # taps and the opener (the next turn resumes exactly there) stay
    hints = [TapHint(830, HintKind.STRUCTURAL), TapHint(831, HintKind.EXPLICIT)]
    taps = plan_taps(1000, 0, hints, existing=[800], config=CFG)
    assert positions(taps) == [(831, E, 1, True), (960, F, 4, False)]
    hints = [TapHint(830, HintKind.OPENER)]
    taps = plan_taps(1000, 0, hints, existing=[800], config=CFG)
    assert positions(taps) == [(830, E, 2, False), (960, F, 4, False)]
    # an explicit breakpoint exactly at an existing snapshot is deduplicated
    assert plan_taps(1000, 0, [TapHint(800, HintKind.EXPLICIT)], [800], config=CFG) == [
        Tap(960, F, 4, False, 999)
    ]


def test_ladder_rungs_snap_back_to_message_boundaries_and_keep_min_gap():
    n = 20_000
    msgs = [TapHint(p, HintKind.MESSAGE) for p in (15_500, 11_000, 3_000)]
    taps = plan_taps(n, 0, msgs, config=CFG)
    # rungs: 15904 -> snapped 15500 -> 15488; 11808 -> 11000 -> 10944; 3616 -> 3000 -> 2944;
    # the tail (19968) first
    assert positions(taps) == [
        (2944, F, 5, False),
        (10944, F, 5, False),
        (15488, F, 5, False),
        (19968, F, 4, False),
    ]
    assert [t.target for t in taps] == [3000, 11000, 15500, 19999]


def test_vision_span_moves_candidates_to_its_start():
    spans = [Span(480, 40), Span(890, 40), Span(940, 60)]
    taps = plan_taps(1000, 0, [TapHint(500, HintKind.EXPLICIT)], vision_spans=spans, config=CFG)
    # explicit 500 -> 480 (exact: the span start); tail 999 -> 940, floored to 896 which is
    # inside [890, 930) -> 890 -> floored to 832
    assert positions(taps) == [(480, E, 1, True), (832, F, 4, False)]
    assert taps[1].target == 940


def test_budget_keeps_highest_priorities():
    hints = [TapHint(p, HintKind.EXPLICIT) for p in (100, 300, 500)]
    hints.append(TapHint(700, HintKind.OPENER))
    cfg = TapConfig(max_new_taps=2, ladder_tokens=4096, min_gap_tokens=1024)
    assert [t.position for t in plan_taps(10_000, 0, hints, config=cfg)] == [100, 300]


# ---- properties ----------------------------------------------------------------------------


@st.composite
def prompts(draw):
    n = draw(st.integers(2, 60_000))
    base = draw(st.integers(0, n - 2))
    kinds = st.sampled_from(list(HintKind))
    hints = draw(st.lists(st.builds(TapHint, st.integers(0, n), kinds), max_size=12))
    existing = draw(st.lists(st.integers(0, n), max_size=4))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6, unique=True)))
    spans = [Span(a, b - a) for a, b in zip(cuts[::2], cuts[1::2], strict=False) if b > a]
    cfg = TapConfig(
        max_new_taps=draw(st.integers(0, 10)),
        ladder_tokens=draw(st.sampled_from([64, 512, 1000, 4096, 8192])),
        min_gap_tokens=draw(st.integers(0, 2048)),
    )
    return n, base, hints, existing, spans, cfg, draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(prompts())
def test_tap_properties(case):
    n, base, hints, existing, spans, cfg, rfe = case
    taps = plan_taps(n, base, hints, existing, spans, cfg, rfe)
    pos = [t.position for t in taps]
    assert pos == sorted(pos) and len(set(pos)) == len(pos)
    assert len(taps) <= cfg.max_new_taps
    for t in taps:
        assert base < t.position <= n - 1  # in (F_s, n-1]
        assert not any(s.strictly_inside(t.position) for s in spans)
        assert t.position not in existing  # deduplicated against the path
        if t.placement == Placement.FLEXIBLE:
            assert t.position % 64 == 0 and t.position <= t.target
        else:
            assert t.position == t.target
        if 2 < t.priority < 5:  # proximity: nothing <= 64 tokens before (ladder: min_gap)
            assert not any(0 <= t.target - x <= 64 for x in [base, *existing])
        if t.priority == 5:
            assert all(abs(t.target - x) >= cfg.min_gap_tokens for x in [base, *existing])
        if t.priority == 1 or t.priority >= 4:
            assert t.boundary == (t.priority == 1)
    ladder = [t for t in taps if t.priority == 5]
    bound = math.floor(math.log2(n / cfg.ladder_tokens)) + 1 if n > cfg.ladder_tokens else 0
    assert len(ladder) <= bound
    if rfe:  # an endpoint-resumed request never taps the opener
        assert not any(t.priority == 2 for t in taps)
    # deterministic, whatever the hint order
    assert plan_taps(n, base, list(reversed(hints)), existing, spans, cfg, rfe) == taps
    # priority and budget: a smaller budget keeps a prefix of the acceptance order
    big = plan_taps(n, base, hints, existing, spans, TapConfig(64, *_rest(cfg)), rfe)
    assert set(taps) <= set(big)
    dropped = set(big) - set(taps)
    if taps and dropped:
        assert min(t.priority for t in dropped) >= max(t.priority for t in taps)


def _rest(cfg: TapConfig):
    return cfg.ladder_tokens, cfg.min_gap_tokens
