"""Quote and eviction agree (spec §6.3, §9.1, §9.5), and the Device LRU evicts deeper blocks
before shallower ones after a resumed turn (§7.7 step 2): exact ids, orders and page ids."""

from __future__ import annotations

from cache_helpers import Driver, make_index, tokens

from ninfer.cache import QuoteParams, Readiness, SnapshotKind, prepare_prompt
from ninfer.cache.device_lru import DeviceEntry, EntryKind


def N(i: int) -> DeviceEntry:
    return DeviceEntry(EntryKind.NODE, i)


def T(i: int) -> DeviceEntry:
    return DeviceEntry(EntryKind.TAIL, i)


def brute_evictable(ix) -> int:
    """What eviction would free, from its own rule: every LRU entry but an unbacked node whose
    subtree holds a pin."""
    out = 0
    for e in ix.blocks.lru.order():
        if e.kind == EntryKind.NODE and not ix.blocks.lru.is_backed(e):
            out += not ix.liveness.subtree_pinned(ix.node(e.id))
        else:
            out += 1
    return out


def test_resumed_turn_evicts_its_new_blocks_before_the_shared_prefix():
    ix = make_index(host_slabs=64)
    d = Driver(ix)
    a = tokens(1, 300)
    d.run(1, a, endpoint=300)  # nodes 1-4 written through and landed; endpoint 1 (tail 44)
    assert list(ix.blocks.lru.backed) == [T(1), N(4), N(3), N(2), N(1)]
    b = a + tokens(2, 260)  # 560 tokens: resumes from endpoint 1 at 300
    q, st = d.admit(2, b)
    assert (q.source, st.frontier, st.path) == (1, 300, [1, 2, 3, 4])
    d.commit(2, 512)  # nodes 5-8
    res = ix.release(2)  # 1-4 are Host-backed: evictable at once; 5-8 wait for their copy
    assert [c.node for c in res.write.blocks] == [5, 6, 7, 8]
    assert list(ix.blocks.lru.backed) == [T(1), N(4), N(3), N(2), N(1)]
    ix.on_write_through_landed(res.write.batch_id)
    # deeper blocks first along the path: the conversation's newer blocks, then the prefix
    assert list(ix.blocks.lru.backed) == [T(1), N(8), N(7), N(6), N(5), N(4), N(3), N(2), N(1)]
    assert ix.evict_device_pages(6) == [1004, 1008, 1007, 1006, 1005, 1003]
    assert [ix.node(i).device_state for i in range(1, 9)] == [1, 1, 1, 0, 0, 0, 0, 0]
    ix.check_invariants()


def test_prefetched_path_lands_deepest_first():
    ix = make_index(host_slabs=64)
    d = Driver(ix)
    a = tokens(1, 300)
    d.run(1, a, taps=[256])
    ix.evict_device_pages(100)  # every node Host-only
    q = ix.quote(prepare_prompt(a), QuoteParams(6, 0, 100))
    plan = ix.plan_prefetch(q, free_pages=4)
    rb = ix.begin_prefetch(plan.nodes, [31, 32, 33, 34])
    ix.on_restore_landed(rb.batch_id)
    assert list(ix.blocks.lru.order()) == [N(4), N(3), N(2), N(1)]
    assert ix.evict_device_pages(1) == [34]
    ix.check_invariants()


def _pinned_below_unbacked():
    """Host of 4 slabs: an endpoint's image + tail write (3 slabs, in flight) pins snapshot 1
    anchored at node 3; lane 1's release writes node 1 (the last slab), so nodes 2 and 3 are
    unbacked LRU entries whose subtree holds the pinned snapshot."""
    ix = make_index(host_slabs=4)
    d = Driver(ix, land=False)
    d.admit(1, tokens(1, 220))
    d.commit(1, 192)
    d.snapshot(1, 200, SnapshotKind.ENDPOINT)
    d.release(1)
    return ix, d


def test_quote_does_not_count_unbacked_nodes_whose_subtree_is_pinned():
    ix, d = _pinned_below_unbacked()
    assert list(ix.blocks.lru.unbacked) == [N(3), N(2)] and not ix.blocks.lru.backed
    assert ix.snapshot(1).restore_pins == 1 and ix.node(1).restore_pins == 1
    # 2 pages needed, none free: eviction would free nothing, so the quote must not be READY
    q = ix.quote(prepare_prompt(tokens(2, 100)), QuoteParams(2, 0, 100))
    assert q.readiness == Readiness.TEMPORARILY_BLOCKED
    assert ix.evict_device_pages(2) == []
    assert ix.evictable_pages() == 0 == brute_evictable(ix)
    for bid in list(d.pending):  # the writes land: node 1 backed; the snapshot unpinned
        ix.on_write_through_landed(bid)
    d.pending.clear()
    assert list(ix.blocks.lru.backed) == [T(1), N(1)] and list(ix.blocks.lru.unbacked) == [
        N(3),
        N(2),
    ]
    assert ix.evictable_pages() == 4 == brute_evictable(ix)
    q = ix.quote(prepare_prompt(tokens(2, 100)), QuoteParams(2, 0, 100))
    assert q.readiness == Readiness.READY
    st = ix.stage(q, 2, 0)
    assert st.evicted_pages == [1003, 1000]  # backed first: the tail, node 1 (Host kept)
    assert ix.evict_device_pages(2) == [1002, 1001]  # node 3 takes snapshot 1 with it
    assert not ix.snapshots.by_id and ix.evictable_pages() == 0
    ix.check_invariants()


def test_quote_counts_negative_free_pages():
    """The engine passes free - reserved unclamped: 3 free pages with 5 reserved and 4
    evictable leave 2 for a new admission, not 4."""
    ix = make_index(host_slabs=0)
    d = Driver(ix)
    d.run(1, tokens(1, 300))  # nodes 1-4 unbacked, evictable
    prompt = prepare_prompt(tokens(2, 100))
    assert ix.quote(prompt, QuoteParams(2, 3 - 5, 100)).readiness == Readiness.READY
    q = ix.quote(prompt, QuoteParams(3, 3 - 5, 100))
    assert q.readiness == Readiness.TEMPORARILY_BLOCKED
