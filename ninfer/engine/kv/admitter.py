"""Admission as a transaction against the prefix index (design §6.4): quote, stage, activate.

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

The Admitter builds lanes; it does not wait for a prefetch in flight (the owner, `KVState`,
settles it before asking), release lanes or publish anything (`Publisher`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ninfer.cache.common import SnapshotKind
from ninfer.cache.records import QuoteParams, Readiness
from ninfer.cache.taps import HintKind, Placement, TapHint
from ninfer.engine.kv.coalesce import wait_for_sibling
from ninfer.engine.kv.counters import EngineCounters
from ninfer.engine.kv.lane import KVLane
from ninfer.engine.kv.pages import PageBudget
from ninfer.memory.kv_pool import KVPool
from ninfer.memory.state_pool import StatePool
from ninfer.memory.transfer import Transfer
from ninfer.page import PAGE_SIZE

if TYPE_CHECKING:
    from ninfer.cache.index import PrefixIndex
    from ninfer.engine.request import Request

FORK_MIN_TOKENS = PAGE_SIZE  # cached prefix past the resume frontier that proves a fork


@dataclass(slots=True)
class Verdict:
    """lane: admitted; error: failed (PermanentlyInfeasible); neither: TemporarilyBlocked."""

    lane: KVLane | None = None
    error: str | None = None


class Admitter:
    """Admission of the FIFO head (engine thread only). `index` is None when prefix reuse is
    off; `transfer` issues Host restores; `counters` is the owner's EngineCounters;
    `lane_ids` hands out the index's lane handles."""

    def __init__(
        self,
        index: PrefixIndex | None,
        kv: KVPool,
        states: StatePool,
        budget: PageBudget,
        transfer: Transfer,
        counters: EngineCounters,
        lane_ids: Iterator[int],
        pending_timeout_s: float,
    ) -> None:
        self.index = index
        self.kv = kv
        self.states = states
        self.budget = budget
        self.transfer = transfer
        self.counters = counters
        self.lane_ids = lane_ids
        self.pending_timeout_s = pending_timeout_s

    def try_admit(self, job: Request, lanes: list[KVLane]) -> Verdict:
        """Quote, stage and activate the FIFO head, or report why not. A free active state
        slot is guaranteed by the scheduler (fewer lanes than max_concurrency). `lanes` are the
        active lanes, for in-flight coalescing (§12.2). Raises HostRestoreFault (host_faults.py)
        when the Host restore it begins raises."""
        params = self.budget.quote(job)
        if self.index is None:
            entitlement = params.entitlement_pages
            if entitlement > params.total_pages:
                return Verdict(error=self._infeasible(job, entitlement))
            if entitlement > params.free_pages:
                return Verdict()
            lane = self._new_lane(job, self.states.acquire())
            self.budget.reserve(lane, entitlement)
            return Verdict(lane=lane)
        return self._admit_cached(job, params, lanes)

    def _infeasible(self, job: Request, need: int) -> str:
        pages = self.kv.num_pages
        return (
            f"kv_capacity: the request needs {need} KV pages ({len(job.tokens)} prompt "
            f"tokens plus its output window) but the pool holds {pages} pages "
            f"({pages * PAGE_SIZE} tokens); raise kv_capacity or shorten the request"
        )

    def _new_lane(self, job: Request, slot: int) -> KVLane:
        """The lane prefills every token the request knows: a suspended request resumes with
        what it generated."""
        return KVLane(job, next(self.lane_ids), slot, prompt_len=len(job.tokens), computed=0)

    def _admit_cached(self, job: Request, params: QuoteParams, lanes: list[KVLane]):
        index, kv = self.index, self.kv
        quote = index.quote(job.blocks, params)
        if quote.readiness == Readiness.PERMANENTLY_INFEASIBLE:
            return Verdict(error=self._infeasible(job, quote.need_pages))
        if quote.readiness != Readiness.READY:
            return Verdict()
        resumed = job.suspensions > 0  # a suspended request never waits for a sibling
        if not resumed and wait_for_sibling(
            job, quote.frontier, lanes, index.cost, self.pending_timeout_s
        ):
            if not job.coalesced:
                job.coalesced = True
                self.counters.coalesced_waits += 1
            return Verdict()
        lane = self._new_lane(job, self.states.acquire())
        staged = index.stage(quote, lane.lane_id, params.free_pages)
        kv.free(staged.evicted_pages)
        tail_src = staged.source_tail_page
        if staged.hit_tier == "host":
            pages = kv.alloc(staged.restore_pages_needed)
            batch = index.begin_restore(lane.lane_id, pages)
            if batch is not None:
                # Never waited for here: the lane's first pass waits per layer (§6.5).
                lane.restore_ticket = self.transfer.restore(batch, lane.slot)
                job.usage.restore_timing = lane.restore_ticket
                job.usage.restored_host_bytes += batch.bytes
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
        if not resumed:  # usage reports the first admission's figures
            job.usage.cached_tokens = f
            job.usage.cached_prefix_tokens = quote.cached_prefix_tokens
        lane.last_snapshot = f
        if staged.source is not None:
            if staged.source_slot >= 0:
                self.states.resume(staged.source_slot, lane.slot)
            if r:
                tail = kv.alloc(1)[0]  # counted in the quote's need (the COW page)
                kv.copy_prefix(tail_src, tail, r)
                lane.pages.append(tail)
                lane.private.append(True)
            lane.resumed_endpoint = index.snapshot(staged.source).kind == SnapshotKind.ENDPOINT
        index.activate(lane.lane_id)
        self.budget.reserve(lane, max(params.entitlement_pages - len(lane.pages), 0))
        self._plan_taps(lane)
        return Verdict(lane=lane)

    def _plan_taps(self, lane: KVLane) -> None:
        h = lane.request.hints
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
        blocks = lane.request.blocks
        taps = self.index.plan_taps(
            lane.lane_id, lane.prompt_len, hints, blocks.vision_spans if blocks else (),
            resumed_from_endpoint=lane.resumed_endpoint,
        )  # fmt: skip
        lane.taps = [(t.position, t.placement == Placement.EXACT) for t in taps]
        lane.boundary_taps = {t.position for t in taps if t.boundary}
