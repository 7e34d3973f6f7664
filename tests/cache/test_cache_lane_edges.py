"""The lane lifecycle's edges (spec §6.4, §7.4, §7.6, §7.7): what stage refuses and what it
records for each kind of hit, a restore from the Host tier step by step (page counts, the
batch's copies and bytes, the refusals on the way), and what release writes through when the
Host tier runs out."""

from __future__ import annotations

import pytest
from cache_helpers import IMAGE, SLAB, Driver, make_index, tokens

from ninfer.cache import (
    BlockCopy,
    ImageCopy,
    LaneError,
    QuoteParams,
    Readiness,
    Residency,
    SnapshotKind,
    StaleQuoteError,
    TailCopy,
    prepare_prompt,
)
from ninfer.cache.device_lru import DeviceEntry, EntryKind

ABSENT, RESIDENT, FILLING = Residency.ABSENT, Residency.RESIDENT, Residency.FILLING
P = tokens(1, 300)
BIG = 10**6


def lru(ix) -> list[tuple[str, int]]:
    return [(e.kind.name, e.id) for e in ix.blocks.lru.order()]


def test_stage_refuses_a_stale_quote_an_open_lane_and_a_quote_that_is_not_ready():
    ix = make_index()
    d = Driver(ix)
    d.run(1, P, taps=[136])
    prompt = prepare_prompt(P)
    q = ix.quote(prompt, QuoteParams(6, BIG, BIG))
    ix.evict_device_pages(0)  # any change moves the epoch
    with pytest.raises(
        StaleQuoteError, match=rf"^quote epoch {q.epoch}, cache epoch {q.epoch + 1}$"
    ):
        ix.stage(q, 2, BIG)
    d.admit(2, tokens(2, 100))
    q = ix.quote(prompt, QuoteParams(6, BIG, BIG))
    with pytest.raises(LaneError, match="^lane 2 is already open$"):
        ix.stage(q, 2, BIG)
    for total, readiness in ((50, "PERMANENTLY_INFEASIBLE"), (BIG, "TEMPORARILY_BLOCKED")):
        q = ix.quote(prompt, QuoteParams(100, 1, total))
        assert q.readiness == Readiness[readiness]
        with pytest.raises(ValueError, match=f"^cannot stage a {readiness} quote$"):
            ix.stage(q, 3, 1)
    assert sorted(ix.lanes) == [2] and ix.stats().lookups == 2
    ix.check_invariants()


def test_a_device_hit_pins_the_resumed_path_and_moves_the_recomputed_blocks_to_mru():
    ix = make_index()
    d = Driver(ix)
    d.run(1, P, taps=[136])  # nodes 1-4, snapshot 1 at 136 (anchor 2, tail on page 1003)
    d.run(5, tokens(5, 128))  # nodes 5, 6
    assert lru(ix) == [("TAIL", 1), ("NODE", 4), ("NODE", 3), ("NODE", 2), ("NODE", 1)] + [
        ("NODE", 6),
        ("NODE", 5),
    ]
    before = ix.stats().lookups, ix.stats().reuse_tokens, ix.stats().hits_device
    q = ix.quote(prepare_prompt(P), QuoteParams(6, BIG, BIG))
    assert (q.source, q.frontier, q.match.path) == (1, 136, [1, 2, 3, 4])
    st = ix.stage(q, 2, BIG)
    t = ix.registry.clock
    assert (st.source, st.frontier, st.path, st.evicted_pages) == (1, 136, [1, 2], [])
    assert (st.restore_pages_needed, st.restore_image, st.hit_tier) == (0, False, "device")
    assert (st.source_slot, st.source_tail_page) == (0, 1003)
    # blocks 2-3 will be recomputed: not pinned, moved to MRU deepest first (evicted last,
    # block 3 before block 2); the resumed blocks 0-1 and the source's tail are pinned
    assert lru(ix) == [("NODE", 6), ("NODE", 5), ("NODE", 4), ("NODE", 3)]
    assert [ix.node(n).active_refs for n in (1, 2, 3, 4)] == [1, 1, 0, 0]
    assert [ix.node(n).last_access for n in (1, 2, 3, 4)] == [t] * 4
    assert ix.node(5).last_access < t
    s = ix.snapshot(1)
    assert (s.hits, s.last_hit, s.l_at, s.restore_pins) == (1, t, ix.host_tier.L, 1)
    after = ix.stats().lookups, ix.stats().reuse_tokens, ix.stats().hits_device
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 136, 1]
    assert (ix.stats().hits_host, ix.stats().hits_root) == (0, 2)
    ix.activate(2)
    assert ix.snapshot(1).restore_pins == 0 and DeviceEntry(EntryKind.TAIL, 1) in ix.blocks.lru
    ix.check_invariants()
    ix.stage(ix.quote(prepare_prompt(P), QuoteParams(6, BIG, BIG)), 3, BIG)  # a second hit
    after = ix.stats().lookups, ix.stats().reuse_tokens, ix.stats().hits_device
    assert [b - a for a, b in zip(before, after, strict=True)] == [2, 272, 2]
    assert ix.snapshot(1).hits == 2


