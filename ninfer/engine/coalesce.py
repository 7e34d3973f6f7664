"""In-flight prefix coalescing (spec §12.2): a FIFO head that shares a prefix with a lane still
prefilling waits for that lane's snapshot at the divergence instead of prefilling it again.

Only reachable with `concurrent_prefill` (otherwise no lane prefills when the head is quoted).
Prefix sharing is estimated from the chained block hashes (a hash match implies the whole
prefix matches, up to collisions); the cache verifies tokens exactly when the head is admitted,
so an estimate can only cost a wait, never a wrong resume.

    head      |=============== shared ===============|--- head's own ---|
    sibling   |=============== shared ===============|--- sibling's ----|
              0                 F (cache now)        d                 t = floor64(min(d, n-1))
    the head waits (holding no pins) while sibling.computed < t; the sibling gets an exact tap
    at t (published as a Boundary snapshot), and the head resumes there once it is published.
"""

from __future__ import annotations

from ninfer.engine.lane import Job, Lane
from ninfer.models.batch import PAGE_SIZE


def _shared_blocks(a: list[int], b: list[int]) -> int:
    k = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        k += 1
    return k


def wait_for_sibling(job: Job, frontier: int, lanes: list[Lane], min_gain: int) -> bool:
    """True when the head should wait for a prefilling sibling; plants the sibling's tap.

    Waits only when the snapshot would save more than `min_gain` prefill tokens over what the
    cache serves now (`frontier`). Mutates the chosen sibling's planned taps.
    """
    n = len(job.prompt)
    best: tuple[int, Lane] | None = None
    for lane in lanes:
        if not lane.prefilling or lane.job.blocks is None:
            continue
        d = _shared_blocks(job.blocks.hashes, lane.job.blocks.hashes) * PAGE_SIZE
        t = min(d, n - 1, lane.prompt_len - 1)
        t -= t % PAGE_SIZE
        if t - frontier <= min_gain or lane.computed >= t or t <= lane.last_snapshot:
            continue
        if best is None or t > best[0]:
            best = (t, lane)
    if best is None:
        return False
    t, lane = best
    if (t, True) not in lane.taps:
        lane.taps = sorted([*(tap for tap in lane.taps if tap[0] != t), (t, True)])
        lane.boundary_taps.add(t)
    return True
