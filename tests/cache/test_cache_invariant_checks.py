"""PrefixIndex.check_invariants names the invariant a corrupted index breaks.

Each case builds one index holding every kind of state the checker distinguishes (Host-only,
Device-only, Filling and pinned nodes and tails, superseded and retained snapshots, staged,
activated and restoring lanes, a staging slot, in-flight transfer batches, dead KV), checks that
the healthy index passes, corrupts one field the way a wrong bookkeeping step would, and expects
exactly the AssertionError (message and ids) of the first check that sees it. A checker that
misses a corruption, blames the wrong invariant or object, or raises on a healthy index fails.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from cache_helpers import Driver, make_index, tokens

from ninfer.cache import (
    CacheCostModel,
    PrefixIndex,
    QuoteParams,
    Residency,
    SnapshotKind,
    prepare_prompt,
)
from ninfer.cache.device_lru import DeviceEntry, EntryKind

ABSENT, RESIDENT, FILLING = Residency.ABSENT, Residency.RESIDENT, Residency.FILLING
A = tokens(1, 300)
B = A[:128] + tokens(2, 200)


def node_entry(nid: int) -> DeviceEntry:
    return DeviceEntry(EntryKind.NODE, nid)


def tail_entry(sid: int) -> DeviceEntry:
    return DeviceEntry(EntryKind.TAIL, sid)


def rich_index() -> PrefixIndex:
    """The state every Host-tier case corrupts (ids asserted below):

    nodes 1-2-3-4-14   A's path (14 Device-only, committed by open lane 6)
          2-5-6-7      B's branch; 6, 7 dead KV (Host-resident, nothing below)
          8-9-10       a prompt without snapshots, evicted to Host only (10 dead, 8 and 9 not)
          11-12-13     written through, the write still in flight (Host Filling, pinned)
    snapshots 1 (136, restore of its tail in flight for lane 8), 2 (200, tail Host-only),
    3 (300, endpoint, superseded, image Host-only, tail in the Device LRU), 4 (B at 200, the
    source of staged lane 7), 5 (130, its Host write in flight); lane 6 holds staging slot 2.
    """
    ix = make_index(host_slabs=64, slots=4)
    d = Driver(ix)
    d.run(1, A, taps=[136, 200], endpoint=300)
    d.run(2, B, taps=[200])
    d.run(3, tokens(3, 200))
    ix.evict_device_pages(5)
    pending = Driver(ix, land=False)
    pending.next_page = 2000
    pending.admit(5, tokens(4, 200))
    pending.commit(5, 128)
    pending.snapshot(5, 130)
    pending.release(5)
    d.admit(6, A + tokens(5, 40))
    d.commit(6, 320)
    assert ix.allocate_snapshot_slot(6, 330, SnapshotKind.TAP).slot == 2
    q = ix.quote(prepare_prompt(B + tokens(6, 10)), QuoteParams(10, 10**6, 10**6))
    ix.stage(q, 7, 10**6)
    ix.evict_device_pages(3)
    pending.admit(8, A[:136] + tokens(8, 30))
    return ix


def device_only_index() -> PrefixIndex:
    """No Host tier: nodes 1-2-3 (snapshot 1 at 136 on node 2) and 4-5, all unbacked."""
    ix = make_index(host_slabs=0, slots=2)
    d = Driver(ix)
    d.run(1, A[:200], taps=[136])
    d.run(2, tokens(2, 128))
    return ix


def test_rich_index_holds_the_states_the_cases_rely_on():
    ix = rich_index()
    ix.check_invariants()
    n, s = ix.node, ix.snapshot
    assert [n(i).parent for i in (1, 2, 3, 4, 14, 5, 6, 7, 8, 9, 10)] == [
        0,
        1,
        2,
        3,
        4,
        2,
        5,
        6,
        0,
        8,
        9,
    ]
    assert (n(14).device_state, n(14).host_state, n(14).active_refs) == (RESIDENT, ABSENT, 1)
    assert [n(i).device_state for i in (8, 9, 10)] == [ABSENT] * 3
    assert [n(i).host_state for i in (11, 12, 13)] == [FILLING] * 3
    assert list(ix.blocks.dead) == [7, 6, 10]
    assert list(ix.snapshots.superseded) == [3]
    assert ix.snapshots.root_deps == {1, 4, 5}
    assert [(x.ancestor, x.dependents) for x in map(s, (1, 2, 3))] == [
        (None, {2}),
        (1, {3}),
        (2, set()),
    ]
    assert (s(1).tail_device, s(1).restore_pins) == (FILLING, 1)
    assert (s(2).tail_device, s(2).device_slot, s(2).host_state) == (ABSENT, 1, RESIDENT)
    assert (s(3).device_state, s(3).tail_device, s(3).host_state) == (ABSENT, RESIDENT, RESIDENT)
    assert (s(4).restore_pins, s(4).device_slot, s(4).host_slabs, s(4).tail_slab) == (
        1,
        3,
        [13, 14],
        15,
    )
    assert (s(5).host_state, s(5).restore_pins) == (FILLING, 1)
    assert list(ix.blocks.lru.backed) == [tail_entry(3), node_entry(7), node_entry(6)]
    assert not ix.blocks.lru.unbacked
    assert {k: (v.activated, v.source_pinned) for k, v in ix.lanes.items()} == {
        6: (True, False),
        7: (False, True),
        8: (True, False),
    }


def _free_slabs(ix: PrefixIndex, *slabs: int) -> None:
    ix.host.free(list(slabs))


def _drop_host_copy(ix: PrefixIndex, sid: int) -> None:
    s = ix.snapshot(sid)
    _free_slabs(ix, *s.host_slabs, *([s.tail_slab] if s.tail_slab >= 0 else []))
    s.host_slabs, s.tail_slab, s.host_state = [], -1, ABSENT


def _set(obj_of: Callable[[PrefixIndex], object], **fields) -> Callable[[PrefixIndex], None]:
    def corrupt(ix: PrefixIndex) -> None:
        obj = obj_of(ix)
        for k, v in fields.items():
            setattr(obj, k, v(getattr(obj, k)) if callable(v) else v)

    return corrupt


def node(nid: int) -> Callable[[PrefixIndex], object]:
    return lambda ix: ix.node(nid)


def snap(sid: int) -> Callable[[PrefixIndex], object]:
    return lambda ix: ix.snapshot(sid)


def _seq(*steps: Callable[[PrefixIndex], object]) -> Callable[[PrefixIndex], None]:
    def corrupt(ix: PrefixIndex) -> None:
        for step in steps:
            step(ix)

    return corrupt


def _stale_h(ix: PrefixIndex) -> None:
    ix.host_tier.flush()
    ix.snapshot(2).h += 1e-3


# (case id, corruption, the exact AssertionError message; "" = an assert without one)
CASES: list[tuple[str, Callable[[PrefixIndex], None], str]] = [
    # tree (§5.2, §10.2, §9.4, §10.6)
    (
        "unlinked child",
        lambda ix: ix.node(6).children.remove(7),
        "§5.2 node 7 not linked to parent",
    ),
    (
        "missing parent",
        _seq(lambda ix: ix.node(6).children.remove(7), _set(node(7), parent=999)),
        "§5.2 node 7 not linked to parent",
    ),
    ("depth", _set(node(7), depth=5), "node 7 depth"),
    ("partial block", _set(node(7), tokens=lambda t: t[:-4]), "node 7 holds a partial block"),
    (
        "duplicate key",
        lambda ix: setattr(ix.node(5), "tokens", ix.node(3).tokens),
        "§10.2 duplicate node for key of 5",
    ),
    (
        "no copy",
        _set(node(14), device_state=ABSENT, device_page=-1),
        "§9.4 node 14 has no copy but exists",
    ),
    ("page without state", _set(node(8), device_page=5), "node 8 device page"),
    ("state without page", _set(node(14), device_page=-1), "node 14 device page"),
    ("slab without state", _set(node(14), host_slab=40), "node 14 host slab"),
    ("state without slab", _set(node(8), host_slab=-1), "node 8 host slab"),
    (
        "unpinned Device Filling",
        _set(node(7), device_state=FILLING),
        "§10.6 Filling node 7 is not pinned",
    ),
    (
        "unpinned Host Filling",
        _set(node(6), host_state=FILLING),
        "§10.6 Filling node 6 is not pinned",
    ),
    ("foreign child", lambda ix: ix.node(10).children.append(7), ""),
    # ownership (§10.1)
    (
        "page of two nodes",
        lambda ix: setattr(ix.node(7), "device_page", ix.node(6).device_page),
        "§10.1 a Device page has two cache owners",
    ),
    (
        "page of a node and a tail",
        lambda ix: setattr(ix.snapshot(3), "tail_page", ix.node(7).device_page),
        "§10.1 a Device page has two cache owners",
    ),
    (
        "page 0 of two nodes",
        _seq(_set(node(7), device_page=0), _set(node(6), device_page=0)),
        "§10.1 a Device page has two cache owners",
    ),
    (
        "page 0 of a node and a tail",
        _seq(_set(node(7), device_page=0), _set(snap(3), tail_page=0)),
        "§10.1 a Device page has two cache owners",
    ),
    (
        "slab 0 of an image and a tail",
        _seq(lambda ix: _free_slabs(ix, 5), _set(snap(2), tail_slab=0)),
        "§10.1 a Host slab has two owners",
    ),
    (
        "slab of two nodes",
        _seq(lambda ix: _free_slabs(ix, 18), _set(node(7), host_slab=17)),
        "§10.1 a Host slab has two owners",
    ),
    (
        "slab of a node and an image",
        _seq(lambda ix: _free_slabs(ix, 4), _set(snap(2), host_slabs=[3, 17])),
        "§10.1 a Host slab has two owners",
    ),
    (
        "slab of a node and a tail",
        _seq(lambda ix: _free_slabs(ix, 5), _set(snap(2), tail_slab=17)),
        "§10.1 a Host slab has two owners",
    ),
    (
        "owned slab not allocated",
        _set(node(7), host_slab=40),
        "§10.1 allocated slabs differ from owned slabs",
    ),
    (
        "allocated slab not owned",
        lambda ix: ix.host.allocate(1),
        "§10.1 allocated slabs differ from owned slabs",
    ),
    # counters (§10.3, §10.5, §10.6)
    (
        "activated lane on a Host-only node",
        _set(node(3), device_state=ABSENT, device_page=-1),
        "§10.3 lane 6 path node",
    ),
    ("live_below", _set(node(4), live_below=lambda v: v + 1), "live_snapshots_below of node 4"),
    ("retained_below", _set(node(3), retained_below=lambda v: v + 1), "retained_below of node 3"),
    ("retained_xor", _set(node(3), retained_xor=lambda v: v ^ 64), "retained_xor of node 3"),
    ("active_refs", _set(node(14), active_refs=2), "active_refs of node 14"),
    ("node pins", _set(node(7), restore_pins=1), "restore_pins of node 7"),
    ("staged source pin", _set(snap(4), restore_pins=0), "restore_pins of snapshot 4"),
    ("write batch pin", _set(snap(5), restore_pins=2), "restore_pins of snapshot 5"),
    ("restore batch pin", _set(snap(1), restore_pins=2), "restore_pins of snapshot 1"),
    # Device LRU, dead KV, staging slots (§9.1, §9.3)
    (
        "entry in both lists",
        lambda ix: ix.blocks.lru.unbacked.__setitem__(node_entry(7), None),
        "LRU entry in both lists",
    ),
    (
        "node missing from the LRU",
        lambda ix: ix.blocks.lru.discard(node_entry(7)),
        "§9.1 Device LRU membership or backed/unbacked list is wrong",
    ),
    (
        "tail missing from the LRU",
        lambda ix: ix.blocks.lru.discard(tail_entry(3)),
        "§9.1 Device LRU membership or backed/unbacked list is wrong",
    ),
    (
        "backed node listed unbacked",
        lambda ix: ix.blocks.lru.put(node_entry(7), False),
        "§9.1 Device LRU membership or backed/unbacked list is wrong",
    ),
    (
        "backed tail listed unbacked",
        lambda ix: ix.blocks.lru.put(tail_entry(3), False),
        "§9.1 Device LRU membership or backed/unbacked list is wrong",
    ),
    (
        "referenced node in the LRU",
        lambda ix: ix.blocks.lru.put(node_entry(14), False),
        "§9.1 Device LRU membership or backed/unbacked list is wrong",
    ),
    (
        "pinned node in the LRU",
        lambda ix: ix.blocks.lru.put(node_entry(11), False),
        "§9.1 Device LRU membership or backed/unbacked list is wrong",
    ),
    (
        "pinned tail in the LRU",
        lambda ix: ix.blocks.lru.put(tail_entry(4), True),
        "§9.1 Device LRU membership or backed/unbacked list is wrong",
    ),
    (
        "Host-only tail in the LRU",
        lambda ix: ix.blocks.lru.put(tail_entry(2), True),
        "§9.1 Device LRU membership or backed/unbacked list is wrong",
    ),
    (
        "Host-only node in the LRU",
        lambda ix: ix.blocks.lru.put(node_entry(9), True),
        "§9.1 Device LRU membership or backed/unbacked list is wrong",
    ),
    (
        "root in the LRU",
        lambda ix: ix.blocks.lru.put(node_entry(0), False),
        "§9.1 Device LRU membership or backed/unbacked list is wrong",
    ),
    ("dead node missing", lambda ix: ix.blocks.dead.pop(7), "§9.3 dead-KV set is wrong"),
    (
        "Host-only inner node dead",
        lambda ix: ix.blocks.dead.__setitem__(9, None),
        "§9.3 dead-KV set is wrong",
    ),
    (
        "node with a snapshot below dead",
        lambda ix: ix.blocks.dead.__setitem__(4, None),
        "§9.3 dead-KV set is wrong",
    ),
    (
        "pinned node dead",
        lambda ix: ix.blocks.dead.__setitem__(13, None),
        "§9.3 dead-KV set is wrong",
    ),
    (
        "Device-only node dead",
        lambda ix: ix.blocks.dead.__setitem__(14, None),
        "§9.3 dead-KV set is wrong",
    ),
    ("root dead", lambda ix: ix.blocks.dead.__setitem__(0, None), "§9.3 dead-KV set is wrong"),
    (
        "staging slot without its lane",
        lambda ix: ix.lanes[6].staging.clear(),
        "staging slot 2 has no lane",
    ),
    (
        "staging slot of another lane",
        lambda ix: ix.lanes[6].staging.clear() or ix.lanes[8].staging.add(2),
        "staging slot 2 has no lane",
    ),
    ("snapshot slot owner", _set(snap(2), device_slot=3), "slot 1 owner mismatch"),
    ("lane staging a free slot", lambda ix: ix.lanes[8].staging.add(5), ""),
    # snapshots (§5.3, §10.4, §10.6)
    ("superseded list", lambda ix: ix.snapshots.superseded.__setitem__(2, None), ""),
    ("anchor does not list it", lambda ix: ix.node(3).snapshots.remove(2), "snapshot 2 anchor"),
    ("anchor depth", _set(snap(2), anchor_depth=1), ""),
    ("frontier", _set(snap(2), frontier=201), ""),
    (
        "tail too long",
        _set(snap(3), tail=lambda t: t + bytes(4 * 20), frontier=lambda f: f + 20),
        "snapshot 3 tail too long",
    ),
    (
        "key map",
        lambda ix: ix.snapshots.by_key.__setitem__((3, ix.snapshot(2).tail), 4),
        "§5.3 one snapshot per key",
    ),
    ("tail without a copy", lambda ix: _drop_host_copy(ix, 2), "§10.4 snapshot 2 invalid"),
    (
        "image without a copy",
        _seq(lambda ix: _drop_host_copy(ix, 3), lambda ix: ix.blocks.lru.put(tail_entry(3), False)),
        "§10.4 snapshot 3 invalid",
    ),
    ("image state without slot", _set(snap(3), device_state=RESIDENT), ""),
    ("image in another snapshot's slot 0", _set(snap(3), device_slot=0, device_state=RESIDENT), ""),
    ("image in a staging slot", _set(snap(3), device_slot=2, device_state=RESIDENT), ""),
    ("tail state without page", _set(snap(2), tail_device=FILLING, restore_pins=0), ""),
    ("Host state without slabs", _set(snap(4), host_state=ABSENT), ""),
    ("image slabs", _seq(lambda ix: _free_slabs(ix, 14), _set(snap(4), host_slabs=[13])), ""),
    ("tail slab", _seq(lambda ix: _free_slabs(ix, 15), _set(snap(4), tail_slab=-1)), ""),
    (
        "unpinned Host Filling snapshot",
        _set(snap(2), host_state=FILLING),
        "§10.6 Filling snapshot 2 is not pinned",
    ),
    (
        "unpinned tail Filling",
        _set(snap(2), tail_device=FILLING, tail_page=5000),
        "§10.6 Filling snapshot 2 is not pinned",
    ),
    (
        "ancestor",
        _seq(
            _set(snap(3), ancestor=1),
            lambda ix: ix.snapshot(2).dependents.discard(3),
            lambda ix: ix.snapshot(1).dependents.add(3),
        ),
        "snapshot 3 ancestor link",
    ),
    ("dependent's ancestor", _set(snap(3), ancestor=1), ""),
    ("dependent", lambda ix: ix.snapshot(2).dependents.add(4), ""),
    ("extra key", lambda ix: ix.snapshots.by_key.__setitem__((999, b""), 1), ""),
    ("root dependents", lambda ix: ix.snapshots.root_deps.add(2), ""),
    # GDSF (§9.3) and the slot and slab structures
    ("stale H", _stale_h, "§9.3 stale H of snapshot 2"),
    (
        "slot free twice",
        lambda ix: ix.snapshots.slots._free.extend([0, 0]),
        "slot on the free stack twice",
    ),
    ("slab free twice", lambda ix: ix.host._free.extend([63, 63]), "slab on the free heap twice"),
]


@pytest.mark.parametrize(("corrupt", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_check_invariants_names_what_a_corruption_breaks(corrupt, message):
    ix = rich_index()
    ix.check_invariants()
    corrupt(ix)
    with pytest.raises(AssertionError, match=f"^{re.escape(message)}$"):
        ix.check_invariants()


DEVICE_ONLY_CASES: list[tuple[str, Callable[[PrefixIndex], None], str]] = [
    (
        "Host copy",
        _set(node(3), host_state=RESIDENT, host_slab=7),
        "node 3 Host copy without a Host tier",
    ),
    ("snapshot slabs", _set(snap(1), host_slabs=[7, 8]), ""),
    (
        "unbacked node listed backed",
        lambda ix: ix.blocks.lru.put(node_entry(3), True),
        "§9.1 Device LRU membership or backed/unbacked list is wrong",
    ),
    (
        "dead without a Host copy",
        lambda ix: ix.blocks.dead.__setitem__(5, None),
        "§9.3 dead-KV set is wrong",
    ),
    (
        "slot free twice",
        lambda ix: ix.snapshots.slots._free.extend([1, 1]),
        "slot on the free stack twice",
    ),
]


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [c[1:] for c in DEVICE_ONLY_CASES],
    ids=[c[0] for c in DEVICE_ONLY_CASES],
)
def test_check_invariants_without_a_host_tier(corrupt, message):
    ix = device_only_index()
    ix.check_invariants()
    assert list(ix.blocks.lru.unbacked) and not ix.blocks.lru.backed and not ix.blocks.dead
    corrupt(ix)
    with pytest.raises(AssertionError, match=f"^{re.escape(message)}$"):
        ix.check_invariants()


def test_pins_are_counted_per_holder():
    """Two staged lanes pin one source twice; a corrupted count is named."""
    ix = make_index()
    d = Driver(ix)
    d.run(1, A, taps=[136])
    for lane in (2, 3):
        q = ix.quote(prepare_prompt(A[:136] + tokens(lane, 10)), QuoteParams(4, 10**6, 10**6))
        assert q.source == 1
        ix.stage(q, lane, 10**6)
    assert ix.snapshot(1).restore_pins == 2
    ix.check_invariants()
    ix.snapshot(1).restore_pins = 1
    with pytest.raises(AssertionError, match="^restore_pins of snapshot 1$"):
        ix.check_invariants()


def test_a_tail_in_slab_0_is_valid():
    """Slab ids are positions in the pool: an image and its tail may hold them in any order."""
    ix = rich_index()
    s = ix.snapshot(1)
    assert (s.host_slabs, s.tail_slab) == ([0, 1], 2)
    s.host_slabs, s.tail_slab = [2, 1], 0
    ix.check_invariants()


def test_stale_h_tolerance_is_relative_above_one_and_absolute_below():
    """H may differ from a recomputation by 1e-9 x max(1, |H|), no more."""
    ix = rich_index()
    ix.check_invariants()
    s = ix.snapshot(2)
    assert 0.0 < s.h < 1.0
    h = s.h
    s.h = h + 0.5e-9
    ix.check_invariants()
    s.h = h + 1.5e-9
    with pytest.raises(AssertionError, match="^§9.3 stale H of snapshot 2$"):
        ix.check_invariants()
    s.l_at = 1000.0  # H = L_s + ...: a value above one
    ix.host_tier.mark(2)
    ix.check_invariants()
    h = s.h
    assert h > 1000.0
    s.h = h + 1e-7  # within 1e-9 x |H|
    ix.check_invariants()
    s.h = h + 2e-6
    with pytest.raises(AssertionError, match="^§9.3 stale H of snapshot 2$"):
        ix.check_invariants()


def test_stale_h_at_exactly_the_tolerance_passes():
    """A snapshot worth nothing (restoring costs more than prefilling): H = L_s = 0, and a
    cached 1e-9 is exactly at the tolerance."""
    slow = CacheCostModel(
        token_s=1e-9,
        pair_s=0.0,
        chunk_s=0.0,
        chunk_tokens=64,
        h2d_bytes_per_s=1.0,
        batch_latency_s=0.0,
    )
    ix = make_index(cost=slow)
    Driver(ix).run(1, A, taps=[136])
    ix.check_invariants()
    assert ix.snapshot(1).h == 0.0
    ix.snapshot(1).h = 1e-9
    ix.check_invariants()
