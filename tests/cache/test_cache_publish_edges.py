"""Publication at its edges (spec §7.4, §7.6, §7.7): exact refusals, exact counters, the exact
snapshot record and write descriptor a publication produces, and what a duplicate leaves behind.

Each test pins one decision of ninfer/cache/publish.py: the message of every refusal (the
engine logs it), the commit and publication counters after a known sequence, a snapshot's
recency fields at publication, the Host write descriptor with and without a tail, the
duplicate flag and freed pages, the lineage a duplicate tap (not a duplicate endpoint) moves.
"""

from __future__ import annotations

import pytest
from cache_helpers import IMAGE, SLAB, Driver, make_index, tokens

from ninfer.cache import (
    PublishResult,
    Residency,
    SnapshotKind,
)
from ninfer.cache.common import LaneError
from ninfer.cache.records import CommitKind, SnapshotWrite

A = tokens(1, 400)
B = tokens(2, 400)
TAP, END = SnapshotKind.TAP, SnapshotKind.ENDPOINT
TAIL_PAGE = r"^tail_page is required exactly when frontier % 64 != 0$"


def staged(ix, lane, frontier, kind=TAP):
    return ix.allocate_snapshot_slot(lane, frontier, kind).slot


# --- refusals and their messages ----------------------------------------------------------------


def test_commit_block_refusals_name_the_block_and_the_token_count():
    ix = make_index()
    d = Driver(ix)
    d.admit(1, A)
    with pytest.raises(LaneError, match=r"^lane 1 commits block 2, expected 0$"):
        ix.commit_block(1, 2, A[:64], 7)
    with pytest.raises(ValueError, match=r"^a block holds 64 tokens, got 63$"):
        ix.commit_block(1, 0, A[:63], 7)
    with pytest.raises(ValueError, match=r"^a block holds 64 tokens, got 65$"):
        ix.commit_block(1, 0, A[:65], 7)
    assert ix.lane_path(1) == []  # nothing was committed by a refusal


def test_publish_refusals_name_the_slot_frontier_and_committed_blocks():
    ix = make_index()
    d = Driver(ix)
    d.admit(1, A)
    with pytest.raises(LaneError, match=r"^slot 3 is not staged by lane 1$"):
        ix.publish_snapshot(1, 64, 3, TAP)
    d.commit(1, 64)
    slot = staged(ix, 1, 100)
    with pytest.raises(ValueError, match=r"^frontier 100 needs 36 tail tokens$"):
        ix.publish_snapshot(1, 100, slot, TAP, A[64:99], 9)
    with pytest.raises(ValueError, match=TAIL_PAGE):
        ix.publish_snapshot(1, 100, slot, END, A[64:100], None)
    with pytest.raises(ValueError, match=TAIL_PAGE):
        ix.publish_snapshot(1, 64, slot, END, (), 9)
    # a tap inside block 1 waits for block 1 to be committed
    with pytest.raises(LaneError, match=r"^lane 1 publishes F=100 with 1 blocks committed$"):
        ix.publish_snapshot(1, 100, slot, TAP, A[64:100], 9)
    with pytest.raises(LaneError, match=r"^lane 1 publishes F=192 with 1 blocks committed$"):
        ix.publish_snapshot(1, 192, slot, END)
    d.commit(1, 128)
    with pytest.raises(ValueError, match=r"^tail tokens differ from the committed block$"):
        ix.publish_snapshot(1, 100, slot, TAP, B[64:100], 9)
    # the slot is still the lane's after every refusal: the valid call publishes from it
    res = ix.publish_snapshot(1, 100, slot, TAP, A[64:100], 9)
    assert res.duplicate is False and ix.snapshot(res.snapshot).device_slot == slot


def test_frontier_zero_is_refused_and_frontier_one_is_published_at_the_root():
    ix = make_index()
    d = Driver(ix)
    d.admit(1, A)
    slot = staged(ix, 1, 0, END)
    with pytest.raises(ValueError, match=r"^frontier 0 needs 0 tail tokens$"):
        ix.publish_snapshot(1, 0, slot, END)
    with pytest.raises(ValueError, match=r"^frontier -64 needs 0 tail tokens$"):
        ix.publish_snapshot(1, -64, slot, END)
    res = ix.publish_snapshot(1, 1, slot, END, A[:1], 9)
    s = ix.snapshot(res.snapshot)
    assert (s.frontier, s.tail_page, s.device_slot) == (1, 9, slot)


# --- commit: exact counters and recency -------------------------------------------------------


def test_commit_counters_after_inserted_duplicate_and_adopted_blocks():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:200])  # nodes 1-3 inserted, written to Host
    assert ix.evict_device_pages(2) == [1002, 1001]  # nodes 3 and 2 become Host-only
    d.admit(2, A)
    d.admit(3, A)
    kinds = [(r.kind, r.node) for r in d.commit(2, 256)]
    assert kinds == [
        (CommitKind.DUPLICATE, 1),
        (CommitKind.ADOPTED, 2),
        (CommitKind.ADOPTED, 3),
        (CommitKind.INSERTED, 4),
    ]
    kinds = [(r.kind, r.node) for r in d.commit(3, 256)]
    assert kinds == [(CommitKind.DUPLICATE, n) for n in (1, 2, 3, 4)]
    st = ix.stats()
    assert (st.blocks_inserted, st.blocks_duplicate, st.blocks_adopted) == (4, 5, 2)
    assert [ix.node(n).active_refs for n in (1, 2, 3, 4)] == [2, 2, 2, 2]


