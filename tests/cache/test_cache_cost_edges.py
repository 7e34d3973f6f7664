"""The CPU preset of CacheCostModel (spec §6.2): its coefficients, and the prefill and restore
seconds they give for exact token and byte counts (the linear formula of the class docstring)."""

from __future__ import annotations

import pytest

from ninfer.cache import CacheCostModel


def test_cpu_preset_has_the_documented_coefficients():
    assert CacheCostModel.cpu() == CacheCostModel(
        token_s=2.0e-3,
        pair_s=2.0e-8,
        chunk_s=5.0e-3,
        chunk_tokens=512,
        h2d_bytes_per_s=10e9,
        batch_latency_s=0.0,
    )
    assert CacheCostModel.cpu(64).chunk_tokens == 64


@pytest.mark.parametrize(
    ("base", "tokens", "chunks"),
    [(0, 1, 1), (0, 512, 1), (0, 513, 2), (100, 1024, 2), (4096, 1025, 3)],
)
def test_cpu_prefill_seconds_follow_the_formula(base, tokens, chunks):
    pairs = base * tokens + tokens * (tokens + 1) // 2
    want = 2.0e-3 * tokens + 2.0e-8 * pairs + 5.0e-3 * chunks
    assert CacheCostModel.cpu().prefill_seconds(base, tokens) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("nbytes", [1, 4096, 10**9, 10**10 + 1])
def test_cpu_restore_seconds_are_bytes_over_10_gbps(nbytes):
    assert CacheCostModel.cpu().restore_seconds(nbytes) == pytest.approx(nbytes / 1e10, rel=1e-12)
