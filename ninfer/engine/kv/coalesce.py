"""In-flight prefix coalescing (design §12.2): a FIFO head that shares a prefix with a lane still
prefilling waits for that lane's snapshot at the divergence instead of prefilling it again.

Only reachable with `concurrent_prefill` (otherwise no lane prefills when the head is quoted).
Prefix sharing is estimated from the chained block hashes (a hash match implies the whole
prefix matches, up to collisions); the cache verifies tokens exactly when the head is admitted,
so an estimate can only cost a wait, never a wrong resume.

    head      |=============== shared ===============|--- head's own ---|
    sibling   |=============== shared ===============|--- sibling's ----|
              0                 F (cache now)        d                 t = floor_page(min(d, n-1))

Target, per sibling (first that applies):
  1. a snapshot the sibling captured in (F, d] but has not published yet (it publishes within
     the sibling's next chunk): no split;
  2. the sibling's deepest planned exact tap p <= d, when p >= t, or when prefilling t - p
     tokens costs no more than one chunk's fixed cost: no split;
  3. t itself, planted as an exact Boundary tap: it may split one chunk (one chunk's fixed
     cost).
The head waits (holding no pins, staying in the FIFO) only when
    prefill_seconds(F -> n) - prefill_seconds(target -> n) > split cost
                                                  (the prefill it saves exceeds the split), and
    2 * prefill_seconds(sibling.computed -> target) <= pending_timeout_s / 2
(other lanes' decode rounds interleave with the sibling's chunks, hence the factor 2). It stops
waiting once the sibling passes the target, finishes or is cancelled: every sibling chunk
re-arms admission. pending_timeout_s = 0 disables coalescing.
"""

from __future__ import annotations

from typing import NamedTuple

from ninfer.cache.cost import CacheCostModel
from ninfer.engine.kv.lane import KVLane
from ninfer.engine.request import Request
from ninfer.page import PAGE_SIZE


class _Target(NamedTuple):
    position: int  # the snapshot frontier the head will resume from
    plant: bool  # add an exact Boundary tap at `position` to the sibling's plan
    split_s: float  # the chunk split the wait may add


def _shared_blocks(a: list[int], b: list[int]) -> int:
    k = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        k += 1
    return k


def _target(lane: KVLane, frontier: int, d: int, cost: CacheCostModel) -> _Target | None:
    """The sibling snapshot the head would resume from (see the module docstring), or None."""
    captured = [p.frontier for p in lane.pending if frontier < p.frontier <= d]
    if captured:
        return _Target(max(captured), False, 0.0)
    t = d - d % PAGE_SIZE
    if lane.computed >= t or t <= lane.last_snapshot:
        return None  # passed (or snapshotted) already: nothing left to wait for
    exact = [p for p, is_exact in lane.taps if is_exact and lane.computed < p <= d]
    if exact:
        p = max(exact)
        if p >= t or cost.prefill_seconds(p, t - p) <= cost.chunk_s:
            return _Target(p, False, 0.0)
    return _Target(t, True, cost.chunk_s)


def wait_for_sibling(
    job: Request, frontier: int, lanes: list[KVLane], cost: CacheCostModel, timeout_s: float
) -> bool:
    """True when the head should wait for a prefilling sibling; plants the sibling's tap.

    `frontier`: what the cache serves the head now. Mutates the chosen sibling's planned taps
    (an exact Boundary tap at the target) when rule 3 applies.
    """
    if timeout_s <= 0 or job.blocks is None or job.images is not None:
        return False  # Vision prompts do not coalesce (their placeholders match any image)
    n = len(job.prompt)
    best: tuple[int, KVLane, _Target] | None = None
    for lane in lanes:
        if not lane.prefilling or lane.request.blocks is None or lane.request is job:
            continue
        d = _shared_blocks(job.blocks.hashes, lane.request.blocks.hashes) * PAGE_SIZE
        d = min(d, n - 1, lane.prompt_len - 1)
        target = _target(lane, frontier, d, cost) if d > frontier else None
        if target is None or target.position <= frontier:
            continue
        p = target.position
        saved = cost.prefill_seconds(frontier, n - frontier) - cost.prefill_seconds(p, n - p)
        if saved <= target.split_s:
            continue
        remaining = max(target.position - lane.computed, 0)
        if 2 * cost.prefill_seconds(lane.computed, remaining) > timeout_s / 2:
            continue
        if best is None or target.position > best[0]:
            best = (target.position, lane, target)
    if best is None:
        return False
    t, lane, target = best
    if target.plant and (t, True) not in lane.taps:
        lane.taps = sorted([*(tap for tap in lane.taps if tap[0] != t), (t, True)])
        lane.boundary_taps.add(t)
    return True
