"""Edges of the PrefixIndex's rules across its stores: the sizes it refuses, a fresh index's
epoch, a Device eviction that deletes a subtree holding Host-only blocks and snapshots (every
page and slab there comes back, §9.4), a prefetch that makes room by dropping Host-backed
entries including a snapshot tail (§9.5), and the lineage's supersession when two lanes resume
from one snapshot (§9.3: a lane supersedes its source once; a tap it drops retains only what
its own allocation superseded)."""

from __future__ import annotations

import pytest
from cache_helpers import Driver, make_index, tokens

from ninfer.cache import (
    CacheConfig,
    CacheCostModel,
    PrefixIndex,
    QuoteParams,
    Residency,
    SnapshotKind,
    StaleQuoteError,
    prepare_prompt,
)
from ninfer.cache.common import ROOT

ABSENT = Residency.ABSENT


def _host_chain(ix: PrefixIndex, toks: list[int]) -> list[int]:
    """Host-only blocks for the full 64-token blocks of `toks`, from the root."""
    out, parent = [], ROOT
    for b in range(len(toks) // 64):
        parent = ix.load_block(parent, toks[64 * b : 64 * b + 64])
        out.append(parent)
    return out


# ---- construction ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slab", "image", "host", "bad"),
    [
        (0, 1, 0, "slab_bytes=0"),
        (-1, 1, 0, "slab_bytes=-1"),
        (1, 0, 0, "image_bytes=0"),
        (1, -4096, 0, "image_bytes=-4096"),
        (1, 1, -1, "host_cache_bytes=-1"),
    ],
)
def test_nonpositive_sizes_are_refused_naming_the_config(slab, image, host, bad):
    cfg = CacheConfig(
        slab_bytes=slab, image_bytes=image, host_cache_bytes=host, device_snapshot_slots=1
    )
    with pytest.raises(ValueError, match=rf"^invalid cache sizes in CacheConfig\(.*{bad}"):
        PrefixIndex(cfg, CacheCostModel.cpu())


def test_smallest_sizes_make_a_fresh_index_at_epoch_zero():
    cfg = CacheConfig(slab_bytes=1, image_bytes=1, host_cache_bytes=0, device_snapshot_slots=0)
    ix = PrefixIndex(cfg, CacheCostModel.cpu())
    assert ix.host is None
    assert ix.cache_epoch == 0
    q = ix.quote(prepare_prompt(tokens(1, 70)), QuoteParams(3, 10, 10))
    assert (q.epoch, q.source, q.frontier) == (0, None, 0)
    ix.check_invariants()


# ---- §9.4: deleting a subtree returns its pages and slabs ------------------------------------


def test_evicting_an_unbacked_block_deletes_its_subtree_with_its_slabs_and_snapshots():
    ix = make_index(host_slabs=64)
    d = Driver(ix, land=False)
    d.admit(1, tokens(1, 200))
    d.commit(1, 192)
    x0, x1, x2 = ix.lane_path(1)
    y = ix.load_block(x2, tokens(5, 64))  # the first Host slab: 0
    assert ix.node(y).host_slab == 0
    tailed = ix.load_snapshot(y, tokens(6, 10))
    plain = ix.load_snapshot(y, [])
    assert (ix.snapshot(tailed).host_slabs, ix.snapshot(tailed).tail_slab) == ([1, 2], 3)
    wt = d.release(1).write
    ix.abort_write_through(wt.batch_id)  # the path blocks stay Device-only
    assert all(ix.node(n).host_state == ABSENT for n in (x0, x1, x2))

    d.land = True
    _, st = d.admit(2, tokens(7, 10), free=0)  # needs 2 pages: evicts x2 (and y), then x1

    assert st.evicted_pages == [1002, 1001]
    assert sorted(ix.blocks.tree.nodes) == [ROOT, x0]
    for sid in (tailed, plain):
        with pytest.raises(KeyError):
            ix.snapshot(sid)
    assert ix.host.free_slabs == ix.host.n_slabs == 64
    s = ix.stats()
    assert (s.subtree_deletions, s.nodes_deleted, s.snapshots_deleted) == (2, 3, 2)
    assert ix.host_tier.dirty <= set(ix.snapshots.by_id)
    ix.check_invariants()


# ---- §9.5: prefetch -----------------------------------------------------------------------------


def test_prefetch_drops_backed_blocks_and_a_backed_tail_to_make_room():
    ix = make_index()
    d = Driver(ix)
    a = d.run(0, tokens(1, 136), endpoint=136)[-1].snapshot  # 2 blocks + an 8-token tail
    sa = ix.snapshot(a)
    a_nodes = [sa.anchor, ix.node(sa.anchor).parent]
    pages = sorted([sa.tail_page] + [ix.node(n).device_page for n in a_nodes])
    assert pages == [1000, 1001, 1002] and sa.tail_device == Residency.RESIDENT
    b_toks = tokens(2, 640)
    chain = _host_chain(ix, b_toks)
    b = ix.load_snapshot(chain[-1], [])
    q = ix.quote(prepare_prompt(b_toks + tokens(3, 20)), QuoteParams(12, 0, 10**6))
    assert [c.source for c in q.considered] == [None, b]

    plan = ix.plan_prefetch(q, free_pages=0)

    assert sorted(plan.evicted_pages) == pages
    assert plan.nodes == chain[:3]  # room for three of the ten Host-only blocks
    assert (sa.tail_page, sa.tail_device) == (-1, ABSENT)
    assert sa.host_state == Residency.RESIDENT  # still restorable from its Host copy
    for n in a_nodes:
        assert (ix.node(n).device_page, ix.node(n).device_state) == (-1, ABSENT)
        assert ix.node(n).host_state == Residency.RESIDENT
    ix.check_invariants()


