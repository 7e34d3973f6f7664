"""In-flight coalescing decisions (spec §12.2) at their boundaries, without an engine: which
sibling snapshot a blocked head would resume from, when it waits, and the exact Boundary tap it
plants (ninfer/engine/kv/coalesce.py; the engine-level behaviour is in test_coalesce.py)."""

from __future__ import annotations

from coalesce_helpers import CHUNKS_ONLY, COST, keyed_job, sibling

from ninfer.cache.cost import CacheCostModel
from ninfer.engine.kv.coalesce import _shared_blocks, _target, wait_for_sibling
from ninfer.engine.kv.lane import KVLane, PendingTap


def test_shared_blocks_counts_the_equal_leading_hashes():
    assert _shared_blocks([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert _shared_blocks([1, 2], [1, 2, 3]) == 2
    assert _shared_blocks([5], [6]) == 0
    assert _shared_blocks([], [1]) == 0


def test_target_prefers_the_deepest_captured_snapshot_in_range():
    lane = sibling([1] * 8, 400, 512)
    lane.pending = [PendingTap(f, 0, "tap") for f in (128, 192, 320)]
    # (F, d] = (128, 256]: 128 is the cache's frontier already, 320 lies past the divergence
    assert _target(lane, 128, 256, COST) == (192, False, 0.0)
    assert _target(lane, 128, 320, COST) == (320, False, 0.0)


def test_target_none_once_the_sibling_passed_or_snapshotted_it():
    lane = sibling([1] * 8, 256, 512)
    assert _target(lane, 0, 300, COST) is None  # t = 256 = computed
    lane.computed = 255
    assert _target(lane, 0, 300, COST) == (256, True, 0.01)
    lane.last_snapshot = 256
    assert _target(lane, 0, 300, COST) is None
    lane.last_snapshot = 255
    assert _target(lane, 0, 300, COST) == (256, True, 0.01)


def test_target_uses_the_deepest_planned_exact_tap_when_it_saves_a_split():
    lane = sibling([1] * 8, 100, 512)
    # an exact tap at t itself or past it (<= d): no split
    lane.taps = [(150, True), (256, True), (400, True)]
    assert _target(lane, 0, 300, COST) == (256, False, 0.0)
    lane.taps = [(150, True), (280, True)]
    assert _target(lane, 0, 300, COST) == (280, False, 0.0)
    # flexible taps and exact taps the sibling passed do not count
    lane.taps = [(90, True), (200, False)]
    assert _target(lane, 0, 300, COST) == (256, True, 0.01)
    # 56 tokens short of t: prefilling them (0.066 s) costs more than a split (0.01 s)
    lane.taps = [(200, True)]
    assert _target(lane, 0, 300, COST) == (256, True, 0.01)
    # with only chunk costs, 56 tokens cost exactly one split: the tap serves
    assert _target(lane, 0, 300, CHUNKS_ONLY) == (200, False, 0.0)


def test_head_waits_for_the_deepest_worthwhile_sibling_and_plants_its_tap():
    head = keyed_job("head", [1, 2, 3, 4, 5, 6, -1], 420)
    a = sibling([1, 2, 3, -2], 0, 420, "a")  # shares 3 blocks: d = 192
    b = sibling([1, 2, 3, 4, 5, -3], 0, 420, "b")  # shares 5: d = 320
    assert wait_for_sibling(head, 0, [a, b], COST, timeout_s=60.0)
    assert a.taps == [] and b.taps == [(320, True)] and b.boundary_taps == {320}
    # asked again: the tap is planted once
    assert wait_for_sibling(head, 0, [a, b], COST, timeout_s=60.0)
    assert b.taps == [(320, True)]


def test_a_planted_tap_replaces_a_flexible_one_at_the_same_position():
    head = keyed_job("head", [1, 2, 3, 4, 5, -1], 400)
    sib = sibling([1, 2, 3, 4, 5, -2], 0, 400)
    sib.taps = [(128, False), (320, False), (384, False)]
    assert wait_for_sibling(head, 0, [sib], COST, timeout_s=60.0)
    assert sib.taps == [(128, False), (320, True), (384, False)]


def test_siblings_that_cannot_serve_are_skipped():
    head = keyed_job("head", [1, 2, 3, 4, 5, -1], 400)
    done = sibling([1, 2, 3, 4, 5, -2], 400, 400, "done")  # not prefilling
    unkeyed = sibling([1, 2, 3, 4, 5, -2], 0, 400, "unkeyed")
    unkeyed.request.blocks = None
    itself = KVLane(head, 1, 0, 400, 0)
    assert not wait_for_sibling(head, 0, [done, unkeyed, itself], COST, timeout_s=60.0)
    assert not wait_for_sibling(keyed_job("x", [], 400), 0, [], COST, 60.0)
    plain = keyed_job("plain", [1], 400)
    plain.blocks = None
    assert not wait_for_sibling(plain, 0, [sibling([1] * 7, 0, 400)], COST, 60.0)


def test_divergence_is_capped_by_both_prompts():
    # all 7 hashes shared, but the head has 400 tokens: d = min(448, 399, 449) -> t = 384
    head = keyed_job("head", [1] * 7, 400)
    sib = sibling([1] * 7, 0, 450)
    assert wait_for_sibling(head, 0, [sib], COST, timeout_s=60.0)
    assert sib.taps == [(384, True)]
    # the sibling's prompt is the shorter: d = min(448, 499, 299) -> t = 256
    head = keyed_job("head", [1] * 7, 500)
    sib = sibling([1] * 7, 0, 300)
    assert wait_for_sibling(head, 0, [sib], COST, timeout_s=60.0)
    assert sib.taps == [(256, True)]


def test_no_wait_when_the_cache_already_serves_the_divergence():
    head = keyed_job("head", [1, 2, 3, -1], 300)
    sib = sibling([1, 2, 3, -2], 0, 300)
    assert not wait_for_sibling(head, 192, [sib], COST, timeout_s=60.0)  # d = F
    assert not wait_for_sibling(head, 200, [sib], COST, timeout_s=60.0)
    assert sib.taps == []
    # one token short of the divergence, a captured snapshot there is worth the wait (no split)
    sib.pending = [PendingTap(192, 0, "tap")]
    assert wait_for_sibling(head, 191, [sib], COST, timeout_s=60.0)


def test_wait_needs_savings_strictly_above_the_split():
    # only chunks of 256 cost: resuming at 192 instead of 0 saves one chunk of a 300-token
    # prompt (2 chunks -> 1), exactly the split's cost: not worth it
    chunks = CacheCostModel(0.0, 0.0, 0.01, 256, 1e9, 0.0)
    head = keyed_job("head", [1, 2, 3, -1], 300)
    sib = sibling([1, 2, 3, -2], 0, 300)
    assert not wait_for_sibling(head, 0, [sib], chunks, timeout_s=60.0)
    # a captured snapshot needs no split: the same saving is worth it
    sib.pending = [PendingTap(192, 0, "tap")]
    assert wait_for_sibling(head, 0, [sib], chunks, timeout_s=60.0)
    assert sib.taps == []


def test_wait_bound_is_inclusive():
    # the sibling needs 192 tokens more: 2 * (0.192 + 0.01) = 0.404 s <= timeout / 2
    head = keyed_job("head", [1, 2, 3, -1], 300)
    sib = sibling([1, 2, 3, -2], 0, 300)
    assert wait_for_sibling(head, 0, [sib], COST, timeout_s=0.808)
    sib = sibling([1, 2, 3, -2], 0, 300)
    assert not wait_for_sibling(head, 0, [sib], COST, timeout_s=0.807)