def test_a_commit_stamps_the_node_with_a_fresh_access_time():
    ix = make_index()
    d = Driver(ix)
    d.admit(1, A)
    d.commit(1, 128)
    first, second = ix.node(1).last_access, ix.node(2).last_access
    assert isinstance(first, int) and 0 < first < second
    d.admit(2, A)
    d.commit(2, 64)  # a duplicate commit refreshes the node too
    assert ix.node(1).last_access > second


# --- publication: the snapshot record and the write descriptor ----------------------------------


def test_publication_counters_count_taps_endpoints_and_duplicates_exactly():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], taps=[128, 192], endpoint=300)
    d.run(2, A[:300], taps=[], endpoint=None)  # resumes, publishes nothing
    st = ix.stats()
    assert (st.snapshots_published, st.taps_published, st.snapshots_duplicate) == (3, 2, 0)
    # two lanes racing from the root publish the same taps twice each
    ix = make_index()
    d = Driver(ix)
    d.admit(1, B[:300])
    d.admit(2, B[:300])
    first = [d.snapshot(1, f) for f in (128, 192)]
    again = [d.snapshot(2, f) for f in (128, 192)]
    assert [r.snapshot for r in first] == [1, 2] and [r.snapshot for r in again] == [1, 2]
    assert [r.duplicate for r in first + again] == [False, False, True, True]
    st = ix.stats()
    assert (st.snapshots_published, st.taps_published, st.snapshots_duplicate) == (2, 2, 2)


def test_a_new_snapshot_records_L_and_its_publication_time():
    ix = make_index(host_slabs=4)  # room for one image: GDSF evicts and L rises
    d = Driver(ix)
    first = d.run(1, A[:300], endpoint=300)[0].snapshot
    assert ix.snapshot(first).l_at == 0.0  # published while L was 0
    L = ix.stats().gdsf_l
    assert L > 0.0
    second = d.run(2, B[:300], endpoint=300)[0].snapshot
    s1, s2 = ix.snapshot(first), ix.snapshot(second)
    assert s2.l_at == L  # L_s starts at the L of its publication (§9.3)
    assert 0 < s1.last_hit < s2.last_hit  # published later, hit later


def test_the_write_descriptor_of_a_snapshot_with_and_without_a_tail():
    ix = make_index()
    d = Driver(ix, land=False)
    d.admit(1, A[:300])
    res = d.snapshot(1, 128)
    s = ix.snapshot(res.snapshot)
    assert res == PublishResult(1, False, res.write, [])
    assert res.write == SnapshotWrite(res.write.batch_id, 1, s.device_slot, [0, 1], -1, -1, IMAGE)
    assert (s.tail_page, s.tail_slab, s.host_state) == (-1, -1, Residency.FILLING)
    assert s.restore_pins == 1
    d.commit(1, 256)
    res = d.snapshot(1, 200, END)
    s = ix.snapshot(res.snapshot)
    assert res.write == SnapshotWrite(
        res.write.batch_id, 2, s.device_slot, [2, 3], s.tail_page, 4, IMAGE + SLAB
    )
    assert s.tail_page >= 1000 and s.device_slot != ix.snapshot(1).device_slot
    assert (s.tail_slab, s.host_state) == (4, Residency.FILLING)
    assert ix.stats().write_through_bytes == 2 * IMAGE + SLAB


# --- duplicates -------------------------------------------------------------------------------


def test_a_duplicate_tap_becomes_the_lanes_last_tap_and_a_duplicate_endpoint_does_not():
    ix = make_index()
    d = Driver(ix)
    d.admit(1, A[:300])
    d.admit(2, A[:300])
    d.snapshot(1, 128)  # 1
    d.snapshot(1, 200, END)  # 2
    assert not ix.snapshot(1).superseded
    dup = d.snapshot(2, 128)
    assert dup == PublishResult(1, True, None, [])
    assert ix.lanes[2].last_tap == 1
    dup = d.snapshot(2, 200, END)
    assert dup == PublishResult(2, True, None, [])
    assert ix.lanes[2].last_tap == 1
    # lane 2's next tap supersedes the tap it duplicated: it is the lane's lineage now
    d.snapshot(2, 256)
    assert ix.snapshot(1).superseded


def test_publishing_forgets_what_the_slots_allocation_superseded():
    # a published slot is no longer staged: freeing it later must not retain its lineage again
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], taps=[128])  # 1
    d.admit(2, A[:300])
    assert ix.lanes[2].source == 1
    d.snapshot(2, 192)  # supersedes 1
    assert ix.snapshot(1).superseded
    assert ix.lanes[2].superseded_for == {}


def test_an_existing_snapshot_at_exactly_the_frontier_makes_an_endpoint_not_worthwhile():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], taps=[128], endpoint=200)  # 1: tap @128, 2: endpoint @200
    # one free page: restoring from the endpoint is not affordable, the lane starts at 0, but
    # the endpoint at 200 is on its path
    q, _ = d.admit(2, A[:260], free=1, ent=6)
    assert (q.source, q.frontier) == (None, 0) and q.match.candidates == [2, 1]
    assert ix.endpoint_worthwhile(2, 200) is False
    assert ix.endpoint_worthwhile(2, 199) is True  # 71 past the tap; the endpoint at 200 is past it
    assert ix.endpoint_worthwhile(2, 263) is False  # 63 past the snapshot at 200
    assert ix.endpoint_worthwhile(2, 264) is True
