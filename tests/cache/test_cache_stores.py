"""The PrefixIndex's three stores each check their own invariants (blocks, snapshots, Host
tier), and the index's check runs all of them with the rules across stores."""

from __future__ import annotations

import pytest
from cache_helpers import Driver, make_index, tokens

from ninfer.cache import SnapshotKind

P = tokens(1, 300)


def _index():
    """Lane 1 published taps at 128 (superseded by 256) and 256 and an endpoint at 290, then
    released: nodes 1-4 Host-backed, snapshots 1-3 with Host copies."""
    ix = make_index()
    d = Driver(ix)
    d.admit(1, P)
    d.snapshot(1, 128)
    d.snapshot(1, 256)
    d.commit(1, 290)
    d.snapshot(1, 290, SnapshotKind.ENDPOINT)
    d.release(1)
    assert sorted(ix.snapshots.by_id) == [1, 2, 3] and list(ix.snapshots.superseded) == [1]
    assert sorted(ix.blocks.tree.nodes) == [0, 1, 2, 3, 4]
    ix.check_invariants()
    return ix


def test_each_store_checks_its_own_invariants():
    ix = _index()
    ix.blocks.check_invariants(ix.snapshots.by_id, has_host=True)
    ix.snapshots.check_invariants()
    ix.host_tier.check_invariants()


def test_block_store_names_a_wrong_dead_kv_set():
    ix = _index()
    ix.blocks.dead[4] = None  # node 4 has snapshots below it: not dead
    with pytest.raises(AssertionError, match="^§9.3 dead-KV set is wrong$"):
        ix.blocks.check_invariants(ix.snapshots.by_id, has_host=True)
    with pytest.raises(AssertionError, match="^§9.3 dead-KV set is wrong$"):
        ix.check_invariants()


def test_block_store_names_a_host_copy_without_a_host_tier():
    ix = _index()
    with pytest.raises(AssertionError, match="^node 1 Host copy without a Host tier$"):
        ix.blocks.check_invariants(ix.snapshots.by_id, has_host=False)


def test_snapshot_store_names_a_broken_ancestor_link():
    ix = _index()
    ix.snapshot(2).dependents.discard(3)  # 3 hangs under 1 instead of its nearest, 2
    ix.snapshot(1).dependents.add(3)
    ix.snapshot(3).ancestor = 1
    with pytest.raises(AssertionError, match="^snapshot 3 ancestor link$"):
        ix.snapshots.check_invariants()
    with pytest.raises(AssertionError, match="^snapshot 3 ancestor link$"):
        ix.check_invariants()


def test_host_tier_names_a_stale_priority():
    ix = _index()
    ix.host_tier.flush()
    ix.snapshot(2).h += 1.0
    with pytest.raises(AssertionError, match="^§9.3 stale H of snapshot 2$"):
        ix.host_tier.check_invariants()
