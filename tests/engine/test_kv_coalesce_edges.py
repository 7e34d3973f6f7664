"""In-flight coalescing (spec §12.2, ninfer/engine/kv/coalesce.py) at the edges of its ranges:
a sibling snapshot already at the cache's frontier, an exact tap at the sibling's current
position, and an exact tap whose remaining prefill fits one chunk only when measured from it."""

from __future__ import annotations

from engine_helpers import greedy

from ninfer.cache.cost import CacheCostModel
from ninfer.engine.kv.coalesce import _target, wait_for_sibling
from ninfer.engine.lane import Job, Lane, PendingTap, PromptHints

# 1 ms per token and 10 ms per chunk of 512 tokens
COST = CacheCostModel(1e-3, 0.0, 0.01, 512, 1e9, 0.0)
# only chunks cost: any 1..512 tokens cost exactly one chunk (10 ms), 513..1024 two
CHUNKS_ONLY = CacheCostModel(0.0, 0.0, 0.01, 512, 1e9, 0.0)


class _Blocks:
    def __init__(self, hashes):
        self.hashes = hashes


def _job(rid: str, hashes: list[int], n: int) -> Job:
    job = Job(rid, [0] * n, greedy(1), PromptHints(), sink=None)
    job.blocks = _Blocks(hashes)
    return job


def _sibling(hashes: list[int], computed: int, prompt_len: int) -> Lane:
    job = _job("sib", hashes, prompt_len)
    return Lane(job, 1, 0, list(job.prompt), prompt_len, computed)


def test_a_captured_snapshot_at_the_cache_frontier_is_nothing_to_wait_for():
    """The sibling's pending snapshot at exactly the frontier the cache serves the head saves
    nothing: the head waits for a Boundary tap planted at the divergence instead."""
    head = _job("head", [1, 2, 3, 4, 5, -1], 400)
    sib = _sibling([1, 2, 3, 4, 5, -2], 130, 400)  # shares 5 blocks: d = 320
    sib.pending = [PendingTap(128, 0, "tap")]
    assert _target(sib, 128, 320, COST) == (320, True, 0.01)
    assert wait_for_sibling(head, 128, [sib], COST, timeout_s=60.0)
    assert sib.taps == [(320, True)] and sib.boundary_taps == {320}
    # one token below it, the same snapshot is deeper than the cache: resume there, no plant
    sib = _sibling([1, 2, 3, 4, 5, -2], 130, 400)
    sib.pending = [PendingTap(128, 0, "tap")]
    assert _target(sib, 127, 320, COST) == (128, False, 0.0)


def test_an_exact_tap_at_the_siblings_current_position_is_passed():
    """A planned exact tap at `computed` is behind the sibling (it is realized when the sibling
    reaches it): the target is the divergence block, not that tap."""
    lane = _sibling([1] * 8, 200, 512)
    lane.taps = [(200, True)]
    assert _target(lane, 0, 300, CHUNKS_ONLY) == (256, True, 0.01)
    lane.computed = 199  # one token before it, the tap is still ahead and serves
    assert _target(lane, 0, 300, CHUNKS_ONLY) == (200, False, 0.0)


def test_an_exact_tap_serves_when_prefill_from_it_to_the_block_fits_one_chunk():
    """From the tap at 448 to t = 512 is 64 tokens: one chunk, no dearer than a split. Measured
    as 448 + 512 tokens it would be two chunks."""
    lane = _sibling([1] * 9, 0, 600)
    lane.taps = [(448, True)]
    assert _target(lane, 0, 520, CHUNKS_ONLY) == (448, False, 0.0)
    # from a tap at 64 to t = 640 is 576 tokens: two chunks, dearer than a split
    lane = _sibling([1] * 12, 10, 800)
    lane.taps = [(64, True)]
    assert _target(lane, 0, 700, CHUNKS_ONLY) == (640, True, 0.01)
