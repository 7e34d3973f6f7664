"""Prefetch planning and copies (spec §6.6), block-tree lookups under hash collisions (§5.1) and
Vision span edges (§6.1.3): exact nodes, pages, slabs and bytes."""

from __future__ import annotations

import pytest
from cache_helpers import SLAB, Driver, make_index, tokens

from ninfer.cache import ROOT, QuoteParams, Residency, Span, prepare_prompt
from ninfer.cache.device_slots import DeviceSlots
from ninfer.cache.keys import pack_tokens
from ninfer.cache.records import BlockCopy, RestoreBatch
from ninfer.cache.tree import BlockTree

RES, ABS, FILL = Residency.RESIDENT, Residency.ABSENT, Residency.FILLING


def test_span_edges_are_not_inside():
    s = Span(100, 50)
    assert [s.strictly_inside(p) for p in (100, 101, 149, 150)] == [False, True, True, False]


def _block(seed: int) -> bytes:
    return pack_tokens(tokens(seed, 64))


def test_colliding_lookup_hashes_find_every_block_through_removals():
    tree = BlockTree()
    a, b, c = (tree.insert(ROOT, 77, _block(i), 0) for i in (1, 2, 3))
    assert [tree.find_child(ROOT, 77, _block(i), 0) for i in (1, 2, 3)] == [a, b, c]
    tree.remove(a)  # the first one held the hash slot: the next collision takes it
    assert tree.find_child(ROOT, 77, _block(1), 0) is None
    assert [tree.find_child(ROOT, 77, _block(i), 0) for i in (2, 3)] == [b, c]
    tree.remove(c)
    assert tree.find_child(ROOT, 77, _block(2), 0) is b
    tree.remove(b)
    assert tree.find_child(ROOT, 77, _block(2), 0) is None
    d = tree.insert(ROOT, 77, _block(4), 0)  # the hash is free again
    assert tree.find_child(ROOT, 77, _block(4), 0) is d
    e = tree.insert(ROOT, 77, _block(5), 0)
    tree.remove(e)  # a collision that never held the slot
    assert tree.find_child(ROOT, 77, _block(4), 0) is d
    assert tree.find_child(ROOT, 77, _block(5), 0) is None


def test_a_node_with_children_is_not_removed():
    tree = BlockTree()
    a = tree.insert(ROOT, 1, _block(1), 0)
    tree.insert(a.id, 2, _block(2), 0)
    with pytest.raises(AssertionError):
        tree.remove(a)


# ---- begin_prefetch ------------------------------------------------------------------------------


def _host_only_chain(ix, seed: int, n_blocks: int) -> list[int]:
    toks = tokens(seed, 64 * n_blocks)
    out, parent = [], ROOT
    for b in range(n_blocks):
        parent = ix.load_block(parent, toks[64 * b : 64 * b + 64])
        out.append(parent)
    return out


def test_begin_prefetch_copies_host_only_blocks_into_the_given_pages():
    ix = make_index(host_slabs=16)
    n = _host_only_chain(ix, 1, 3)
    slabs = [ix.node(i).host_slab for i in n]
    batch = ix.begin_prefetch(n[:2], [500, 501])
    assert batch == RestoreBatch(
        batch.batch_id,
        [BlockCopy(n[0], 500, slabs[0]), BlockCopy(n[1], 501, slabs[1])],
        None,
        None,
        2 * SLAB,
    )
    assert [ix.node(i).device_state for i in n] == [FILL, FILL, ABS]
    assert [ix.node(i).restore_pins for i in n] == [1, 1, 0]
    assert (ix.counters.prefetched_blocks, ix.counters.restored_host_bytes) == (2, 2 * SLAB)
    ix.begin_prefetch(n[2:], [502])
    assert (ix.counters.prefetched_blocks, ix.counters.restored_host_bytes) == (3, 3 * SLAB)
    ix.on_restore_landed(batch.batch_id)
    assert [ix.node(i).device_state for i in n[:2]] == [RES, RES]
    assert [ix.node(i).restore_pins for i in n[:2]] == [0, 0]
    assert ix.begin_prefetch([], []) is None


def test_begin_prefetch_refusals():
    ix = make_index(host_slabs=16)
    n = _host_only_chain(ix, 1, 2)
    with pytest.raises(ValueError, match=r"^2 nodes but 1 pages$"):
        ix.begin_prefetch(n, [500])
    ix.begin_prefetch(n[:1], [500])
    with pytest.raises(ValueError, match=rf"^node {n[0]} is not Host-only$"):
        ix.begin_prefetch(n[:1], [501])


# ---- plan_prefetch -------------------------------------------------------------------------------


