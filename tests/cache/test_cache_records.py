"""CacheConfig (docs/cache-api.md): the config of an index over the engine's Host tier geometry
(`for_host`) holds that geometry's sizes and the geometry itself, and the taps it is given."""

from __future__ import annotations

import pytest

from ninfer.cache import CacheConfig, TapConfig
from ninfer.cache.host_pool import cut_slabs, plan_slab_geometry


@pytest.mark.parametrize(
    "taps", [None, TapConfig(max_new_taps=3, ladder_tokens=512, min_gap_tokens=128)]
)
def test_config_for_a_host_geometry_reads_its_sizes_from_it(taps):
    # 3 full-attention layers x 1000 B pages: 3000 B slabs, 3 to a 10000 B chunk, 349 slabs
    g = plan_slab_geometry(1, 3, 1000, 7000, max_chunk_bytes=10_000)
    assert (g.slab_bytes, g.slabs_per_chunk, g.num_slabs, g.image_slabs) == (3000, 3, 349, 3)
    cfg = CacheConfig.for_host(g, device_snapshot_slots=5, taps=taps)
    assert cfg == CacheConfig(
        slab_bytes=3000,
        image_bytes=7000,
        host_cache_bytes=349 * 3000,
        device_snapshot_slots=5,
        host_chunk_bytes=9000,  # the whole slabs a chunk holds, not the chunk limit
        taps=TapConfig() if taps is None else taps,
        host=g,
    )
    assert type(cfg.host_chunk_bytes) is int
    assert cfg.host is g and cfg.host_geometry() is g
    assert cfg.image_slabs == 3
    if taps is not None:
        assert cfg.taps is taps


def test_config_without_a_geometry_cuts_the_same_one():
    g = cut_slabs(20 * 4096, 4096, max_chunk_bytes=6 * 4096, image_bytes=2 * 4096 + 1)
    cfg = CacheConfig.for_host(g, device_snapshot_slots=2)
    plain = CacheConfig(
        slab_bytes=cfg.slab_bytes,
        image_bytes=cfg.image_bytes,
        host_cache_bytes=cfg.host_cache_bytes,
        device_snapshot_slots=2,
        host_chunk_bytes=cfg.host_chunk_bytes,
    )
    assert plain.host is None and plain.taps == TapConfig()
    assert plain.host_geometry() == g
    assert CacheConfig(4096, 4096, 0, 2).host_geometry() is None
