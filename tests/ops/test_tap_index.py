"""The state-tap index of a CUDA prefill pass (`ninfer.ops.cuda.passmeta.TapIndex`), built on
the host (CPU): taps on the chunk grid and off it (the tokens the recurrence advances over),
and the alignment Triton specialises on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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


def test_taps_in_the_first_chunk_start_from_the_rows_initial_state():
    """Offsets below CHUNK (a verify row's 1 .. k): advanced from the row's initial state (the
    fp32 one the pass gathers, `opening`), their conv state partly the row's initial one
    (`near`)."""
    taps = [StateTap(1, 1, 4), StateTap(1, 3, 5), StateTap(0, 70, 6), StateTap(1, 64, 7)]
    index = TapIndex.of(taps, [100, 80], CPU)
    assert index.chunk.tolist() == [2, 2, 1, 3]  # row 1's chunks start at 2
    rest = index.rest
    assert rest.tokens.tolist() == [100, 100, 101, 102, 64, 65, 66, 67, 68, 69]
    assert rest.cu.tolist() == [0, 1, 4, 10]
    assert rest.opening.tolist() == [0, 1] and rest.opening_row.tolist() == [1, 1]
    near = index.near
    assert near.index.tolist() == [0, 1] and near.row.tolist() == [1, 1]
    assert near.offset.tolist() == [1, 3]


@pytest.mark.parametrize("offset", [0, 100])
def test_a_tap_outside_its_row_is_refused(offset):
    with pytest.raises(ValueError, match="inside its row"):
        TapIndex.of([StateTap(0, offset, 3)], [100], CPU)


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


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 90), st.integers(2, 140)), min_size=1, max_size=3),
    data=st.data(),
)
def test_conv_state_at_any_tap(rows, data):
    """`conv.write_taps` writes, at every tap, the K-1 inputs before it: from the pass's inputs,
    and for a tap fewer than K-1 tokens into its row, from the row's initial conv state
    (`conv.tap_init`, read before the conv overwrites the row's slot; zeros for a fresh row)."""
    pytest.importorskip("triton")
    from ninfer.ops.cuda import conv
    from ninfer.ops.cuda.passmeta import PassMeta

    width, channels = 4, 6
    q_lens, ctx_lens = [q for _, q in rows], [c for c, _ in rows]
    taps, slot = [], len(rows)
    for r, q in enumerate(q_lens):
        for o in sorted(data.draw(st.sets(st.integers(1, q - 1), max_size=3))):
            taps.append(StateTap(r, o, slot))
            slot += 1
    if not taps:
        return
    gen = torch.Generator().manual_seed(len(taps))
    x = torch.randn(sum(q_lens), channels, generator=gen)
    pool = torch.randn(slot, channels, width - 1, generator=gen)
    slots = torch.arange(len(rows))
    meta = PassMeta.of(q_lens, ctx_lens, CPU, taps)
    init = conv.tap_init(pool, slots, meta)
    before = pool.clone()
    pool[: len(rows)] = 7.0  # the conv writes the rows' final states before the taps
    conv.write_taps(x, width, pool, meta.taps, init)
    starts = [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    for t in taps:
        initial = before[t.row] if ctx_lens[t.row] else torch.zeros(channels, width - 1)
        row_x = x[starts[t.row] : starts[t.row] + t.offset].t()
        want = torch.cat([initial, row_x], dim=1)[:, -(width - 1) :]
        assert torch.equal(pool[t.slot], want), t


TAP_KERNELS = textwrap.dedent(
    """
    import random
    import torch
    from ninfer.forward import StateTap
    from ninfer.ops.cuda import conv
    from ninfer.ops.cuda.passmeta import PassMeta

    rng = random.Random(0)
    checked = 0
    for case in range(40):
        width, channels = rng.choice([(4, 6), (4, 130), (3, 5), (2, 9)])
        rows = [(rng.randint(0, 90) * (rng.random() < 0.7), rng.randint(2, 140))
                for _ in range(rng.randint(1, 3))]
        q_lens, ctx_lens = [q for _, q in rows], [c for c, _ in rows]
        taps, slot = [], len(rows) + 2
        for r, q in enumerate(q_lens):
            for o in sorted(rng.sample(range(1, q), min(q - 1, rng.randint(0, 3)))):
                taps.append(StateTap(r, o, slot))
                slot += 1
        if not taps:
            continue
        x_dtype = torch.float16 if case % 2 else torch.float32
        x = torch.randn(sum(q_lens), channels + 3)[:, 1 : channels + 1].to(x_dtype)  # a view
        pool = torch.randn(slot, channels, width - 1) * 1e3
        pool[0, 0, 0] = -pool[0, 0, 0].abs()
        slots = torch.randperm(len(rows) + 2)[: len(rows)]
        meta = PassMeta.of(q_lens, ctx_lens, torch.device("cpu"), taps)
        want_init = got_init = None
        if meta.taps.near is not None:
            want_init = conv.tap_init_ref(pool, slots, meta)
            got_init = conv._tap_init(pool, slots, meta)
            assert torch.equal(got_init.view(torch.int32), want_init.view(torch.int32)), case
        want, got = pool.clone(), pool.clone()
        conv.write_taps_ref(x, width, want, meta.taps, want_init)
        conv._write_taps(x, width, got, meta.taps, got_init)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), case
        checked += 1
    assert checked > 25, checked
    print("ok")
    """
)


def test_tap_kernels_equal_the_torch_ops_under_the_interpreter():
    """`conv._tap_init` and `conv._write_taps` (the CUDA path: one launch each) under Triton's
    interpreter give `tap_init_ref` and `write_taps_ref`'s values bit for bit (the sign of a
    fresh row's zeros included): random rows, taps near and far from their row's start,
    widths 2-4, x a strided view in fp32 or fp16 over an fp32 state."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", TAP_KERNELS], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
