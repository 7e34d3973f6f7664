"""Spec §13.1 HostSlabPool: exhaustion, reuse, chunked allocation, no slab crosses a chunk."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.cache import CacheConfig, CacheCostModel, CopyRun, HostSlabPool, PrefixIndex


def test_fresh_slabs_ascending_then_exhaustion_changes_nothing():
    pool = HostSlabPool(host_cache_bytes=5 * 4096, slab_bytes=4096)
    assert pool.n_slabs == 5
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(3) == [2, 3, 4]
    assert pool.allocate(1) is None  # exhausted: all-or-nothing
    assert pool.free_slabs == 0
    pool.check_invariants()


def test_lowest_free_slabs_come_first_ascending():
    pool = HostSlabPool(8 * 4096, 4096)
    assert pool.allocate(4) == [0, 1, 2, 3]
    pool.free([3, 1])
    assert pool.allocate(3) == [1, 3, 4]  # consecutive ids make long copy runs
    with pytest.raises(ValueError):
        pool.free([1, 1])
    pool.check_invariants()


def test_allocation_that_does_not_fit_leaves_the_pool_unchanged():
    pool = HostSlabPool(3 * 4096, 4096)
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(2) is None
    assert pool.allocate(1) == [2]


def test_chunks_hold_whole_slabs_only():
    # 10 KiB chunks hold two 4 KiB slabs; 7 slabs -> chunks of 2, 2, 2, 1
    pool = HostSlabPool(7 * 4096 + 100, 4096, max_chunk_bytes=10 * 1024)
    assert (pool.n_slabs, pool.slabs_per_chunk, pool.n_chunks) == (7, 2, 4)
    assert [pool.chunk_bytes(c) for c in range(4)] == [8192, 8192, 8192, 4096]
    assert [pool.slab_location(s) for s in (0, 1, 2, 5, 6)] == [
        (0, 0),
        (0, 4096),
        (1, 0),
        (2, 4096),
        (3, 0),
    ]


@settings(max_examples=60, deadline=None)
@given(
    slab=st.integers(1 << 10, 1 << 20),
    chunk=st.integers(1, 1 << 24),
    total=st.integers(0, 1 << 26),
)
def test_no_slab_crosses_a_chunk(slab, chunk, total):
    if chunk < slab:
        with pytest.raises(ValueError):
            HostSlabPool(total, slab, chunk)
        return
    pool = HostSlabPool(total, slab, chunk)
    assert sum(pool.chunk_bytes(c) for c in range(pool.n_chunks)) == pool.n_slabs * slab
    for s in {0, pool.n_slabs - 1, pool.slabs_per_chunk - 1, pool.slabs_per_chunk}:
        if 0 <= s < pool.n_slabs:
            loc = pool.slab_location(s)
            assert loc.offset_bytes + slab <= pool.chunk_bytes(loc.chunk) <= chunk


def test_copy_runs_coalesce_but_split_at_chunk_and_gaps():
    pool = HostSlabPool(8 * 4096, 4096, max_chunk_bytes=4 * 4096)  # chunks: slabs 0-3, 4-7
    pairs = [(10, 1), (11, 2), (12, 3), (13, 4), (14, 5), (20, 6), (21, 0)]
    assert pool.copy_runs(pairs) == [
        CopyRun(10, 1, 3),  # slab 4 is in the next chunk
        CopyRun(13, 4, 2),
        CopyRun(20, 6, 1),  # page gap
        CopyRun(21, 0, 1),  # slab not consecutive
    ]


def test_host_budget_smaller_than_one_snapshot_plus_one_block_is_rejected():
    cfg = dict(slab_bytes=4096, image_bytes=3 * 4096, device_snapshot_slots=2)
    with pytest.raises(ValueError, match="one snapshot plus one block"):
        PrefixIndex(CacheConfig(host_cache_bytes=4 * 4096, **cfg), CacheCostModel.cpu())
    ix = PrefixIndex(CacheConfig(host_cache_bytes=5 * 4096, **cfg), CacheCostModel.cpu())
    assert ix.host.n_slabs == 5
    assert PrefixIndex(CacheConfig(host_cache_bytes=0, **cfg), CacheCostModel.cpu()).host is None


def test_freeing_outside_the_pool_or_twice_names_the_slab():
    pool = HostSlabPool(5 * 4096, 4096)
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
    pool = HostSlabPool(4 * 4096, 4096)
    pool.allocate(2)
    pool._free.append(2)  # slab 2 listed twice
    with pytest.raises(AssertionError, match=r"^slab on the free heap twice$"):
        pool.check_invariants()
    pool = HostSlabPool(4 * 4096, 4096)
    pool.allocate(2)
    pool._free.remove(3)  # slab 3 lost
    with pytest.raises(AssertionError, match=r"^slab neither free nor allocated$"):
        pool.check_invariants()
    pool = HostSlabPool(4 * 4096, 4096)
    pool.allocate(2)
    pool._free.append(1)  # slab 1 free and allocated
    with pytest.raises(AssertionError, match=r"^slab 1 both free and allocated$"):
        pool.check_invariants()


def test_pool_geometry_is_checked():
    with pytest.raises(ValueError, match=r"^slab_bytes must be positive, got 0$"):
        HostSlabPool(4096, 0)
    with pytest.raises(ValueError, match=r"^max_chunk_bytes must hold at least one slab$"):
        HostSlabPool(8192, 4096, max_chunk_bytes=4095)
    tiny = HostSlabPool(3, 1, max_chunk_bytes=1)  # the smallest valid geometry
    assert (tiny.n_slabs, tiny.n_chunks, tiny.chunk_bytes(2)) == (3, 3, 1)
    assert HostSlabPool(8192, 4096, max_chunk_bytes=4096).n_chunks == 2
