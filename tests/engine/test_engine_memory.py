"""The memory layer on its own: page pool partition, state-slot roles and the endpoint swap."""

from __future__ import annotations

import pytest
import torch

from ninfer.memory.kv_pool import KVPool
from ninfer.memory.state_pool import StatePool


def test_kv_pool_alloc_free_partition():
    pool = KVPool(8, 2, 1, 4, torch.float32, torch.device("cpu"))
    a = pool.alloc(3)
    assert pool.num_free == 5 and len(set(a)) == 3
    pool.check_partition(active=a[:2], cached=a[2:])
    with pytest.raises(AssertionError, match="leaked"):
        pool.check_partition(active=a[:2], cached=[])
    with pytest.raises(AssertionError, match="both"):
        pool.check_partition(active=a, cached=a[:1])
    pool.free(a)
    with pytest.raises(RuntimeError, match="twice"):
        pool.free(a[:1])
    with pytest.raises(RuntimeError):
        pool.alloc(9)


def test_kv_copy_prefix_copies_every_layer():
    pool = KVPool(4, 3, 1, 2, torch.float32, torch.device("cpu"))
    for layer in pool.kv:
        layer[1].normal_()
    pool.copy_prefix(1, 2, 10)
    for layer in pool.kv:
        assert torch.equal(layer[2, :, :10], layer[1, :, :10])
        assert not layer[2, :, 10:].any()


def _pool() -> StatePool:
    return StatePool(2, 3, 2, 6, 4, 2, 3, 3, torch.float32, torch.device("cpu"))


def test_tap_resume_and_endpoint_swap_keep_a_partition():
    pool = _pool()
    lane = pool.acquire()
    pool.conv[lane].fill_(1.0)
    pool.ssm[lane].fill_(2.0)
    pool.tap(lane, 0)
    other = pool.acquire()
    pool.resume(0, other)
    assert torch.equal(pool.ssm[other], pool.ssm[lane])
    pool.check_invariants([lane, other])
    phys_before = pool.snap_phys[1]
    freed = pool.adopt_endpoint(lane, 1)  # the lane's image becomes snapshot slot 1's
    assert pool.snap_phys[1] == lane and freed == phys_before
    pool.release(freed)
    pool.check_invariants([other])
    assert float(pool.ssm[pool.snap_phys[1]].mean()) == 2.0
    with pytest.raises(RuntimeError):
        pool.release(pool.snap_phys[2])


def test_alloc_prefers_the_lowest_consecutive_run():
    import torch

    from ninfer.memory.kv_pool import KVPool

    pool = KVPool(16, 1, 1, 8, torch.float32, torch.device("cpu"))
    assert pool.alloc(4) == [0, 1, 2, 3]
    assert pool.alloc(4) == [4, 5, 6, 7]
    pool.free([6, 1, 2])
    assert pool.alloc(2) == [1, 2]  # the lowest free run of 2
    assert pool.alloc(3) == [8, 9, 10]  # no run of 3 below 8
    pool.free([3, 5])
    assert pool.alloc(1) == [3]  # single pages: lowest first
    assert pool.alloc(3) == [11, 12, 13]
    assert pool.alloc(4) == [5, 6, 14, 15]  # no run of 4: the lowest free pages, ascending
    assert pool.num_free == 0
    pool.check_partition(active=range(16), cached=())


def test_scratch_entries_lie_outside_the_pools():
    """The prefill graphs' scratch page and slot: physical entries after the pools', never
    handed out, outside every ownership list (the invariants stay those of the pools)."""
    kv = KVPool(4, 2, 1, 8, torch.float32, torch.device("cpu"), scratch=1)
    assert kv.scratch_pages == [4] and kv.kv[0].shape[0] == 5
    assert sorted(kv.alloc(4)) == [0, 1, 2, 3] and kv.num_free == 0
    states = StatePool(2, 3, 2, 6, 4, 2, 3, 3, torch.float32, torch.device("cpu"), scratch=1)
    assert states.scratch_slots == [5] and states.ssm.shape[0] == states.conv.shape[0] == 6
    lanes = [states.acquire(), states.acquire()]
    assert 5 not in lanes + states.snap_phys
    states.check_invariants(lanes)
    with pytest.raises(RuntimeError):
        states.acquire()