def test_prefetch_plans_at_most_256_blocks_by_default():
    ix = make_index(host_slabs=300)
    toks = tokens(1, 64 * 257)
    chain = _host_chain(ix, toks)
    ix.load_snapshot(chain[-1], [])
    q = ix.quote(prepare_prompt(toks + [7]), QuoteParams(300, 1000, 1000))
    assert q.considered[-1].frontier == 64 * 257
    assert ix.plan_prefetch(q, free_pages=1000).nodes == chain[:256]
    q = ix.quote(prepare_prompt(toks + [7]), QuoteParams(300, 1000, 1000))
    assert ix.plan_prefetch(q, free_pages=1000, max_blocks=257).nodes == chain


def test_prefetch_with_a_stale_quote_names_both_epochs():
    ix = make_index()
    toks = tokens(1, 128)
    ix.load_snapshot(_host_chain(ix, toks)[-1], [])
    q = ix.quote(prepare_prompt(toks + [7]), QuoteParams(4, 10, 10))
    ix.load_block(ROOT, tokens(2, 64))
    with pytest.raises(
        StaleQuoteError, match=rf"^quote epoch {q.epoch}, cache epoch {q.epoch + 1}$"
    ):
        ix.plan_prefetch(q, free_pages=10)


# ---- §9.3: one source, two lanes -------------------------------------------------------------

P = tokens(1, 400)


def _source_at_256(d: Driver) -> int:
    return d.run(0, P[:256], endpoint=256)[-1].snapshot


def test_a_tap_dropped_by_the_second_lane_leaves_the_shared_source_superseded():
    ix = make_index()
    d = Driver(ix)
    s = _source_at_256(d)
    for lane, seed in ((1, 3), (2, 4)):
        q, _ = d.admit(lane, P[:256] + tokens(seed, 100))
        assert q.source == s
    first = ix.allocate_snapshot_slot(1, 320, SnapshotKind.TAP)
    assert ix.snapshot(s).superseded
    second = ix.allocate_snapshot_slot(2, 320, SnapshotKind.TAP)
    assert first.slot != second.slot
    ix.free_snapshot_slot(2, second.slot)  # lane 2's allocation superseded nothing
    assert ix.snapshot(s).superseded
    assert list(ix.snapshots.superseded) == [s]
    ix.free_snapshot_slot(1, first.slot)  # lane 1's did: its source is retained again
    assert not ix.snapshot(s).superseded
    ix.check_invariants()


def test_a_lane_supersedes_its_source_once_even_after_another_lane_resumed_from_it():
    ix = make_index()
    d = Driver(ix)
    s = _source_at_256(d)
    d.admit(1, P[:256] + tokens(3, 200))
    tap = d.snapshot(1, 320).snapshot
    assert ix.snapshot(s).superseded
    q, _ = d.admit(2, P[:256] + tokens(4, 100))  # a hit retains it again
    assert q.source == s and not ix.snapshot(s).superseded
    d.snapshot(1, 384)  # supersedes lane 1's previous tap, not the source again
    assert not ix.snapshot(s).superseded
    assert ix.snapshot(tap).superseded
    assert list(ix.snapshots.superseded) == [tap]
    ix.check_invariants()


# ---- §9.3: a GDSF victim still complete on the Device keeps only its Device copies -----------


def test_gdsf_victim_complete_on_the_device_loses_its_slabs_and_stays():
    ix = make_index(host_slabs=4)  # one image (2) + tail (1) + one block
    d = Driver(ix)
    toks = tokens(1, 136)
    d.admit(0, toks)
    d.commit(0, 128)
    res = d.snapshot(0, 136, SnapshotKind.ENDPOINT)
    assert (res.write.slabs, res.write.tail_slab) == ([0, 1], 2)
    s = ix.snapshot(res.snapshot)
    wt = d.release(0).write  # the two path blocks need two slabs: the snapshot's Host copy goes
    assert [b.slab for b in wt.blocks] == [3, 0]
    assert ix.stats().host_gdsf_evicted == 1
    assert (s.host_slabs, s.tail_slab, s.host_state) == ([], -1, ABSENT)
    assert (s.device_state, s.tail_device) == (Residency.RESIDENT, Residency.RESIDENT)
    assert ix.host.free_slabs == 2  # slabs 1 and 2 (the image's second, the tail's)
    ix.check_invariants()
