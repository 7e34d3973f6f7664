"""A snapshot inside a pass (`ForwardBatch.gdn_split`): the pass computes what it computes
without one, and the snapshot slot receives the state a pass ending at the cut leaves."""

from __future__ import annotations

import pytest
import torch

from ninfer.forward import split_last_row
from ninfer.models.presets import PRESETS, build_random_model
from tests.models.util import Row, make_batch, make_cache, narrow

SLOTS = 4  # 0, 1: the rows' slots; 2: the snapshot; 3: a separate pass ending at the cut


def _model(name: str):
    cfg = narrow(PRESETS[name], layers=4)  # 3 GDN layers and 1 attention layer
    return cfg, build_random_model(cfg, torch.float32, "cpu", seed=5)


def _rows(ctx: int) -> list[Row]:
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 512, (40,), generator=g).tolist()
    b = torch.randint(0, 512, (200,), generator=g).tolist()
    return [Row(a, 0, 0, [0]), Row(b, ctx, 1, [1, 2, 3, 4, 5])]


@pytest.mark.parametrize("name", ["9B", "35B-A3B"])
@pytest.mark.parametrize(("ctx", "offset"), [(0, 128), (20, 1), (20, 199)])
def test_split_pass_equals_the_plain_pass_and_snapshots_the_cut(ref_ops, name, ctx, offset):
    cfg, model = _model(name)
    rows = _rows(ctx)
    caches = []
    for split in (False, True):
        cache = make_cache(cfg, num_pages=8, num_slots=SLOTS)
        if ctx:  # the second row continues a cached context: pages and state from a prefix
            prefix = Row(list(range(7, 7 + ctx)), 0, 1, [1])
            model(make_batch([prefix], logits_indices=[ctx - 1]), cache, ref_ops)
        batch = make_batch(rows)
        if split:
            batch.gdn_split = split_last_row(batch, offset, src=1, dst=2)
        caches.append((model(batch, cache, ref_ops), cache))
    (plain, c0), (cut, c1) = caches
    torch.testing.assert_close(cut, plain, rtol=1e-5, atol=1e-5)
    for pool in ("conv", "ssm"):
        for slot in (0, 1):  # the rows' final states
            torch.testing.assert_close(getattr(c1, pool)[slot], getattr(c0, pool)[slot])
    # the snapshot: the state after the second row's first `offset` tokens, as a pass that
    # ends there leaves it (the prefix, then those tokens alone, in a fresh cache's slot 3)
    first = rows[1].ids[:offset]
    ref_cache = make_cache(cfg, num_pages=8, num_slots=SLOTS)
    if ctx:
        prefix = Row(list(range(7, 7 + ctx)), 0, 3, [1])
        model(make_batch([prefix], logits_indices=[ctx - 1]), ref_cache, ref_ops)
    model(make_batch([Row(first, ctx, 3, [1, 2, 3, 4, 5])], logits_indices=[0]), ref_cache, ref_ops)
    torch.testing.assert_close(c1.conv[2], ref_cache.conv[3], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c1.ssm[2], ref_cache.ssm[3], rtol=1e-5, atol=1e-5)


def test_split_rejects_offsets_outside_the_last_row_and_its_own_slot():
    batch = make_batch(_rows(0))
    for offset in (0, 200, 250):
        with pytest.raises(ValueError, match="offset"):
            split_last_row(batch, offset, src=1, dst=2)
    with pytest.raises(ValueError, match="own slot"):
        split_last_row(batch, 10, src=1, dst=1)
    split = split_last_row(batch, 10, src=1, dst=2)
    assert split.cut == 50 and split.head.q_lens == [40, 10] and split.tail.q_lens == [190]
    assert split.tail.ctx_lens == [10] and split.head.cu_q.tolist() == [0, 40, 50]
    assert split.tail.cu_q.tolist() == [0, 190] and split.tail.state_slots.tolist() == [1]
