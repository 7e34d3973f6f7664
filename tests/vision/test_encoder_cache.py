"""`EncoderCache`: the tower's outputs by image digest, least recently used out, within its
byte capacity; hits and misses counted."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.engine.images import EncoderCache
from ninfer.engine.kv.counters import EngineCounters
from ninfer.vision.preprocess import ProcessedImage


def _image(key: int, tokens: int) -> ProcessedImage:
    return ProcessedImage(torch.full((tokens, 2), float(key)), (1, 2, 2), tokens, bytes([key]))


def _tower(calls: list):
    def run(pixels, grids):
        calls.append(int(pixels[0, 0]))
        return pixels.clone()

    return run


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4)), max_size=30),
    st.integers(0, 64),
)
def test_outputs_equal_the_towers_within_capacity(requests, capacity):
    """Every answer equals the tower's; the kept bytes never pass the capacity; the tower
    runs exactly on the misses; a key asked twice in a row with room for it hits."""
    calls, counters = [], EngineCounters()
    cache = EncoderCache(capacity, counters)
    sizes = {}
    for key, tokens in requests:
        tokens = sizes.setdefault(key, tokens)  # one digest, one image
        out = cache.encode(_image(key, tokens), _tower(calls))
        assert torch.equal(out, torch.full((tokens, 2), float(key)))
        assert cache.used <= capacity
        before = counters.encoder_cache_hits
        cache.encode(_image(key, tokens), _tower(calls))
        fits = tokens * 2 * 4 <= capacity
        assert counters.encoder_cache_hits == before + fits
    assert len(calls) == counters.encoder_cache_misses


def test_least_recently_used_goes_first():
    calls, counters = [], EngineCounters()
    cache = EncoderCache(2 * 8 * 2, counters)  # two outputs of 2 tokens x 2 fp32
    tower = _tower(calls)
    for key in (1, 2, 1, 3, 1, 2):
        cache.encode(_image(key, 2), tower)
    assert calls == [1, 2, 3, 2]  # 3 pushed out 2 (1 was used after it); 1 stayed
