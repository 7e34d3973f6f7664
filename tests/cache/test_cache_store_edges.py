"""Edges of the cache's stores: the empty tree's root record, the slot table's and the Host
tier's configuration errors, the Host tier valuing with a replaced cost model, the ancestor
links a new snapshot takes over (only snapshots whose tokens extend it, never one on a
sibling branch), and the GDSF values that change when a node's exclusive owner changes
(spec §5.1, §5.4, §9.3: Z(s) counts the Host bytes of the path blocks only s retains)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from cache_helpers import IMAGE, SLAB, Driver, exact_cost, make_index, tokens

from ninfer.cache import SnapshotKind
from ninfer.cache.common import ROOT
from ninfer.cache.device_slots import DeviceSlots
from ninfer.cache.tree import BlockTree


def _chain(ix, seed: int, n: int, parent: int = ROOT) -> list[int]:
    """n Host-only blocks below `parent`, tokens from `seed`."""
    out, toks = [], tokens(seed, 64 * n)
    for b in range(n):
        parent = ix.load_block(parent, toks[64 * b : 64 * b + 64])
        out.append(parent)
    return out


# ---- the tree's root -----------------------------------------------------------------------


def test_empty_tree_root_has_no_parent_no_tokens_no_extra_and_depth_minus_one():
    tree = BlockTree()
    root = tree.root
    assert (root.id, root.parent, root.depth, root.extra, root.tokens) == (ROOT, -1, -1, 0, b"")
    assert tree.nodes == {ROOT: root}
    assert list(tree.ancestors(root)) == [root]


def test_blocks_below_the_root_count_depth_from_it():
    ix = make_index()
    path = _chain(ix, 1, 3)
    assert [ix.node(n).depth for n in path] == [0, 1, 2]  # block b covers [64b, 64b + 64)
    assert [ix.node(n).parent for n in path] == [ROOT, *path[:-1]]
    tree = ix.blocks.tree
    assert tree.at_depth(ix.node(path[-1]), -1) is tree.root
    assert tree.at_depth(ix.node(path[-1]), 0) is ix.node(path[0])
    assert tree.at_depth(tree.root, 0) is None


# ---- configuration errors ------------------------------------------------------------------


def test_negative_slot_count_is_refused_naming_the_option():
    with pytest.raises(ValueError, match=r"^device_snapshot_slots must be >= 0, got -1$"):
        DeviceSlots(-1)
    assert DeviceSlots(0).owners == []


@pytest.mark.parametrize("slabs", [1, 2, 3])
def test_host_tier_too_small_for_one_snapshot_and_one_block_names_the_option(slabs):
    want = (
        rf"^host_cache_bytes={slabs * SLAB} holds {slabs} slabs of {SLAB} B, but the Host tier "
        r"needs one snapshot plus one block \(image 2 slabs \+ tail 1 \+ block 1\): set "
        rf"host_cache_bytes >= {4 * SLAB}, or 0 for no Host tier$"
    )
    with pytest.raises(ValueError, match=want):
        make_index(host_slabs=slabs)
    assert make_index(host_slabs=4).host.n_slabs == 4


# ---- the Host tier's values ------------------------------------------------------------------


def test_host_values_use_the_cost_model_set_last():
    ix = make_index()
    path = _chain(ix, 1, 2)
    doubled = replace(exact_cost(), token_s=2.0)
    ix.cost = doubled
    assert ix.cost is doubled
    sid = ix.load_snapshot(path[-1], [])
    ix.check_invariants()
    # C = 2 s x 128 tokens - 1 s restore; Z = image + the two exclusive block slabs
    assert ix.snapshot(sid).h == pytest.approx((2 * 128 - 1) / (IMAGE + 2 * SLAB))
    ix.cost = exact_cost()
    other = ix.load_snapshot(_chain(ix, 2, 1)[-1], [])
    ix.check_invariants()
    assert ix.snapshot(other).h == pytest.approx((64 - 1) / (IMAGE + SLAB))


def test_forgotten_snapshot_leaves_the_dirty_set():
    ix = make_index()
    tier = ix.host_tier
    tier.mark(7)
    tier.mark(8)
    tier.forget(7)
    assert tier.dirty == {8}


def test_a_deeper_snapshot_takes_the_shared_blocks_out_of_the_shallower_ones_value():
    ix = make_index()
    path = _chain(ix, 1, 4)
    upper = ix.load_snapshot(path[1], [])
    ix.check_invariants()
    assert ix.snapshot(upper).h == pytest.approx((128 - 1) / (IMAGE + 2 * SLAB))
    lower = ix.load_snapshot(path[3], [])
    ix.check_invariants()
    # the two blocks above `upper` are now shared: only `lower` owns blocks 3 and 4
    assert ix.snapshot(upper).h == pytest.approx((128 - 1) / IMAGE)
    assert ix.snapshot(lower).h == pytest.approx((256 - 128 - 1) / (IMAGE + 2 * SLAB))
    assert ix.snapshot(lower).ancestor == upper


# ---- ancestor links --------------------------------------------------------------------------


@pytest.mark.parametrize("fork_depth", [0, 1])
def test_new_snapshot_takes_over_only_the_snapshots_extending_it(fork_depth):
    """A snapshot published above existing ones becomes the ancestor of those below it on its
    own path; a deeper snapshot on a sibling branch keeps its ancestor."""
    ix = make_index()
    main = _chain(ix, 1, 4)
    fork_parent = ROOT if fork_depth == 0 else main[fork_depth - 1]
    side = _chain(ix, 2, 4 - fork_depth, fork_parent)
    below = ix.load_snapshot(main[3], [])
    sibling = ix.load_snapshot(side[-1], [])
    assert ix.snapshot(below).ancestor is None and ix.snapshot(sibling).ancestor is None
    mid = ix.load_snapshot(main[1], [])
    assert ix.snapshot(mid).ancestor is None
    assert ix.snapshot(below).ancestor == mid
    assert ix.snapshot(sibling).ancestor is None
    assert ix.snapshot(mid).dependents == {below}
    assert ix.snapshots.root_deps == {mid, sibling}
    ix.check_invariants()


# ---- a superseded snapshot retained again is valued afresh ------------------------------------


def test_snapshot_retained_after_a_dropped_tap_is_valued_against_its_new_ancestor():
    """While superseded, s gains a nearer ancestor; retained again (the lane drops the tap whose
    allocation superseded it) below a deeper retained snapshot, so that it owns no block alone,
    its value counts prefill from that ancestor only."""
    ix = make_index()
    d = Driver(ix)
    p = tokens(1, 400)
    s = d.run(0, p[:256], endpoint=256)[-1].snapshot
    d.admit(1, p[:256] + tokens(3, 100))
    grant = ix.allocate_snapshot_slot(1, 320, SnapshotKind.TAP)
    assert ix.snapshot(s).superseded
    (deeper,) = d.commit(1, 320)
    below = ix.load_snapshot(deeper.node, [])
    d.admit(2, p[:128] + tokens(4, 100))
    above = d.snapshot(2, 128).snapshot
    assert (ix.snapshot(s).ancestor, ix.snapshot(below).ancestor) == (above, s)
    ix.free_snapshot_slot(1, grant.slot)
    assert not ix.snapshot(s).superseded
    ix.check_invariants()  # flushes: every cached H is recomputed and checked
    snap = ix.snapshot(s)
    assert snap.hits == 1  # lane 1 resumed from it
    # C = 256 - 128 prefilled tokens - 1 s restore; Z = the image (every block is shared)
    assert snap.h == pytest.approx(snap.l_at + 2 * (256 - 128 - 1) / IMAGE)
