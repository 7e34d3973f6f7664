"""Spec §7.1 TapPlanner at its boundaries: exact tap positions one token either side of the
n-1 limit, the 64-token proximity, the ladder's min gap and snap window, semantic clusters
exactly 64 apart, repeated moves out of Vision spans, the budget order, invalid configs."""

from __future__ import annotations

import pytest

from ninfer.cache import HintKind, Placement, Span, TapConfig, TapHint, plan_taps

E, F = Placement.EXACT, Placement.FLEXIBLE
CFG = TapConfig(max_new_taps=8, ladder_tokens=4096, min_gap_tokens=1024)
S, A, M = HintKind.STRUCTURAL, HintKind.AUTOMATIC, HintKind.MESSAGE


def plan(n, base=0, hints=(), existing=(), spans=(), config=CFG, rfe=False):
    taps = plan_taps(n, base, [TapHint(p, k) for p, k in hints], existing, spans, config, rfe)
    return [(t.position, t.placement, t.priority, t.boundary, t.target) for t in taps]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ladder_tokens": 0}, "ladder_tokens"),
        ({"ladder_tokens": -64}, "ladder_tokens"),
        ({"max_new_taps": -1}, "max_new_taps"),
        ({"min_gap_tokens": -1}, "min_gap_tokens"),
    ],
)
def test_invalid_config_is_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^TapConfig\.{field} must be >= "):
        TapConfig(**kwargs)


def test_smallest_valid_config_plans():
    # ladder step 1, no gap, no taps: valid (the ladder of step 1 ends after log2(n) rungs)
    assert plan(100, config=TapConfig(0, 1, 0)) == []
    # rungs 299, 298, 296, ..., 236, 172, 44: those flooring onto an accepted position or to
    # the base are dropped
    cfg = TapConfig(max_new_taps=8, ladder_tokens=1, min_gap_tokens=0)
    assert plan(300, config=cfg) == [
        (128, F, 5, False, 172),
        (192, F, 5, False, 236),
        (256, F, 4, False, 299),
    ]


def test_structural_end_at_n_minus_1_is_exact_and_at_n_is_ignored():
    assert plan(1000, hints=[(999, S)]) == [(999, E, 3, True, 999)]
    # at n the boundary is past the last prefilled token: only the tail tap remains
    assert plan(1000, hints=[(1000, S)]) == [(960, F, 4, False, 999)]


def test_explicit_tap_at_n_minus_1_and_at_the_base():
    assert plan(1000, 0, [(999, HintKind.EXPLICIT)]) == [(999, E, 1, True, 999)]
    assert plan(1000, 500, [(500, HintKind.EXPLICIT)]) == [(960, F, 4, False, 999)]


def test_boundary_64_past_the_base_is_covered_65_is_not():
    assert plan(1000, 200, [(264, S)]) == [(960, F, 4, False, 999)]
    assert plan(1000, 200, [(265, S)]) == [(265, E, 3, True, 265), (960, F, 4, False, 999)]
    # the same against an existing snapshot
    assert plan(1000, 0, [(464, S)], existing=[400]) == [(960, F, 4, False, 999)]
    assert plan(1000, 0, [(465, S)], existing=[400]) == [
        (465, E, 3, True, 465),
        (960, F, 4, False, 999),
    ]


def test_tail_64_past_an_accepted_tap_is_redundant_65_is_not():
    # the tail target 999 against a structural tap at 935 (64 before) and at 934 (65 before)
    assert plan(1000, hints=[(935, S)]) == [(935, E, 3, True, 935)]
    assert plan(1000, hints=[(934, S)]) == [(934, E, 3, True, 934), (960, F, 4, False, 999)]


def test_clusters_64_apart_are_separate():
    # 63 apart: one cluster at the earliest, Boundary from the structural member
    assert plan(2000, hints=[(500, A), (563, S)]) == [
        (500, E, 3, True, 500),
        (1984, F, 4, False, 1999),
    ]
    # 64 apart: two clusters; the second lies within 64 of the first tap and is dropped, and
    # the first, automatic, is no Boundary
    assert plan(2000, hints=[(500, A), (564, S)]) == [
        (500, E, 3, False, 500),
        (1984, F, 4, False, 1999),
    ]


