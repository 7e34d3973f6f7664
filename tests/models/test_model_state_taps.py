"""Snapshots inside a pass (`ForwardBatch.state_taps`) through the model: the pass computes
what it computes without them, and each tap's slot receives the state a pass ending at the tap
leaves."""

from __future__ import annotations

import pytest
import torch

from ninfer.forward import StateTap
from ninfer.models.presets import PRESETS, build_random_model
from tests.models.util import Row, make_batch, make_cache, narrow

SLOTS = 5  # 0, 1: the rows' slots; 2, 3: the taps; 4: a separate pass ending at a tap


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
def test_tapped_pass_equals_the_plain_pass_and_snapshots_the_taps(ref_ops, name, ctx, offset):
    cfg, model = _model(name)
    rows = _rows(ctx)
    taps = (StateTap(1, offset, 2), StateTap(0, 17, 3))
    caches = []
    for tapped in (False, True):
        cache = make_cache(cfg, num_pages=8, num_slots=SLOTS)
        if ctx:  # the second row continues a cached context: pages and state from a prefix
            prefix = Row(list(range(7, 7 + ctx)), 0, 1, [1])
            model(make_batch([prefix], logits_indices=[ctx - 1]), cache, ref_ops)
        batch = make_batch(rows)
        if tapped:
            batch.state_taps = taps
        caches.append((model(batch, cache, ref_ops), cache))
    (plain, c0), (cut, c1) = caches
    torch.testing.assert_close(cut, plain, rtol=1e-5, atol=1e-5)
    for pool in ("conv", "ssm"):
        for slot in (0, 1):  # the rows' final states
            torch.testing.assert_close(getattr(c1, pool)[slot], getattr(c0, pool)[slot])
    # each tap: the state after its row's first `offset` tokens, as a pass that ends there
    # leaves it (the row's context, then those tokens alone, in a fresh cache's slot 4)
    for t in taps:
        row = rows[t.row]
        ref_cache = make_cache(cfg, num_pages=8, num_slots=SLOTS)
        if row.ctx_len:
            prefix = Row(list(range(7, 7 + ctx)), 0, 4, [1])
            model(make_batch([prefix], logits_indices=[ctx - 1]), ref_cache, ref_ops)
        first = Row(row.ids[: t.offset], row.ctx_len, 4, row.pages)
        model(make_batch([first], logits_indices=[0]), ref_cache, ref_ops)
        torch.testing.assert_close(c1.conv[t.slot], ref_cache.conv[4], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c1.ssm[t.slot], ref_cache.ssm[4], rtol=1e-5, atol=1e-5)