def test_a_root_hit_evicts_the_deficit_at_stage():
    ix = make_index()
    d = Driver(ix)
    d.run(1, P, taps=[136])
    d.run(5, tokens(5, 128))
    q = ix.quote(prepare_prompt(tokens(7, 200)), QuoteParams(4, 1, BIG))
    assert (q.readiness, q.source, q.need_pages) == (Readiness.READY, None, 4)
    st = ix.stage(q, 3, 1)
    assert st.lane == 3
    # 3 pages short: the Device LRU's head (tail 1, nodes 4, 3) goes, backed by the Host
    assert (st.evicted_pages, st.hit_tier, st.path) == ([1003, 1004, 1002], "root", [])
    assert (st.source_slot, st.source_tail_page, st.restore_pages_needed) == (-1, -1, 0)
    assert ix.begin_restore(3, []) is None
    ix.activate(3)
    ix.check_invariants()


def _host_only_source():
    """Snapshot 1 (136 on P, anchor node 2, tail slab 2, image slabs 0-1) lost its Device image
    to lane 2's tap (one slot) and its tail and path pages to eviction: resuming from it
    restores blocks 0-1, the tail and the image from the Host."""
    ix = make_index(slots=1)
    d = Driver(ix)
    d.run(1, P[:200], taps=[136])
    d.run(2, tokens(2, 200), taps=[128])
    assert ix.evict_device_pages(4) == [1003, 1002, 1001, 1000]
    s = ix.snapshot(1)
    assert (s.device_state, s.tail_device, s.host_slabs, s.tail_slab) == (ABSENT, ABSENT, [0, 1], 2)
    assert [(ix.node(n).device_state, ix.node(n).host_slab) for n in (1, 2)] == [
        (ABSENT, 3),
        (ABSENT, 4),
    ]
    return ix, d


def test_a_host_hit_restores_blocks_tail_and_image_in_one_batch():
    ix, d = _host_only_source()
    before = ix.stats().hits_host, ix.stats().restores, ix.stats().restored_host_bytes
    q = ix.quote(prepare_prompt(P[:136] + tokens(3, 60)), QuoteParams(4, BIG, BIG))
    assert (q.source, q.frontier, q.restore_bytes) == (1, 136, 3 * SLAB + IMAGE)
    st = ix.stage(q, 3, BIG)
    assert (st.hit_tier, st.restore_pages_needed, st.restore_image) == ("host", 3, True)
    assert (st.source_slot, st.source_tail_page, st.path) == (-1, -1, [1, 2])
    with pytest.raises(LaneError, match="^lane 3 has Host-only parts: call begin_restore first$"):
        ix.activate(3)
    with pytest.raises(ValueError, match="^begin_restore needs 3 pages, got 2$"):
        ix.begin_restore(3, [7, 8])
    rb = ix.begin_restore(3, [7, 8, 9])
    assert rb.blocks == [BlockCopy(1, 7, 3), BlockCopy(2, 8, 4)]
    assert rb.tail == TailCopy(1, 9, 2) and rb.image == ImageCopy(1, [0, 1])
    assert rb.bytes == 3 * SLAB + IMAGE
    assert [ix.node(n).device_state for n in (1, 2)] == [FILLING, FILLING]
    assert [ix.node(n).device_page for n in (1, 2)] == [7, 8]
    assert [ix.node(n).restore_pins for n in (1, 2)] == [1, 1]
    s = ix.snapshot(1)
    assert (s.tail_page, s.tail_device, s.restore_pins) == (9, FILLING, 2)  # stage + batch
    after = ix.stats().hits_host, ix.stats().restores, ix.stats().restored_host_bytes
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 3 * SLAB + IMAGE]
    ix.check_invariants()
    with pytest.raises(LaneError, match=rf"^lane 3: restore batch {rb.batch_id} has not landed$"):
        ix.cancel_stage(3)
    ix.on_restore_landed(rb.batch_id)
    ix.check_invariants()
    # cancelled after landing: the restored pages stay cached, nothing is freed
    assert ix.cancel_stage(3) == []
    assert 3 not in ix.lanes and ix.snapshot(1).restore_pins == 0
    assert [ix.node(n).active_refs for n in (1, 2)] == [0, 0]
    assert ix.snapshot(1).tail_device == RESIDENT
    assert lru(ix)[-3:] == [("TAIL", 1), ("NODE", 2), ("NODE", 1)]  # deepest first
    ix.check_invariants()
    # the image still lives on the Host only: a second hit is a Host hit; then a Device hit
    q = ix.quote(prepare_prompt(P[:136] + tokens(4, 60)), QuoteParams(4, BIG, BIG))
    st = ix.stage(q, 4, BIG)
    assert (st.lane, st.hit_tier, st.restore_pages_needed, st.restore_image) == (4, "host", 0, True)
    rb = ix.begin_restore(4, [])  # the image only
    assert (rb.blocks, rb.tail, rb.bytes) == ([], None, IMAGE)
    restores = ix.stats().restores, ix.stats().restored_host_bytes
    assert restores == (before[1] + 2, before[2] + 3 * SLAB + 2 * IMAGE)
    q = ix.quote(prepare_prompt(tokens(2, 128) + tokens(5, 60)), QuoteParams(4, BIG, BIG))
    assert (q.source, ix.stage(q, 5, BIG).hit_tier) == (2, "device")
    assert (ix.stats().hits_host, ix.stats().hits_device) == (before[0] + 2, 1)


