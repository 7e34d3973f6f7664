"""check_index: every §10 invariant the index can check, recomputed from scratch.

It reads a PrefixIndex's records (duck-typed: this module sits below index.py).

O(nodes x depth + snapshots x depth): for tests and the engine's debug mode only. It also
holds the recount of the stats gauges (`recount_gauges`) that `PrefixIndex.stats()` reads from
the stores' running counts.
"""

from __future__ import annotations

from collections import Counter

from ninfer.cache.common import ROOT, Residency
from ninfer.cache.device_slots import SlotState
from ninfer.cache.stats import GAUGES, CacheStats
from ninfer.page import PAGE_SIZE

_ABSENT, _RESIDENT, _FILLING = Residency.ABSENT, Residency.RESIDENT, Residency.FILLING


def check_index(ix) -> None:
    """The stores' own invariants interleaved with the ones across stores, in an order where
    the first failure names the broken invariant rather than a consequence of it."""
    ix.blocks.check_tree(ix.host is not None)
    _check_ownership(ix)
    _check_counters(ix)
    ix.blocks.check_membership(ix.snapshots.by_id)
    _check_staging(ix)
    _check_snapshots(ix)
    ix.snapshots.check_invariants()
    ix.host_tier.check_invariants()
    _check_gauges(ix)  # last: a wrong field above also miscounts, but is named there first


def _check_ownership(ix) -> None:
    """§10.1: each cached page and each Host slab has exactly one owner."""
    pages, slabs = Counter(), Counter()
    for n in ix.blocks.tree.nodes.values():
        if n.device_page >= 0:
            pages[n.device_page] += 1
        if n.host_slab >= 0:
            slabs[n.host_slab] += 1
    for s in ix.snapshots.by_id.values():
        if s.tail_page >= 0:
            pages[s.tail_page] += 1
        for x in s.host_slabs:
            slabs[x] += 1
        if s.tail_slab >= 0:
            slabs[s.tail_slab] += 1
    assert all(c == 1 for c in pages.values()), "§10.1 a Device page has two cache owners"
    assert all(c == 1 for c in slabs.values()), "§10.1 a Host slab has two owners"
    if ix.host is not None:
        allocated = {i for i in range(ix.host.n_slabs) if ix.host.is_allocated(i)}
        assert allocated == set(slabs), "§10.1 allocated slabs differ from owned slabs"
    else:
        assert not slabs


def _check_counters(ix) -> None:
    nodes = ix.blocks.tree.nodes
    live, ret, xor = Counter(), Counter(), Counter()
    for s in ix.snapshots.by_id.values():
        for n in ix.blocks.tree.ancestors(nodes[s.anchor]):
            live[n.id] += 1
            if not s.superseded:
                ret[n.id] += 1
                xor[n.id] ^= s.id
    refs, pins = Counter(), Counter()
    for lane in ix.lanes.values():
        for nid in lane.path:
            refs[nid] += 1
        if lane.activated:
            for nid in lane.path:
                assert nodes[nid].device_state != _ABSENT, f"§10.3 lane {lane.id} path node"
        if lane.source_pinned:
            pins[("s", lane.source)] += 1
    for b in ix.batches.values():
        for nid in b.nodes:
            pins[nid] += 1
        if b.snapshot is not None:
            pins[("s", b.snapshot)] += 1
    for n in nodes.values():
        assert n.live_below == live[n.id], f"live_snapshots_below of node {n.id}"
        assert n.retained_below == ret[n.id], f"retained_below of node {n.id}"
        assert n.retained_xor == xor[n.id], f"retained_xor of node {n.id}"
        assert n.active_refs == refs[n.id], f"active_refs of node {n.id}"
        assert n.restore_pins == pins[n.id], f"restore_pins of node {n.id}"
    for s in ix.snapshots.by_id.values():
        assert s.restore_pins == pins[("s", s.id)], f"restore_pins of snapshot {s.id}"


def _check_staging(ix) -> None:
    """A staging slot is held by the lane that allocated it."""
    staging = {(slot, lane.id) for lane in ix.lanes.values() for slot in lane.staging}
    for slot, o in enumerate(ix.snapshots.slots.owners):
        if o.state == SlotState.STAGING:
            assert (slot, o.owner) in staging, f"staging slot {slot} has no lane"
    assert len(staging) == sum(o.state == SlotState.STAGING for o in ix.snapshots.slots.owners)


def _check_snapshots(ix) -> None:
    """The records against the tree and the Host tier (the store checks its own links)."""
    nodes = ix.blocks.tree.nodes
    for s in ix.snapshots.by_id.values():
        anchor = nodes.get(s.anchor)
        assert anchor is not None and s.id in anchor.snapshots, f"snapshot {s.id} anchor"
        assert anchor.depth == s.anchor_depth and s.frontier == s.expected_frontier()
        assert s.tail_len < PAGE_SIZE, f"snapshot {s.id} tail too long"
        assert s.image_has_copy() and s.tail_has_copy(), f"§10.4 snapshot {s.id} invalid"
        assert (s.device_slot >= 0) == (s.device_state != _ABSENT)
        assert (s.tail_page >= 0) == (s.tail_device != _ABSENT)
        assert bool(s.host_slabs) == (s.host_state != _ABSENT)
        if s.host_slabs:
            assert len(s.host_slabs) == ix.config.image_slabs
            assert (s.tail_slab >= 0) == bool(s.tail)
        if s.host_state == _FILLING or s.tail_device == _FILLING:
            assert s.restore_pins > 0, f"§10.6 Filling snapshot {s.id} is not pinned"


def recount_gauges(ix) -> CacheStats:
    """The index's gauges (stats.GAUGES; every other field 0) counted over every node and
    snapshot (O(tree)): what `ix.stats()` must report."""
    st = CacheStats()
    nodes = [n for n in ix.blocks.tree.nodes.values() if n.id != ROOT]
    snaps = list(ix.snapshots.by_id.values())
    st.nodes, st.snapshots = len(nodes), len(snaps)
    st.nodes_device = sum(n.device_state != _ABSENT for n in nodes)
    st.nodes_host = sum(n.host_state != _ABSENT for n in nodes)
    st.snapshots_device = sum(s.device_state != _ABSENT for s in snaps)
    st.snapshots_host = sum(s.host_state != _ABSENT for s in snaps)
    st.snapshots_superseded = sum(s.superseded for s in snaps)
    st.snapshot_tails_device = sum(s.tail_page >= 0 for s in snaps)
    st.device_cached_pages = st.nodes_device + st.snapshot_tails_device
    st.device_evictable_pages = sum(
        n.device_state == _RESIDENT and not n.active_refs and not n.restore_pins for n in nodes
    ) + sum(s.tail_device == _RESIDENT and not s.restore_pins for s in snaps if s.tail)
    host = ix.host
    if host is not None:
        st.host_slabs_total = host.n_slabs
        st.host_slabs_free = sum(not host.is_allocated(i) for i in range(host.n_slabs))
    slab = ix.config.slab_bytes
    st.host_block_bytes = st.nodes_host * slab
    st.host_snapshot_bytes = slab * sum(
        len(s.host_slabs) + (s.tail_slab >= 0) for s in snaps if s.host_state != _ABSENT
    )
    return st


def _check_gauges(ix) -> None:
    """Every gauge `stats()` reports (kept as the stores change) equals its recount."""
    have, want = ix.stats(), recount_gauges(ix)
    for name in GAUGES:
        a, b = getattr(have, name), getattr(want, name)
        assert a == b, f"stats gauge {name}: kept {a}, recount {b}"