def _head_case():
    """Head prompt Y: block y0 Device- and Host-resident (backed), y1 Host-only, a Host-only
    snapshot at 128; an unrelated backed block x0, more recently used than y0."""
    ix = make_index(host_slabs=32, slots=4)
    d = Driver(ix)
    y = tokens(1, 300)
    d.run(1, y[:64])  # y0 on Device and Host (backed; dead KV on the Host side until s)
    y0 = 1  # the first node of the index
    y1 = ix.load_block(y0, y[64:128])
    ix.load_snapshot(y1, [])
    d.run(2, tokens(2, 64))  # x0: backed, more recently used than y0
    x0 = 3  # after y0 and the loaded y1
    q = ix.quote(prepare_prompt(y), QuoteParams(10, 0, 10**6))
    return ix, y0, y1, x0, q


def test_plan_prefetch_evicts_only_outside_the_heads_path():
    ix, y0, y1, x0, q = _head_case()
    assert q.match.path == [y0, y1]
    assert ix.node(y0).device_state == RES and ix.node(x0).device_state == RES
    x0_page = ix.node(x0).device_page
    plan = ix.plan_prefetch(q, free_pages=0)
    # y0 is the least recently used backed entry but lies on the head's path: x0 goes
    assert plan.nodes == [y1] and plan.evicted_pages == [x0_page]
    assert ix.node(y0).device_state == RES and ix.node(x0).device_state == ABS


def test_plan_prefetch_with_enough_free_pages_evicts_nothing():
    ix, y0, y1, x0, q = _head_case()
    plan = ix.plan_prefetch(q, free_pages=1)
    assert plan.nodes == [y1] and plan.evicted_pages == []
    assert ix.node(x0).device_state == RES


def test_plan_prefetch_without_room_plans_nothing():
    ix = make_index(host_slabs=32)
    n = _host_only_chain(ix, 1, 2)
    ix.load_snapshot(n[1], [])
    q = ix.quote(prepare_prompt(tokens(1, 300)), QuoteParams(10, 0, 10**6))
    assert ix.plan_prefetch(q, free_pages=0) == ([], [])
    q = ix.quote(prepare_prompt(tokens(1, 300)), QuoteParams(10, 0, 10**6))
    assert ix.plan_prefetch(q, free_pages=5) == ([], n)
    q = ix.quote(prepare_prompt(tokens(1, 300)), QuoteParams(10, 0, 10**6))
    assert ix.plan_prefetch(q, free_pages=5, max_blocks=1) == ([], n[:1])


def test_removing_a_middle_collision_keeps_the_later_ones():
    tree = BlockTree()
    a, b, c = (tree.insert(ROOT, 77, _block(i), 0) for i in (1, 2, 3))
    tree.check_hash_map()
    tree.remove(b)  # neither the primary entry nor the last collision
    tree.check_hash_map()
    assert [tree.find_child(ROOT, 77, _block(i), 0) for i in (1, 2, 3)] == [a, None, c]
    tree.remove(c)
    tree.check_hash_map()
    assert tree.find_child(ROOT, 77, _block(1), 0) is a


def test_check_hash_map_names_each_corruption():
    tree = BlockTree()
    a = tree.insert(ROOT, 77, _block(1), 0)
    a.lookup_hash = 78  # indexed under 77, claims 78
    with pytest.raises(AssertionError, match=r"^stale hash entry$"):
        tree.check_hash_map()
    tree = BlockTree()
    tree.insert(ROOT, 77, _block(1), 0)
    b = tree.insert(ROOT, 77, _block(2), 0)
    b.lookup_hash = 78  # a collision entry that claims another hash
    with pytest.raises(AssertionError):
        tree.check_hash_map()
    tree = BlockTree()
    tree.insert(ROOT, 77, _block(1), 0)
    tree.insert(ROOT, 77, _block(2), 0)
    del tree._by_hash[77]  # collisions left without their primary entry
    with pytest.raises(AssertionError, match=r"^overflow without a primary entry$"):
        tree.check_hash_map()
    tree = BlockTree()
    tree.insert(ROOT, 77, _block(1), 0)
    tree._overflow[77] = []  # an empty collision list
    with pytest.raises(AssertionError, match=r"^overflow without a primary entry$"):
        tree.check_hash_map()
    tree = BlockTree()
    tree.insert(ROOT, 77, _block(1), 0)
    tree.insert(ROOT, 55, _block(2), 0)
    del tree._by_hash[55]  # a node the map does not index
    with pytest.raises(AssertionError, match=r"^hash map does not index every node exactly once$"):
        tree.check_hash_map()


def test_device_slots_check_names_a_doubled_free_slot():
    slots = DeviceSlots(3)
    slots.check_invariants()
    slots._free.append(0)
    with pytest.raises(AssertionError, match=r"^slot on the free stack twice$"):
        slots.check_invariants()
