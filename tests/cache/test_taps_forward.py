"""TapPlanner forward ladder (priority 6): rungs base + R*2^k up to n-1, deepest first, flexible
Tap kind, after every other candidate. Exact positions at the rung limits, the proximity rule,
the budget and the vision spans, then the fork guarantee as a property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.cache import HintKind, Placement, Span, TapConfig, TapHint, plan_taps

E, F = Placement.EXACT, Placement.FLEXIBLE
S = HintKind.STRUCTURAL
FWD = TapConfig(max_new_taps=8, ladder_tokens=4096, min_gap_tokens=1024, forward_tokens=512)
NO_BACKWARD = TapConfig(max_new_taps=8, ladder_tokens=1 << 20, min_gap_tokens=1024,
                        forward_tokens=512)  # fmt: skip


def plan(n, base=0, hints=(), existing=(), spans=(), config=FWD):
    taps = plan_taps(n, base, [TapHint(p, k) for p, k in hints], existing, spans, config)
    return [(t.position, t.placement, t.priority, t.boundary, t.target) for t in taps]


def test_no_forward_ladder_by_default_and_a_negative_r_is_refused():
    assert TapConfig().forward_tokens == 0
    assert plan(2100, config=TapConfig()) == [(2048, F, 4, False, 2099)]
    with pytest.raises(ValueError, match=r"^TapConfig\.forward_tokens must be >= 0, got -1$"):
        TapConfig(forward_tokens=-1)


def test_rungs_double_from_a_cold_base():
    # rungs 512, 1024, 2048; 2048 is where the tail 2099 is floored to: one tap there
    assert plan(2100) == [
        (512, F, 6, False, 512),
        (1024, F, 6, False, 1024),
        (2048, F, 4, False, 2099),
    ]


def test_rungs_double_from_an_unaligned_resume_base():
    # base 1000: rungs 1512, 2024, 3048 (5096 is past n-1), each floored to a block boundary
    assert plan(4000, 1000) == [
        (1472, F, 6, False, 1512),
        (1984, F, 6, False, 2024),
        (3008, F, 6, False, 3048),
        (3968, F, 4, False, 3999),
    ]


def test_a_rung_at_n_minus_1_is_planned_one_at_n_is_not():
    # the tail 1024 is redundant (64 past the boundary at 960), and so is a rung at 1024 = n-1
    assert plan(1025, 0, [(960, S)]) == [(512, F, 6, False, 512), (960, E, 3, True, 960)]
    # base 1: the rung 1 + 1024 = 1025 = n is no rung (at 1024 it would be 65 past 960)
    assert plan(1025, 1, [(960, S)]) == [(512, F, 6, False, 513), (960, E, 3, True, 960)]
    # base 0, n = 1026: the rung 1024 <= n-1 lies 64 past 960 (redundant), the tail 65 (kept)
    assert plan(1026, 0, [(960, S)]) == [
        (512, F, 6, False, 512),
        (960, E, 3, True, 960),
        (1024, F, 4, False, 1025),
    ]
    # the first rung: base + R = n-1 shares the tail's tap, base + R = n is none
    assert plan(513) == [(512, F, 4, False, 512)]
    assert plan(512) == [(448, F, 4, False, 511)]


def test_a_rung_64_past_a_snapshot_is_redundant_65_is_not():
    tail = (2048, F, 4, False, 2099)
    assert plan(2100, existing=[448]) == [(1024, F, 6, False, 1024), tail]
    assert plan(2100, existing=[447]) == [(512, F, 6, False, 512), (1024, F, 6, False, 1024), tail]
    # a rung exactly at a snapshot is deduplicated; one above a rung does not hide it
    assert plan(2100, existing=[1024]) == [(512, F, 6, False, 512), tail]
    assert plan(2100, existing=[1025]) == [(512, F, 6, False, 512), (1024, F, 6, False, 1024),
                                           tail]  # fmt: skip
    # against an accepted tap: the rung 1024 lies 24 past a structural tap at 1000
    assert plan(2100, hints=[(1000, S)]) == [
        (512, F, 6, False, 512),
        (1000, E, 3, True, 1000),
        tail,
    ]


def test_budget_takes_the_deepest_rungs_after_every_other_candidate():
    # no backward rungs (G past n): the tail, then the rungs 16384, 8192, 4096, ... in turn
    tail = (19968, F, 4, False, 19999)
    for budget, rungs in [(1, []), (2, [16384]), (3, [8192, 16384]), (4, [4096, 8192, 16384])]:
        cfg = TapConfig(budget, 1 << 20, 1024, 512)
        assert plan(20_000, config=cfg) == [(r, F, 6, False, r) for r in rungs] + [tail]
    # the backward ladder (priority 5) goes first: 15904 (snapped to nothing), then 11808
    two = TapConfig(2, 4096, 1024, 512)
    assert plan(20_000, config=two) == [(15872, F, 5, False, 15904), tail]


def test_a_long_cold_prompt_shares_rungs_with_the_backward_ladder():
    # n = 32768: backward rungs 28672, 24576, 16384; forward 16384 is the same position, and
    # the budget of 8 ends before the rung 512
    assert [(p, q) for p, _, q, _, _ in plan(32_768)] == [
        (1024, 6),
        (2048, 6),
        (4096, 6),
        (8192, 6),
        (16384, 5),
        (24576, 5),
        (28672, 5),
        (32704, 4),
    ]


def test_a_rung_inside_a_vision_span_moves_to_its_start():
    # rung 1024 inside [1000, 1100): target 1000, floored to 960
    taps = plan(2100, spans=[Span(1000, 100)], config=NO_BACKWARD)
    assert taps == [(512, F, 6, False, 512), (960, F, 6, False, 1000), (2048, F, 4, False, 2099)]


# ---- the fork guarantee --------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(2, 70_000),
    base_frac=st.floats(0, 1),
    r=st.sampled_from([128, 256, 512, 2048]),  # R > 64: base + R is no base neighbour
    data=st.data(),
)
def test_a_fork_at_depth_p_finds_a_tap_at_least_halfway_from_the_base(n, base_frac, r, data):
    """Without hints and with budget to spare, every depth p in [base + R, n-1] has a planned
    tap at or below it at least halfway from the base to p (less the floor to a block)."""
    base = min(int(base_frac * (n - 2)), n - 2)
    cfg = TapConfig(max_new_taps=64, ladder_tokens=1 << 20, min_gap_tokens=0, forward_tokens=r)
    taps = plan_taps(n, base, (), (), (), cfg)
    assert all(t.priority in (4, 6) and not t.boundary for t in taps)
    for t in taps:
        if t.priority == 6:
            k = (t.target - base) // r
            assert t.target - base == r * k and k & (k - 1) == 0  # base + R*2^k
            assert t.position == t.target - t.target % 64 and base < t.position < n
    if base + r > n - 1:
        return
    p = data.draw(st.integers(base + r, n - 1))
    below = [t.position for t in taps if t.position <= p]
    assert below and 2 * (max(below) + 63 - base) >= p - base, (p, below)