def test_begin_restore_with_nothing_on_the_host_returns_none_and_frees_the_lane():
    ix = make_index()
    d = Driver(ix)
    d.run(1, P, taps=[136])
    q = ix.quote(prepare_prompt(P), QuoteParams(6, BIG, BIG))
    ix.stage(q, 2, BIG)
    with pytest.raises(ValueError, match="^begin_restore needs 0 pages, got 1$"):
        ix.begin_restore(2, [5])
    assert ix.begin_restore(2, []) is None
    assert not ix.batches and ix.stats().restores == 0
    ix.activate(2)
    ix.check_invariants()


def test_cancel_stage_unpins_the_path_and_the_source():
    ix = make_index()
    d = Driver(ix)
    d.run(1, P, taps=[136])
    q = ix.quote(prepare_prompt(P), QuoteParams(6, BIG, BIG))
    ix.stage(q, 2, BIG)
    assert lru(ix) == [("NODE", 4), ("NODE", 3)]
    assert ix.cancel_stage(2) == []
    assert not ix.lanes
    assert lru(ix) == [("NODE", 4), ("NODE", 3), ("TAIL", 1), ("NODE", 2), ("NODE", 1)]
    assert [ix.node(n).active_refs for n in (1, 2)] == [0, 0]
    assert ix.snapshot(1).restore_pins == 0
    ix.check_invariants()


def test_release_writes_through_until_the_host_is_full_and_leaves_the_rest_unbacked():
    ix = make_index(host_slabs=5)
    d = Driver(ix, land=False)
    d.admit(1, tokens(1, 400))
    d.commit(1, 384)  # six blocks, five Host slabs
    res = ix.release(1)
    assert [(b.node, b.page, b.slab) for b in res.write.blocks] == [
        (n, 1000 + n - 1, n - 1) for n in (1, 2, 3, 4, 5)
    ]
    assert res.write.bytes == 5 * SLAB and ix.stats().write_through_bytes == 5 * SLAB
    assert res.lru_added == [6]  # the written blocks stay pinned until their copy lands
    assert [ix.node(n).host_state for n in range(1, 7)] == [FILLING] * 5 + [ABSENT]
    assert list(ix.blocks.lru.unbacked) == [DeviceEntry(EntryKind.NODE, 6)]
    ix.check_invariants()
    ix.on_write_through_landed(res.write.batch_id)
    assert lru(ix) == [("NODE", 5), ("NODE", 4), ("NODE", 3), ("NODE", 2), ("NODE", 1)] + [
        ("NODE", 6)
    ]
    ix.check_invariants()