def test_ladder_rung_exactly_min_gap_from_a_snapshot_is_kept():
    # n = 10000: rungs 5904 and 1808; the tail 9999 -> 9984
    base = [(1792, F, 5, False, 1808), (5888, F, 5, False, 5904), (9984, F, 4, False, 9999)]
    assert plan(10_000) == base
    assert plan(10_000, existing=[4880]) == base  # 5904 - 4880 = 1024: kept
    assert plan(10_000, existing=[4881]) == [base[0], base[2]]  # 1023: dropped
    assert plan(10_000, existing=[6928]) == base  # 1024 after: kept
    assert plan(10_000, existing=[6927]) == [base[0], base[2]]


def test_ladder_snap_window_is_min_gap_wide_inclusive():
    # rung 5904 snaps back to a message boundary in [5904 - 1024, 5904]
    at_edge = plan(10_000, hints=[(4880, M)])
    assert (4864, F, 5, False, 4880) in at_edge
    assert (5888, F, 5, False, 5904) in plan(10_000, hints=[(4879, M)])
    assert (5888, F, 5, False, 5904) in plan(10_000, hints=[(5904, M)])
    assert (5888, F, 5, False, 5905) not in plan(10_000, hints=[(5905, M)])
    # the latest boundary in the window wins
    assert (5440, F, 5, False, 5500) in plan(10_000, hints=[(5000, M), (5500, M)])


def test_ladder_stops_at_the_base():
    # n - G = 4096 = base: no rung at the base, none below it
    assert plan(8192, 4096) == [(8128, F, 4, False, 8191)]
    assert plan(8192, 4095) == [(8128, F, 4, False, 8191)]  # rung 4096 is within min gap
    cfg = TapConfig(max_new_taps=8, ladder_tokens=4096, min_gap_tokens=0)
    assert plan(8192, 4095, config=cfg) == [(4096, F, 5, False, 4096), (8128, F, 4, False, 8191)]


def test_a_flexible_tap_moves_out_of_spans_until_none_is_split():
    # tail 1260 -> 1216, inside [1130, 1250) -> 1088, inside [1000, 1100) -> 960
    spans = [Span(1000, 100), Span(1130, 120)]
    assert plan(1261, spans=spans) == [(960, F, 4, False, 1260)]


def test_an_exact_tap_moves_out_of_overlapping_spans():
    # explicit 1200 in [1150, 1250) -> 1150, inside [1100, 1160) -> 1100
    spans = [Span(1100, 60), Span(1150, 100)]
    taps = plan(2000, hints=[(1200, HintKind.EXPLICIT)], spans=spans)
    assert taps[0] == (1100, E, 1, True, 1100)


def test_a_covered_boundary_does_not_head_a_cluster():
    # 230 is within 64 past the base: served there, so it may not absorb 280 (50 tokens later)
    # into a cluster that is then dropped whole
    assert plan(1000, 200, [(230, S), (280, S)]) == [
        (280, E, 3, True, 280),
        (960, F, 4, False, 999),
    ]
    assert plan(1000, 0, [(430, S), (480, S)], existing=[400]) == [
        (480, E, 3, True, 480),
        (960, F, 4, False, 999),
    ]


def test_a_boundary_64_past_the_base_does_not_absorb_a_later_one():
    assert plan(1000, 200, [(264, S), (300, S)]) == [
        (300, E, 3, True, 300),
        (960, F, 4, False, 999),
    ]


def test_a_boundary_past_the_last_token_joins_no_cluster():
    # 1000 lies past n-1: it may not lend its Boundary flag to the automatic marker at 990
    assert plan(1000, 0, [(990, A), (1000, S)]) == [(990, E, 3, False, 990)]


def test_a_short_budget_takes_the_earliest_boundary():
    one = TapConfig(max_new_taps=1, ladder_tokens=4096, min_gap_tokens=1024)
    assert plan(1000, 0, [(500, S), (700, A)], config=one) == [(500, E, 3, True, 500)]
    assert plan(1000, 0, [(500, A), (700, S)], config=one) == [(500, E, 3, False, 500)]


def test_a_rung_snaps_to_the_latest_boundary_up_to_and_including_itself():
    # rung 5904: boundaries at 5000 and exactly 5904 in the window: the rung stays at 5904
    assert (5888, F, 5, False, 5904) in plan(10_000, hints=[(5000, M), (5904, M)])
