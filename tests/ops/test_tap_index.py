"""The state-tap index of a CUDA prefill pass (`ninfer.ops.cuda.passmeta.TapIndex`), built on
the host (CPU): taps on the chunk grid and off it (the tokens the recurrence advances over),
and the alignment Triton specialises on."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.forward import StateTap
from ninfer.ops.cuda.passmeta import CHUNK, TapIndex

CPU = torch.device("cpu")


def test_taps_on_and_off_the_grid():
    rows = [300, 200]  # row 1's chunks start at 5 (ceil(300 / 64)), its tokens at 300
    taps = [StateTap(0, 100, 4), StateTap(0, 128, 5), StateTap(1, 70, 6)]
    index = TapIndex.of(taps, rows, CPU)
    assert index.cut.tolist() == [100, 128, 370]
    assert index.chunk.tolist() == [1, 2, 6]
    assert index.slot.tolist() == [4, 5, 6]
    rest = index.rest
    assert rest.tokens.tolist() == [*range(64, 100), *range(364, 370)]
    assert rest.cu.tolist() == [0, 36, 42]
    assert rest.chunk.tolist() == [1, 6] and rest.slot.tolist() == [4, 6]


def test_grid_taps_have_no_rest():
    index = TapIndex.of([StateTap(0, 64, 3), StateTap(0, 192, 4)], [256], CPU)
    assert index.rest is None and index.chunk.tolist() == [1, 3]


def test_a_tap_in_the_first_chunk_of_its_row_is_refused():
    with pytest.raises(ValueError, match="below 64"):
        TapIndex.of([StateTap(0, 63, 3)], [256], CPU)


@settings(max_examples=50, deadline=None)
@given(offsets=st.lists(st.integers(CHUNK, 999), min_size=1, max_size=6, unique=True))
def test_the_recurrent_kernel_reads_an_aligned_cu(offsets):
    """`rest.cu` starts 16-byte aligned whatever the number of tokens before the taps: Triton
    compiles another variant for a pointer that is not, at the first pass that makes one."""
    taps = [StateTap(0, o, 10 + i) for i, o in enumerate(sorted(offsets))]
    rest = TapIndex.of(taps, [1000], CPU).rest
    if rest is not None:
        assert rest.cu.data_ptr() % 16 == 0
        ends = [o % CHUNK for o in sorted(offsets) if o % CHUNK]
        assert rest.cu.tolist() == [0, *torch.tensor(ends).cumsum(0).tolist()]
