"""Admission at its edges (spec §6.1-§6.3): exact quotes where a comparison or a skip decides
the source, the frontier or the readiness verdict.

Each test pins one boundary: a snapshot at the prompt's last token, a deeper snapshot that does
not match hiding nothing, a Vision span across a frontier, the candidate's own tail page, an
admission needing exactly the free pages or exactly the whole pool, snapshots anchored at the
root, a Filling candidate followed by a valid one.
"""

from __future__ import annotations

from cache_helpers import IMAGE, SLAB, Driver, make_index, tokens

from ninfer.cache import (
    CacheCostModel,
    QuoteParams,
    Readiness,
    Residency,
    SnapshotKind,
    prepare_prompt,
)
from ninfer.cache.keys import MediaItem

A = tokens(1, 400)
B = tokens(2, 400)


def quote(ix, prompt, ent=10, free=100, total=1000):
    if isinstance(prompt, list):
        prompt = prepare_prompt(prompt)
    return ix.quote(prompt, QuoteParams(ent, free, total))


def summary(q):
    return (q.readiness, q.source, q.frontier, q.need_pages)


def considered(q):
    return [(c.source, c.frontier, c.need_pages, c.evictable_pages) for c in q.considered]


# --- which snapshots are candidates -----------------------------------------------------------


def test_a_snapshot_at_the_prompts_last_token_is_not_a_candidate():
    # the last prompt token must be prefilled (its logits start decoding): F <= n - 1
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], taps=[128], endpoint=300)  # 1: tap @128, 2: endpoint @300
    q = quote(ix, A[:300])
    assert q.match.candidates == [1] and q.match.cached_prefix_tokens == 256
    assert summary(q) == (Readiness.READY, 1, 128, 1 * 0 + 10 - 2)
    q = quote(ix, A[:301])
    assert q.match.candidates == [2, 1]  # deepest first
    assert summary(q) == (Readiness.READY, 2, 300, 1 + 10 - 5)


def test_a_prompt_of_exactly_whole_blocks_leaves_its_last_block_unmatched():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A, taps=[64, 128])
    q = quote(ix, A[:128])
    # the block holding token 127 is never matched: the walk stops at (n - 1) // 64 blocks
    assert q.match.path == [1] and q.match.cached_prefix_tokens == 64
    assert q.match.candidates == [1] and (q.source, q.frontier) == (1, 64)
    q = quote(ix, A[:129])
    assert q.match.path == [1, 2] and q.match.candidates == [2, 1]
    assert (q.source, q.frontier) == (2, 128)


def test_a_deeper_non_matching_snapshot_on_the_same_anchor_hides_nothing():
    # two endpoints anchored at node 4 (tokens 0..255) with different tails: the one that does
    # not match the prompt is listed first on the node and must not end the anchor's scan
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], endpoint=300)  # 1: tail A[256:300]
    other = A[:256] + B[:40]
    d.run(2, other, endpoint=290)  # 2: tail B[:34], same anchor
    assert ix.node(4).snapshots == [1, 2]
    q = quote(ix, other + B[40:100])
    assert q.match.candidates == [2]
    assert summary(q) == (Readiness.READY, 2, 290, 1 + 10 - 5)
    # and a snapshot past the prompt's end listed first on the node hides nothing either
    q = quote(ix, A[:300])
    assert q.match.candidates == [] and q.source is None
    q = quote(ix, A[:256] + B[:40])  # n = 296: 2 at 290 fits, 1 at 300 is past the end
    assert q.match.candidates == [2] and (q.source, q.frontier) == (2, 290)


def test_snapshots_anchored_at_the_root_are_resumed_from():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:100], taps=[40])  # 1: anchored at the root, tail A[:40]
    assert ix.blocks.tree.root.snapshots == [1]
    q = quote(ix, A)
    assert q.match.candidates == [1] and q.match.path == [1]
    # tail Device-resident: one COW page plus ent - ceil(40 / 64); its own tail page in the LRU
    # is not evictable for it
    assert summary(q) == (Readiness.READY, 1, 40, 1 + 10 - 1)
    assert considered(q) == [(None, 0, 10, 2), (1, 40, 10, 1)]
    q = quote(ix, A[:40] + B[:100])  # same first 40 tokens: still resumes at 40
    assert q.match.candidates == [1] and q.match.path == []
    assert (q.source, q.frontier) == (1, 40)
    q = quote(ix, A[:39] + B[:100])  # the tail differs in its last token
    assert q.match.candidates == [] and q.source is None
    q = quote(ix, A[:40])  # F = n: nothing left to prefill
    assert q.match.candidates == [] and q.source is None


def test_a_root_snapshot_and_a_deeper_one_are_both_candidates():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], taps=[40, 200])  # 1 @40 (root), 2 @200 (anchor node 3, tail 8)
    q = quote(ix, A)
    assert q.match.candidates == [2, 1]
    assert (q.source, q.frontier) == (2, 200)


