"""Spec §13.1 HostSlabPool and the Host slab geometry: exhaustion, reuse, chunked allocation, no
slab crosses a chunk, the budget rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.cache import CacheConfig, CacheCostModel, HostSlabPool, PrefixIndex
from ninfer.cache.host_pool import MIB, cut_slabs, plan_slab_geometry


def test_fresh_slabs_ascending_then_exhaustion_changes_nothing():
    pool = HostSlabPool(cut_slabs(host_cache_bytes=5 * 4096, slab_bytes=4096))
    assert pool.n_slabs == 5
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(3) == [2, 3, 4]
    assert pool.allocate(1) is None  # exhausted: all-or-nothing
    assert pool.free_slabs == 0
    pool.check_invariants()


def test_lowest_free_slabs_come_first_ascending():
    pool = HostSlabPool(cut_slabs(8 * 4096, 4096))
    assert pool.allocate(4) == [0, 1, 2, 3]
    pool.free([3, 1])
    assert pool.allocate(3) == [1, 3, 4]  # consecutive ids make long copy runs
    with pytest.raises(ValueError):
        pool.free([1, 1])
    pool.check_invariants()


def test_allocation_that_does_not_fit_leaves_the_pool_unchanged():
    pool = HostSlabPool(cut_slabs(3 * 4096, 4096))
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(2) is None
    assert pool.allocate(1) == [2]


def test_chunks_hold_whole_slabs_only():
    # 10 KiB chunks hold two 4 KiB slabs; 7 slabs -> chunks of 2, 2, 2, 1
    g = cut_slabs(7 * 4096 + 100, 4096, max_chunk_bytes=10 * 1024)
    pool = HostSlabPool(g)
    assert (pool.n_slabs, pool.slabs_per_chunk, g.num_chunks) == (7, 2, 4)
    assert g.chunk_slabs == (2, 2, 2, 1)
    assert [g.locate(s) for s in (0, 1, 2, 5, 6)] == [(0, 0), (0, 1), (1, 0), (2, 1), (3, 0)]


@settings(max_examples=60, deadline=None)
@given(
    slab=st.integers(1 << 10, 1 << 20),
    chunk=st.integers(1, 1 << 24),
    total=st.integers(0, 1 << 26),
)
def test_no_slab_crosses_a_chunk(slab, chunk, total):
    if chunk < slab:
        with pytest.raises(ValueError):
            cut_slabs(total, slab, chunk)
        return
    g = cut_slabs(total, slab, chunk)
    assert sum(g.chunk_slabs) == g.num_slabs
    assert all(n * slab <= chunk for n in g.chunk_slabs)
    for s in {0, g.num_slabs - 1, g.slabs_per_chunk - 1, g.slabs_per_chunk}:
        if 0 <= s < g.num_slabs:
            c, local = g.locate(s)
            assert local < g.chunk_slabs[c]


def test_host_budget_smaller_than_one_snapshot_plus_one_block_is_rejected():
    cfg = dict(slab_bytes=4096, image_bytes=3 * 4096, device_snapshot_slots=2)
    with pytest.raises(ValueError, match="one snapshot plus one block"):
        PrefixIndex(CacheConfig(host_cache_bytes=4 * 4096, **cfg), CacheCostModel.cpu())
    ix = PrefixIndex(CacheConfig(host_cache_bytes=5 * 4096, **cfg), CacheCostModel.cpu())
    assert ix.host.n_slabs == 5
    assert PrefixIndex(CacheConfig(host_cache_bytes=0, **cfg), CacheCostModel.cpu()).host is None


def test_freeing_outside_the_pool_or_twice_names_the_slab():
    pool = HostSlabPool(cut_slabs(5 * 4096, 4096))
    pool.allocate(5)
    for bad in (5, -1):
        with pytest.raises(ValueError, match=rf"^slab {bad} is not allocated$"):
            pool.free([bad])
    pool.free([4])
    with pytest.raises(ValueError, match=r"^slab 4 is not allocated$"):
        pool.free([4])
    assert pool.free_slabs == 1
    pool.check_invariants()


def test_check_invariants_names_a_corrupted_pool():
    pool = HostSlabPool(cut_slabs(4 * 4096, 4096))
    pool.allocate(2)
    pool._free.append(2)  # slab 2 listed twice
    with pytest.raises(AssertionError, match=r"^slab on the free heap twice$"):
        pool.check_invariants()
    pool = HostSlabPool(cut_slabs(4 * 4096, 4096))
    pool.allocate(2)
    pool._free.remove(3)  # slab 3 lost
    with pytest.raises(AssertionError, match=r"^slab neither free nor allocated$"):
        pool.check_invariants()
    pool = HostSlabPool(cut_slabs(4 * 4096, 4096))
    pool.allocate(2)
    pool._free.append(1)  # slab 1 free and allocated
    with pytest.raises(AssertionError, match=r"^slab 1 both free and allocated$"):
        pool.check_invariants()


def test_pool_geometry_is_checked():
    with pytest.raises(ValueError, match=r"^slab_bytes must be positive, got 0$"):
        cut_slabs(4096, 0)
    with pytest.raises(ValueError, match=r"^max_chunk_bytes must hold at least one slab$"):
        cut_slabs(8192, 4096, max_chunk_bytes=4095)
    tiny = HostSlabPool(cut_slabs(3, 1, max_chunk_bytes=1))  # the smallest valid geometry
    assert (tiny.n_slabs, tiny.geometry.chunk_slabs) == (3, (1, 1, 1))
    assert cut_slabs(8192, 4096, max_chunk_bytes=4096).num_chunks == 2


def test_geometry_27b_bf16():
    # 16 FA layers x 4 KV heads x 256 x bf16: 256 KiB per layer page, 4 MiB per bundle;
    # image 48 x (3 MiB + 60 KiB) -> 37 slabs.
    image = 48 * (3 * MIB + 10240 * 3 * 2)
    g = plan_slab_geometry(8192, 16, 2 * 64 * 4 * 256 * 2, image)
    assert (g.cell_bytes, g.slab_bytes, g.num_slabs) == (256 << 10, 4 * MIB, 2048)
    assert (g.slabs_per_chunk, g.num_chunks, g.image_slabs) == (1024, 2, 37)
    assert g.chunk_starts == (0, 1024) and g.chunk_slabs == (1024, 1024)
    assert g.locate(1023) == (0, 1023) and g.locate(1024) == (1, 0)


def test_last_chunk_is_partial_and_slabs_never_cross_chunks():
    g = plan_slab_geometry(1, 2, 1024, 3000, max_chunk_bytes=7 * 2048 + 100)
    assert g.num_slabs == 512 and g.slabs_per_chunk == 7
    assert g.num_chunks == 74 and g.chunk_slabs[-1] == 512 - 73 * 7
    assert sum(g.chunk_slabs) == g.num_slabs
    with pytest.raises(IndexError):
        g.locate(512)


def test_zero_budget_means_no_host_tier():
    assert plan_slab_geometry(0, 2, 1024, 3000) is None


def test_budget_below_one_snapshot_plus_one_block_is_rejected():
    # 1 MiB = 512 slabs of 2048 B: an image of 511 slabs leaves no room for its tail and a block
    with pytest.raises(ValueError, match=r"host_cache_mib=1 .* host_cache_mib >= 2"):
        plan_slab_geometry(1, 2, 1024, 511 * 2048)
    assert plan_slab_geometry(1, 2, 1024, 510 * 2048).num_slabs == 512
    with pytest.raises(ValueError, match="host_cache_mib must be >= 0"):
        plan_slab_geometry(-1, 2, 1024, 3000)
    with pytest.raises(ValueError, match="does not fit a chunk"):
        plan_slab_geometry(1, 2, 1024, 3000, max_chunk_bytes=2047)
