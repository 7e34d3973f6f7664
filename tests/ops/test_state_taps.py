"""State taps (`forward.StateTap`) in the reference op: one pass over rows with taps inside them
leaves in every tap's slot exactly the state that passes split at the taps leave, bit for bit,
and computes what those passes compute."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.forward import StateTap, check_state_taps
from ninfer.ops.reference import ReferenceOps
from tests.ops.state_taps import Layer


@st.composite
def _rows_and_taps(draw):
    rows = draw(st.lists(st.tuples(st.integers(0, 150), st.integers(2, 200)), min_size=1,
                         max_size=3))  # fmt: skip
    taps = []
    for r, (_, q) in enumerate(rows):
        for offset in sorted(draw(st.sets(st.integers(1, q - 1), max_size=3))):
            taps.append((r, offset))
    return rows, [StateTap(r, o, len(rows) + i) for i, (r, o) in enumerate(taps)]


@settings(max_examples=25, deadline=None)
@given(case=_rows_and_taps(), seed=st.integers(0, 3))
def test_taps_equal_passes_split_at_them(case, seed):
    rows, taps = case
    layer = Layer(rows, len(taps), seed)
    ops = ReferenceOps()
    inputs, (out, conv, ssm) = layer.tapped_exact(ops, taps)
    ref_out, ref_conv, ref_ssm = layer.split_exact(ops, taps, *inputs)
    assert torch.equal(out, ref_out)
    assert torch.equal(conv[:-1], ref_conv) and torch.equal(ssm[:-1], ref_ssm)


def test_a_tap_leaves_the_row_and_the_other_slots_alone():
    rows = [(0, 130), (70, 100)]
    layer = Layer(rows, 1, 0)
    ops = ReferenceOps()
    plain_out, plain_conv, plain_ssm = layer.tapped(ops, [])
    out, conv, ssm = layer.tapped(ops, [StateTap(1, 64, 2)])
    torch.testing.assert_close(out, plain_out, rtol=1e-5, atol=1e-5)
    for slot in (0, 1):
        torch.testing.assert_close(ssm[slot], plain_ssm[slot], rtol=1e-5, atol=1e-5)
        assert torch.equal(conv[slot], plain_conv[slot])
    assert torch.equal(conv[3], plain_conv[3]) and torch.equal(ssm[3], plain_ssm[3])
    assert not torch.equal(ssm[2], plain_ssm[2])


def test_taps_outside_a_row_or_into_a_row_slot_are_refused():
    for taps in ([StateTap(0, 0, 2)], [StateTap(0, 5, 2)], [StateTap(2, 1, 3)]):
        with pytest.raises(ValueError, match="inside"):
            check_state_taps(taps, [5, 3], [0, 1])
    with pytest.raises(ValueError, match="own slot"):
        check_state_taps([StateTap(0, 2, 1)], [5, 3], [0, 1])
    with pytest.raises(ValueError, match="one slot"):
        check_state_taps([StateTap(0, 2, 2), StateTap(1, 1, 2)], [5, 3], [0, 1])
    check_state_taps([StateTap(0, 4, 2), StateTap(1, 2, 3)], [5, 3], [0, 1])
