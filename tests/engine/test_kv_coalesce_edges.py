"""In-flight coalescing (spec §12.2, ninfer/engine/kv/coalesce.py) at the edges of its ranges:
a sibling snapshot already at the cache's frontier or already passed, an exact tap at the
sibling's current position, an exact tap whose remaining prefill fits one chunk only when
measured from it, the divergence capped one token short of each prompt's end, the saving
measured from the cache's frontier, the wait bound from the sibling's position, a zero timeout,
decoding lanes, ties, and siblings that cannot serve ahead of one that can."""

from __future__ import annotations

import pytest
from coalesce_helpers import CHUNKS_ONLY, COST, keyed_job, sibling

from ninfer.cache.cost import CacheCostModel
from ninfer.engine.kv.coalesce import _target, wait_for_sibling
from ninfer.engine.kv.lane import KVLane, PendingTap


def test_a_captured_snapshot_at_the_cache_frontier_is_nothing_to_wait_for():
    """The sibling's pending snapshot at exactly the frontier the cache serves the head saves
    nothing: the head waits for a Boundary tap planted at the divergence instead."""
    head = keyed_job("head", [1, 2, 3, 4, 5, -1], 400)
    sib = sibling([1, 2, 3, 4, 5, -2], 130, 400)  # shares 5 blocks: d = 320
    sib.pending = [PendingTap(128, 0, "tap")]
    assert _target(sib, 128, 320, COST) == (320, True, 0.01)
    assert wait_for_sibling(head, 128, [sib], COST, timeout_s=60.0)
    assert sib.taps == [(320, True)] and sib.boundary_taps == {320}
    # one token below it, the same snapshot is deeper than the cache: resume there, no plant
    sib = sibling([1, 2, 3, 4, 5, -2], 130, 400)
    sib.pending = [PendingTap(128, 0, "tap")]
    assert _target(sib, 127, 320, COST) == (128, False, 0.0)


def test_an_exact_tap_at_the_siblings_current_position_is_passed():
    """A planned exact tap at `computed` is behind the sibling (it is realized when the sibling
    reaches it): the target is the divergence block, not that tap."""
    lane = sibling([1] * 8, 200, 512)
    lane.taps = [(200, True)]
    assert _target(lane, 0, 300, CHUNKS_ONLY) == (256, True, 0.01)
    lane.computed = 199  # one token before it, the tap is still ahead and serves
    assert _target(lane, 0, 300, CHUNKS_ONLY) == (200, False, 0.0)


def test_an_exact_tap_serves_when_prefill_from_it_to_the_block_fits_one_chunk():
    """From the tap at 448 to t = 512 is 64 tokens: one chunk, no dearer than a split. Measured
    as 448 + 512 tokens it would be two chunks."""
    lane = sibling([1] * 9, 0, 600)
    lane.taps = [(448, True)]
    assert _target(lane, 0, 520, CHUNKS_ONLY) == (448, False, 0.0)
    # from a tap at 64 to t = 640 is 576 tokens: two chunks, dearer than a split
    lane = sibling([1] * 12, 10, 800)
    lane.taps = [(64, True)]
    assert _target(lane, 0, 700, CHUNKS_ONLY) == (640, True, 0.01)


def test_a_zero_timeout_disables_coalescing():
    head = keyed_job("head", [1, 2, 3, 4, 5, -1], 400)
    sib = sibling([1, 2, 3, 4, 5, -2], 0, 400)
    assert not wait_for_sibling(head, 0, [sib], COST, timeout_s=0.0)
    assert sib.taps == [] and sib.boundary_taps == set()
    assert wait_for_sibling(head, 0, [sib], COST, timeout_s=60.0)
    assert sib.taps == [(320, True)]
    # not even for a captured snapshot the sibling already passed (no prefill left to wait for)
    sib = sibling([1, 2, 3, 4, 5, -2], 330, 400)
    sib.pending = [PendingTap(320, 0, "tap")]
    assert not wait_for_sibling(head, 0, [sib], COST, timeout_s=0.0)
    assert wait_for_sibling(head, 0, [sib], COST, timeout_s=1e-9)


def test_a_decoding_lane_is_no_sibling_even_with_a_snapshot_pending():
    """Only a lane still prefilling can be waited for: a decoding lane's pending tap in range
    does not make the head wait."""
    head = keyed_job("head", [1, 2, 3, 4, 5, -1], 400)
    sib = sibling([1, 2, 3, 4, 5, -2], 400, 400)
    sib.request.tokens += [7] * 20
    sib.computed = 420
    sib.pending = [PendingTap(320, 0, "tap")]
    assert not wait_for_sibling(head, 0, [sib], COST, timeout_s=60.0)
    sib.computed = 399  # still prefilling: the same snapshot is worth the wait
    assert wait_for_sibling(head, 0, [sib], COST, timeout_s=60.0)