def _media(begin: int, length: int, tag: int) -> MediaItem:
    return MediaItem(bytes([tag]) * 32, 1, (1, 2, 2), begin, length)


def test_a_frontier_strictly_inside_a_vision_span_is_never_resumed_from():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:340], taps=[256], endpoint=300)  # 1 @256, 2 @300: both anchored at node 4
    plain = quote(ix, A)
    assert (plain.source, plain.frontier) == (2, 300)
    # an image over [280, 320) splits @300; one over [330, 340) splits neither
    both = prepare_prompt(A, [_media(280, 40, 1), _media(330, 10, 2)])
    q = quote(ix, both)
    assert q.match.path == [1, 2, 3, 4] and q.match.candidates == [1]
    assert summary(q) == (Readiness.READY, 1, 256, 10 - 4)
    # a span that begins at the frontier does not split it
    at = prepare_prompt(A, [_media(300, 20, 1)])
    assert quote(ix, at).match.candidates == [2, 1] and quote(ix, at).source == 2
    # one that ends at it lies in 2's tail [256, 300), whose tokens are compared but not its
    # media keys (the same pads stand for any image): 2 is not resumed from
    ends = prepare_prompt(A, [_media(270, 30, 1)])
    assert quote(ix, ends).match.candidates == [1] and quote(ix, ends).source == 1


# --- capacity and readiness -------------------------------------------------------------------


def test_the_candidates_own_tail_page_is_not_evictable_for_it():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], endpoint=300)  # LRU: nodes 1-4 and the tail page of 1
    assert len(ix.blocks.lru) == 5
    q = quote(ix, A, ent=10, free=6)
    # resuming pins the path (4 pages) and COWs the tail (its page stays pinned): 0 evictable
    assert considered(q) == [(None, 0, 10, 5), (1, 300, 6, 0)]
    assert summary(q) == (Readiness.READY, 1, 300, 6)
    q = quote(ix, A, ent=10, free=5)  # 6 > 5 + 0: only the root fits (10 <= 5 + 5)
    assert summary(q) == (Readiness.READY, None, 0, 10)
    q = quote(ix, A, ent=10, free=4)
    assert summary(q) == (Readiness.TEMPORARILY_BLOCKED, None, 0, 10)


def test_an_admission_needing_exactly_the_free_pages_is_ready():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], endpoint=300)
    q = quote(ix, B, ent=12, free=7)  # root: 12 == 7 + 5 evictable
    assert summary(q) == (Readiness.READY, None, 0, 12)
    q = quote(ix, B, ent=13, free=7)
    assert summary(q) == (Readiness.TEMPORARILY_BLOCKED, None, 0, 13)


def test_an_admission_needing_exactly_the_whole_pool_is_only_blocked():
    ix = make_index()
    q = quote(ix, A, ent=60, free=10, total=60)
    assert summary(q) == (Readiness.TEMPORARILY_BLOCKED, None, 0, 60)
    q = quote(ix, A, ent=61, free=10, total=60)
    assert summary(q) == (Readiness.PERMANENTLY_INFEASIBLE, None, 0, 61)
    q = quote(ix, A, ent=60, free=60, total=60)
    assert summary(q) == (Readiness.READY, None, 0, 60)


def test_entitlement_below_the_frontier_needs_no_growth_pages():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], endpoint=300)
    q = quote(ix, A, ent=2)  # ceil(300 / 64) = 5 > 2: only the tail's COW page
    assert considered(q) == [(None, 0, 2, 5), (1, 300, 1, 0)]
    assert summary(q) == (Readiness.READY, 1, 300, 1)


def test_an_aligned_frontier_needs_no_cow_page():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A, taps=[256])
    q = quote(ix, A, ent=10)
    assert summary(q) == (Readiness.READY, 1, 256, 10 - 4)
    assert q.restore_bytes == 0 and not q.restore_tail and not q.restore_image


# --- the choice of source ---------------------------------------------------------------------


def test_a_filling_deeper_candidate_does_not_end_the_search():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A, taps=[128, 256])  # 1 @128 superseded by 2 @256, both Host-backed
    ix.evict_device_pages(100)
    d.admit(2, A[:150])  # resumes from 1: restores nodes 1, 2 (landed)
    ix.release(2)
    d.land = False
    d.admit(3, A[:300])  # resumes from 2: restores nodes 3, 4, not landed (Filling)
    assert [ix.node(i).device_state for i in (1, 2, 3, 4)] == [
        Residency.RESIDENT,
        Residency.RESIDENT,
        Residency.FILLING,
        Residency.FILLING,
    ]
    q = quote(ix, A)
    assert q.match.candidates == [2, 1]
    assert summary(q) == (Readiness.READY, 1, 128, 10 - 2)
    assert [c.source for c in q.considered] == [None, 1]
    ix.on_restore_landed(d.pending.pop())
    assert quote(ix, A).source == 2
    ix.check_invariants()


