"""Admission as a transaction against the prefix index (spec §6.4): quote, stage, activate.

    quote     read-only: source snapshot (or root), frontier F_s, pages needed, readiness
    stage     pins the path up to F_s and the source, evicts Device LRU pages for the need
    restore   Host-only parts are copied by the Transfer seam (never waited for here)
    activate  the lane is built at once: shared path pages, a private COW of a partial tail,
              the state D2D-copied from the source's slot (or reset, from the root)

Lane block table after activation (a = F_s // 64, r = F_s % 64):

    positions  0          64a      F_s                 n          n + output window
               |-- path --|- tail -|--- prompt rest ---|-- growth -->|
    pages      shared (a) | private COW page (iff r)   | private, drawn from the entitlement
               index-owned, pinned by the lane

TemporarilyBlocked leaves everything untouched (the FIFO head waits); PermanentlyInfeasible
fails the request with a message naming the cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ninfer.cache.common import SnapshotKind
from ninfer.cache.records import QuoteParams, Readiness
from ninfer.cache.taps import HintKind, Placement, TapHint
from ninfer.engine.coalesce import wait_for_sibling
from ninfer.engine.lane import Job, Lane
from ninfer.forward import PAGE_SIZE

if TYPE_CHECKING:
    from ninfer.engine.cache_bridge import CacheBridge

FORK_MIN_TOKENS = PAGE_SIZE  # cached prefix past the resume frontier that proves a fork


@dataclass(slots=True)
class Verdict:
    """lane: admitted; error: failed (PermanentlyInfeasible); neither: TemporarilyBlocked."""

    lane: Lane | None = None
    error: str | None = None


def _infeasible(bridge: CacheBridge, job: Job, need: int) -> str:
    return (
        f"kv_capacity: the request needs {need} KV pages ({len(job.known_tokens())} prompt "
        f"tokens plus its output window) but the pool holds {bridge.kv.num_pages} pages "
        f"({bridge.kv.num_pages * PAGE_SIZE} tokens); raise kv_capacity or shorten the request"
    )


def _new_lane(bridge: CacheBridge, job: Job, now: float, slot: int) -> Lane:
    known = job.known_tokens()  # a suspended request resumes with what it generated
    return Lane(
        job=job,
        lane_id=bridge.next_lane_id(),
        slot=slot,
        tokens=list(known),
        prompt_len=len(known),
        computed=0,
        t_admit=now,
        gen_start=len(job.prompt),
    )


def quote_params(bridge: CacheBridge, job: Job) -> QuoteParams:
    """What `job` asks of the Device pool now: its whole entitlement, the free pages less the
    active lanes' reservations and the pool size (admission and the prefetcher quote alike).

    Not clamped at 0: the quote then checks the engine's own rule (pages.py),
    need <= free + evictable - reserved, so an admitted lane can always draw its entitlement."""
    budget, kv = bridge.budget, bridge.kv
    entitlement = budget.entitlement(len(job.known_tokens()), job.tokens_left(), 0)
    return QuoteParams(entitlement, kv.num_free - budget.reserved, kv.num_pages)


def try_admit(bridge: CacheBridge, job: Job, now: float, lanes: list[Lane]) -> Verdict:
    """Quote, stage and activate the FIFO head, or report why not. A free active state slot is
    guaranteed by the scheduler (fewer lanes than max_concurrency). `lanes` are the active
    lanes, for in-flight coalescing (§12.2)."""
    params = quote_params(bridge, job)
    if bridge.index is None:
        entitlement = params.entitlement_pages
        if entitlement > params.total_pages:
            return Verdict(error=_infeasible(bridge, job, entitlement))
        if entitlement > params.free_pages:
            return Verdict()
        lane = _new_lane(bridge, job, now, bridge.states.acquire())
        bridge.budget.reserve(lane, entitlement)
        return Verdict(lane=lane)
    return _admit_cached(bridge, job, now, params, lanes)


def _admit_cached(bridge, job: Job, now: float, params: QuoteParams, lanes: list[Lane]):
    index = bridge.index
    bridge.prefetcher.settle()  # a landing prefetch of this path must not be skipped (§6.6)
    quote = index.quote(job.blocks, params)
    if quote.readiness == Readiness.PERMANENTLY_INFEASIBLE:
        return Verdict(error=_infeasible(bridge, job, quote.need_pages))
    if quote.readiness != Readiness.READY:
        return Verdict()
    resumed = job.resume is not None  # a suspended request never waits for a sibling
    if not resumed and wait_for_sibling(
        job, quote.frontier, lanes, index.cost, bridge.cfg.pending_timeout_s
    ):
        if not job.coalesced:
            job.coalesced = True
            bridge.counters.coalesced_waits += 1
        return Verdict()
    lane = _new_lane(bridge, job, now, bridge.states.acquire())
    staged = index.stage(quote, lane.lane_id, params.free_pages)
    bridge.kv.free(staged.evicted_pages)
    tail_src = staged.source_tail_page
    if staged.hit_tier == "host":
        pages = bridge.kv.alloc(staged.restore_pages_needed)
        batch = index.begin_restore(lane.lane_id, pages)
        if batch is not None:
            # Never waited for here: the lane's first pass waits per layer (§6.5).
            lane.restore_ticket = bridge.transfer.restore(batch, lane.slot)
            lane.restore_timing = lane.restore_ticket
            lane.restored_host_bytes = batch.bytes
            if batch.tail is not None:
                lane.restore_ticket.wait_prelude()  # the tail COW below reads it
                tail_src = batch.tail.page
    f = staged.frontier
    a, r = divmod(f, PAGE_SIZE)
    lane.pages = [index.node(node).device_page for node in staged.path[:a]]
    lane.private = [False] * a
    lane.committed_blocks = a
    lane.computed = f
    lane.cached_tokens = f
    lane.cached_prefix_tokens = quote.cached_prefix_tokens
    lane.last_snapshot = f
    if staged.source is not None:
        if staged.source_slot >= 0:
            bridge.states.resume(staged.source_slot, lane.slot)
        if r:
            tail = bridge.kv.alloc(1)[0]  # counted in the quote's need (the COW page)
            bridge.kv.copy_prefix(tail_src, tail, r)
            lane.pages.append(tail)
            lane.private.append(True)
        lane.resumed_endpoint = index.snapshot(staged.source).kind == SnapshotKind.ENDPOINT
    index.activate(lane.lane_id)
    bridge.budget.reserve(lane, max(params.entitlement_pages - len(lane.pages), 0))
    _plan_taps(bridge, lane)
    return Verdict(lane=lane)


def _plan_taps(bridge: CacheBridge, lane: Lane) -> None:
    h = lane.job.hints
    hints = [TapHint(p, HintKind.EXPLICIT) for p in h.explicit]
    hints += [TapHint(p, HintKind.STRUCTURAL) for p in h.structural]
    hints += [TapHint(p, HintKind.MESSAGE) for p in h.message_starts]
    if h.opener is not None:
        hints.append(TapHint(h.opener, HintKind.OPENER))
    # A cached block prefix 64+ tokens past the resume frontier proves the prompt forks from
    # cached history at its end (a sub-agent, a fork, an edit): an exact Boundary tap there
    # serves the next sibling, as §12.2 plants one for a waiting sibling. It competes for the
    # max_new_taps budget like a client breakpoint.
    fork = lane.cached_prefix_tokens
    if fork - lane.cached_tokens >= FORK_MIN_TOKENS and fork < lane.prompt_len:
        hints.append(TapHint(fork, HintKind.EXPLICIT))
    taps = bridge.index.plan_taps(
        lane.lane_id, lane.prompt_len, hints, resumed_from_endpoint=lane.resumed_endpoint
    )
    lane.taps = [(t.position, t.placement == Placement.EXACT) for t in taps]
    lane.boundary_taps = {t.position for t in taps if t.boundary}
