"""CacheCostModel (spec §6.2, §11.4): the formulas and the presets."""

from __future__ import annotations

import pytest

from ninfer.cache import CacheCostModel


def test_prefill_seconds_tokens_pairs_and_chunks():
    m = CacheCostModel(1e-3, 1e-6, 0.5, 100, 1e9, 0.01)
    # base 10, 150 tokens: 150 tokens + (10*150 + 150*151/2) pairs + 2 chunks
    assert m.prefill_seconds(10, 150) == pytest.approx(0.15 + 1e-6 * (1500 + 11325) + 1.0)
    assert m.prefill_seconds(10, 0) == 0.0
    # a later base costs more for the same tokens (attention over the cached prefix)
    assert m.prefill_seconds(1000, 150) > m.prefill_seconds(10, 150)


def test_restore_seconds_bandwidth_plus_batch_latency():
    m = CacheCostModel(1e-3, 0.0, 0.0, 64, 2e9, 0.01)
    assert m.restore_seconds(0) == 0.0
    assert m.restore_seconds(4e9) == pytest.approx(2.01)


def test_h200_preset_uses_measured_55_gbps_and_makes_host_restore_cheap():
    m = CacheCostModel.h200()
    assert m.h2d_bytes_per_s == 55e9
    # 100k tokens of 27B KV at ~64 KiB/token bf16 restore in well under the prefill time
    restore = m.restore_seconds(100_000 * 64 * 1024)
    prefill = m.prefill_seconds(0, 100_000)
    assert restore < prefill / 50
    assert CacheCostModel.cpu().prefill_seconds(0, 64) > CacheCostModel.h200().prefill_seconds(
        0, 64
    )