def test_a_filling_tail_skips_only_its_own_snapshot():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], taps=[128], endpoint=300)  # 1 @128, 2 @300 with a 44-token tail
    ix.evict_device_pages(100)  # every block and the tail Host-only; images stay on Device
    d.land = False
    d.admit(3, A[:310])  # resumes from 2: restores nodes 1-4 and the tail, not landed
    snap2 = ix.snapshot(2)
    assert snap2.tail_device == Residency.FILLING
    ix.on_restore_landed(d.pending.pop())
    assert ix.snapshot(2).tail_device != Residency.FILLING
    assert quote(ix, A).source == 2


def _nodes_1_2_restored():
    # 1 @128, 2 @300 (tail 44); everything evicted, then nodes 1, 2 restored by a lane that
    # resumed from 1 (fast restores, expensive prefill)
    ix = make_index(cost=CacheCostModel(1.0, 0.0, 0.0, 64, 1e12, 0.0))
    d = Driver(ix)
    d.run(1, A[:300], taps=[128], endpoint=300)
    ix.evict_device_pages(100)
    d.admit(3, A[:200] + B[:100])
    ix.release(3)
    return ix


def test_s_dev_is_the_deepest_device_complete_candidate_behind_a_host_only_s_star():
    # slow restores, free prefill: s_dev (Device-resident, shallower) is the cheapest
    ix = _nodes_1_2_restored()
    ix.cost = CacheCostModel(1e-9, 0.0, 0.0, 64, 1.0, 0.0)
    q = quote(ix, A)
    assert [c.source for c in q.considered] == [None, 2, 1]
    assert [c.restore_bytes for c in q.considered] == [0, 3 * SLAB, 0]
    assert (q.source, q.frontier, q.restore_bytes) == (1, 128, 0)
    assert not q.restore_image and IMAGE == 2 * SLAB


def test_equal_cost_sources_prefer_fewer_restore_bytes():
    # restores cost nothing and prefill nothing: all three sources tie on seconds
    ix = _nodes_1_2_restored()
    ix.cost = CacheCostModel(0.0, 0.0, 0.0, 64, 1e30, 0.0)
    q = quote(ix, A)
    assert [c.restore_bytes for c in q.considered] == [0, 3 * SLAB, 0]
    assert q.source is None  # the root: first of the zero-byte ties


def test_s_star_device_complete_is_also_s_dev():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], taps=[128], endpoint=300)
    q = quote(ix, A)
    # one SourceCost for the snapshot that is both s* and s_dev
    assert [c.source for c in q.considered] == [None, 2]
    assert q.source == 2 and q.restore_bytes == 0


def test_a_snapshot_without_device_slot_is_s_star_but_not_s_dev():
    ix = make_index(slots=1)
    d = Driver(ix)
    d.run(1, A, taps=[128])
    d.admit(2, B[:300])
    d.commit(2, 192)
    grant = ix.allocate_snapshot_slot(2, 192, SnapshotKind.TAP)
    assert grant.displaced == 1  # 1 keeps only its Host image
    q = quote(ix, A)
    assert [c.source for c in q.considered] == [None, 1]
    assert (q.source, q.restore_image, q.restore_bytes) == (1, True, IMAGE)
    assert q.considered[1].restore_image and not q.considered[0].restore_image


def test_blocked_unbacked_nodes_on_the_path_are_not_subtracted_twice():
    # Host of 4 slabs: an in-flight endpoint write pins snapshot 1 (@200, anchored at node 3);
    # nodes 2, 3 are unbacked LRU entries eviction skips (blocked), node 1 is pinned by the
    # write. Nothing is evictable, and resuming from 1 removes nothing evictable either: its
    # one page (the tail's COW) fits in the one free page.
    ix = make_index(host_slabs=4)
    d = Driver(ix, land=False)
    d.admit(1, A[:220])
    d.commit(1, 192)
    d.snapshot(1, 200, SnapshotKind.ENDPOINT)
    d.release(1)
    assert ix.liveness.blocked_nodes() == {2, 3} and ix.evictable_pages() == 0
    q = quote(ix, A[:220], ent=4, free=1)
    assert considered(q) == [(None, 0, 4, 0), (1, 200, 1, 0)]
    assert summary(q) == (Readiness.READY, 1, 200, 1)
    st = ix.stage(q, 2, free_pages=1)
    assert (st.source, st.frontier, st.path, st.evicted_pages) == (1, 200, [1, 2, 3], [])
    ix.check_invariants()