def test_release_revalues_the_snapshot_whose_exclusive_blocks_get_host_copies():
    ix = make_index()
    d = Driver(ix, land=False)
    d.admit(1, P)
    d.snapshot(1, 256)
    ix.on_write_through_landed(d.pending.pop())
    ix.check_invariants()  # flushes the dirty set: the tap owns no Host block yet
    h_before = ix.snapshot(1).h
    t = ix.registry.clock
    res = ix.release(1)
    assert [b.node for b in res.write.blocks] == [1, 2, 3, 4] and res.lru_added == []
    assert [ix.node(n).last_access for n in (1, 2, 3, 4)] == [t + 1] * 4
    ix.host_tier.flush()
    assert ix.snapshot(1).h < h_before  # four exclusive slabs more for the same saving
    ix.check_invariants()


def test_an_activated_lane_cannot_begin_a_restore_or_be_cancelled():
    ix = make_index()
    d = Driver(ix)
    d.run(1, P, taps=[136])
    d.admit(2, P)
    with pytest.raises(LaneError, match="^lane 2 is activated$"):
        ix.begin_restore(2, [])
    with pytest.raises(LaneError, match="^lane 2 is activated$"):
        ix.cancel_stage(2)
    with pytest.raises(LaneError, match="^lane 9 is not open$"):
        ix.cancel_stage(9)
    assert ix.lane_path(2) == [1, 2]
    ix.check_invariants()


def test_release_returns_a_staging_slot_the_lane_never_published():
    ix = make_index(slots=2)
    d = Driver(ix)
    d.admit(1, P)
    d.commit(1, 256)
    grant = ix.allocate_snapshot_slot(1, 256, SnapshotKind.TAP)
    assert grant.slot == 0 and ix.snapshots.slots.free_count == 1
    d.release(1)
    assert ix.snapshots.slots.free_count == 2 and not ix.snapshots.by_id
    ix.check_invariants()


def test_a_resumed_lane_values_its_first_snapshot_from_its_resume_point():
    """§9.2 step 3: a new snapshot's estimate counts the tokens since the lane's previous
    snapshot, which for a lane that has published nothing is its source. No Host tier, two
    slots: a shared Boundary at 128 (not superseded: two conversations continue from it) and
    a tap at 64 worth 63/8192. Lane 3 resumed at 128 asks for a slot at 192: worth
    63/12288 from its resume point, less than the tap, so the tap is kept and the new one
    skipped (from position 0 it would be worth 191/20480 and displace the tap)."""
    ix = make_index(host_slabs=0, slots=2)
    d = Driver(ix)
    d.admit(1, P)
    d.snapshot(1, 128, SnapshotKind.BOUNDARY)
    d.commit(1, 256)
    d.release(1)
    d.run(4, tokens(4, 100), taps=[64])
    d.admit(3, P[:128] + tokens(3, 100))
    assert ix.lanes[3].source == 1
    d.commit(3, 192)
    ix.check_invariants()
    assert ix.snapshot(2).h == 63 / 8192
    assert ix.allocate_snapshot_slot(3, 192, SnapshotKind.TAP) is None
    assert sorted(ix.snapshots.by_id) == [1, 2] and not ix.snapshot(1).superseded
    assert ix.stats().taps_skipped_no_slot == 1


def test_stage_evicts_a_deficit_of_one_page():
    ix = make_index()
    d = Driver(ix)
    d.run(1, P, taps=[136])
    q = ix.quote(prepare_prompt(tokens(7, 200)), QuoteParams(4, 3, BIG))
    assert (q.readiness, q.need_pages) == (Readiness.READY, 4)
    assert ix.stage(q, 3, 3).evicted_pages == [1003]  # the LRU head: snapshot 1's tail


def test_host_only_path_blocks_need_a_restore_even_with_the_image_on_the_device():
    ix = make_index()
    d = Driver(ix)
    d.run(1, P, taps=[136])
    assert ix.evict_device_pages(5) == [1003, 1004, 1002, 1001, 1000]  # tail, blocks 3-0
    q = ix.quote(prepare_prompt(P), QuoteParams(6, BIG, BIG))
    st = ix.stage(q, 2, BIG)
    assert (st.restore_image, st.restore_pages_needed, st.source_slot) == (False, 3, 0)
    with pytest.raises(LaneError, match="^lane 2 has Host-only parts: call begin_restore first$"):
        ix.activate(2)
    rb = ix.begin_restore(2, [7, 8, 9])
    assert [b.node for b in rb.blocks] == [1, 2] and rb.image is None
    ix.activate(2)
    ix.check_invariants()