def _unkeyed(lane: KVLane) -> KVLane:
    lane.request.blocks = None
    return lane


@pytest.mark.parametrize(
    ("first", "frontier", "timeout_s"),
    [
        (lambda: sibling([1, 2, 3, 4, 5, -2], 400, 400), 0, 60.0),  # done prefilling
        (lambda: _unkeyed(sibling([1, 2, 3, 4, 5, -2], 0, 400)), 0, 60.0),
        (lambda: sibling([-9] * 7, 0, 400), 0, 60.0),  # shares nothing
        (lambda: sibling([1, -2], 0, 400), 60, 60.0),  # saves 4 tokens: less than a split
        (lambda: sibling([1, 2, 3, 4, 5, -2], 0, 400), 0, 1.0),  # too slow to reach 320
    ],
)
def test_a_sibling_that_cannot_serve_does_not_hide_a_later_one(first, frontier, timeout_s):
    head = keyed_job("head", [1, 2, 3, 4, 5, -1], 400)
    skipped = first()
    later = sibling([1, 2, 3, -3], 100, 400)  # shares 3 blocks: plants 192, 92 tokens away
    assert wait_for_sibling(head, frontier, [skipped, later], COST, timeout_s=timeout_s)
    assert later.taps == [(192, True)] and skipped.taps == []


@pytest.mark.parametrize(
    ("n", "prompt_len", "planted"),
    [(384, 450, 320), (385, 450, 384), (386, 450, 384), (500, 384, 320), (500, 385, 384)],
)
def test_the_target_leaves_each_prompt_at_least_its_last_token(n, prompt_len, planted):
    """floor_page(min(d, n - 1, sibling's n - 1)): neither prompt is snapshotted at its end."""
    head = keyed_job("head", [1] * 8, n)
    sib = sibling([1] * 8, 0, prompt_len)
    assert wait_for_sibling(head, 0, [sib], COST, timeout_s=60.0)
    assert sib.taps == [(planted, True)]


def test_the_saving_is_measured_from_the_cache_frontier():
    """Chunks of 256 only: from 0 the head's 300 tokens are two chunks and the sibling's
    snapshot at 192 saves one; from a frontier of 64 they are one chunk, and it saves none."""
    chunks = CacheCostModel(0.0, 0.0, 0.01, 256, 1e9, 0.0)
    head = keyed_job("head", [1, 2, 3, -1], 300)
    sib = sibling([1, 2, 3, -2], 150, 300)
    sib.pending = [PendingTap(192, 0, "tap")]
    assert wait_for_sibling(head, 0, [sib], chunks, timeout_s=60.0)
    assert not wait_for_sibling(head, 64, [sib], chunks, timeout_s=60.0)


def test_the_wait_bound_counts_the_siblings_prefill_from_where_it_is():
    """The sibling at 100 needs 92 tokens to reach 192: 2 * (0.092 + 0.01) = 0.204 s."""
    head = keyed_job("head", [1, 2, 3, -1], 300)
    sib = sibling([1, 2, 3, -2], 100, 300)
    assert not wait_for_sibling(head, 0, [sib], COST, timeout_s=0.40)
    assert sib.taps == []
    assert wait_for_sibling(head, 0, [sib], COST, timeout_s=0.41)
    assert sib.taps == [(192, True)]


def test_a_captured_snapshot_the_sibling_passed_needs_no_more_prefill():
    head = keyed_job("head", [1, 2, 3, -1], 300)
    sib = sibling([1, 2, 3, -2], 250, 300)
    sib.pending = [PendingTap(192, 0, "tap")]  # captured, published with the next block
    assert wait_for_sibling(head, 0, [sib], COST, timeout_s=1e-6)


def test_of_equally_deep_targets_the_first_sibling_is_chosen():
    head = keyed_job("head", [1, 2, 3, 4, 5, -1], 400)
    a = sibling([1, 2, 3, 4, 5, -2], 0, 400)
    b = sibling([1, 2, 3, 4, 5, -3], 0, 400)
    assert wait_for_sibling(head, 0, [a, b], COST, timeout_s=60.0)
    assert a.taps == [(320, True)] and b.taps == []