def test_a_root_snapshot_is_s_dev_when_the_cheaper_s_star_does_not_fit():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], taps=[40], endpoint=300)  # 1 @40 (root, tail 40), 2 @300 (tail 44)
    assert ix.evict_device_pages(2) == [1001, 1005]  # both tails Host-only
    # a staged lane restores 1's tail (pinned by its stage: not in the LRU)
    q5 = quote(ix, A[:40] + B[:100], ent=3)
    st = ix.stage(q5, 5, 100)
    assert (st.source, st.frontier) == (1, 40)
    rb = ix.begin_restore(5, [d.page() for _ in range(st.restore_pages_needed)])
    ix.on_restore_landed(rb.batch_id)
    assert ix.snapshot(1).tail_device == Residency.RESIDENT and len(ix.blocks.lru) == 4
    q = quote(ix, A, ent=10, free=7)
    # s* = 2 restores its tail (cheapest); s_dev = 1, anchored at the root
    assert considered(q) == [(None, 0, 10, 4), (2, 300, 7, 0), (1, 40, 10, 4)]
    assert summary(q) == (Readiness.READY, 2, 300, 7)
    q = quote(ix, A, ent=10, free=6)  # s* needs 7 > 6 + 0: s_dev before the root
    assert summary(q) == (Readiness.READY, 1, 40, 10)
    q = quote(ix, A, ent=10, free=5)
    assert summary(q) == (Readiness.TEMPORARILY_BLOCKED, None, 0, 10)


def test_a_device_complete_snapshot_over_host_only_blocks_is_not_s_dev():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A, taps=[128, 256])  # 1 @128, 2 @256: no tails, images in Device slots
    ix.evict_device_pages(100)
    d.admit(2, A[:150])  # resumes from 1: restores nodes 1, 2
    ix.release(2)
    assert ix.snapshot(2).device_complete and ix.node(3).device_state == Residency.ABSENT
    q = quote(ix, A, ent=10, free=100)
    # s* = 2 restores nodes 3, 4; s_dev = 1 (its image and whole path on Device)
    assert considered(q) == [(None, 0, 10, 2), (2, 256, 2 + 10 - 4, 0), (1, 128, 10 - 2, 0)]
    assert [c.restore_blocks for c in q.considered] == [0, 2, 0]
    assert summary(q) == (Readiness.READY, 2, 256, 8)
    q = quote(ix, A, ent=10, free=8)  # exactly s*'s need
    assert summary(q) == (Readiness.READY, 2, 256, 8)


def test_a_span_split_snapshot_listed_first_hides_nothing():
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:340], endpoint=300)  # 1 @300, anchored at node 4
    d.run(2, A[:290], endpoint=280)  # 2 @280, same anchor, listed after 1
    assert ix.node(4).snapshots == [1, 2]
    assert quote(ix, A).match.candidates == [1, 2]
    q = quote(ix, prepare_prompt(A, [_media(290, 20, 1)]))  # splits @300 only
    assert q.match.candidates == [2]
    assert summary(q) == (Readiness.READY, 2, 280, 1 + 10 - 5)


def test_a_quote_carries_its_prompt_and_the_picked_sources_cost():
    ix = make_index()  # 1 s per prefilled token, 1 s per image restored
    d = Driver(ix)
    d.run(1, A[:300], endpoint=300)
    prompt = prepare_prompt(A)
    q = quote(ix, prompt, ent=10, free=100)
    assert q.prompt is prompt and (q.source, q.frontier) == (1, 300)
    assert q.cost_s == q.considered[1].cost_s == 400 - 300
    q = quote(ix, prompt, ent=10, free=0)  # nothing fits: the root is quoted
    assert q.prompt is prompt and q.source is None and q.cost_s == q.considered[0].cost_s


def test_on_a_cost_tie_the_root_is_tried_first_then_the_device_complete_s_star():
    # every source costs 0 s and 0 bytes: the root is chosen; an active lane pins nodes 1-4,
    # so only the snapshot (whose path needs no new pages) fits
    ix = make_index()
    d = Driver(ix)
    d.run(1, A[:300], taps=[256])
    d.admit(2, A[:290])  # resumes from 1 @256: nodes 1-4 pinned, not in the LRU
    assert ix.lane_path(2) == [1, 2, 3, 4] and len(ix.blocks.lru) == 0
    ix.cost = CacheCostModel(0.0, 0.0, 0.0, 64, 1e30, 0.0)
    q = quote(ix, A, ent=10, free=6)
    assert considered(q) == [(None, 0, 10, 0), (1, 256, 6, 0)]
    assert summary(q) == (Readiness.READY, 1, 256, 6)
    q = quote(ix, A, ent=10, free=5)
    assert summary(q) == (Readiness.TEMPORARILY_BLOCKED, None, 0, 10)
