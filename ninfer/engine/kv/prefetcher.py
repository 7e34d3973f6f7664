"""Prefetching the blocked FIFO head's Host-only path into spare Device pages (design §6.6).

While the head waits (for a lane, for pages, or for a coalescing sibling), the engine asks
`Prefetcher.maybe_prefetch(head)` once per step. It quotes the head as admission would, lets
the index pick the cheapest source's Host-only path blocks (`plan_prefetch`, at most 256) and
copies them on the restore stream into pages taken from the free list and from Host-backed
cached blocks (never a last copy, never the head's own path). The blocks are Filling (pinned)
until the batch lands, then ordinary cached blocks at the MRU end of the Device LRU; admission
later finds them Device-resident and restores only the rest.

Rules (invariants):
  - at most one prefetch batch in flight, and none while an admission is open (staged, not
    activated: the index has a lane that is not activated);
  - a prefetch takes at most `spare_room()` = min(headroom, free + Host-backed evictable)
    pages, so every active lane's reserved entitlement stays coverable while it is Filling
    (reserved <= free + evictable holds throughout);
  - the same head is retried only while the previous attempt copied blocks or the spare room
    grew (matching walks the whole prompt path);
  - `settle()` waits for an in-flight batch before the next admission quote, so the quote sees
    the blocks Device-resident instead of skipping Filling candidates (settle_prefetch); the
    owner (`KVState`) then reports what landed to the index and calls `landed()`.

The Prefetcher takes pages only through the index's prefetch plan and the free list; it never
admits, and it never waits for a copy except in `settle()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ninfer.cache.records import Readiness
from ninfer.engine.kv.pages import PageBudget
from ninfer.memory.kv_pool import KVPool
from ninfer.memory.transfer import Transfer

if TYPE_CHECKING:
    from ninfer.cache.index import PrefixIndex
    from ninfer.engine.request import Request

MAX_PREFETCH_BLOCKS = 256  # one batch (design §6.6: ~550 MB for 27B INT8 KV)


@dataclass(slots=True, frozen=True)
class _Attempt:
    request_id: str
    copied: int  # blocks the attempt copied
    room: int  # spare room it saw


class Prefetcher:
    """Prefetch state of one engine (engine thread only). `batches`: batches issued. `index`
    is None when prefix reuse is off (then it never prefetches)."""

    def __init__(
        self, index: PrefixIndex | None, kv: KVPool, budget: PageBudget, transfer: Transfer
    ) -> None:
        self.index = index
        self.kv = kv
        self.budget = budget
        self.transfer = transfer
        self.batch_id: int | None = None  # the in-flight batch, until poll() reports it
        self.ticket: Any = None
        self.batches = 0
        self._last: _Attempt | None = None

    def enabled(self) -> bool:
        return self.index is not None and self.index.host is not None

    def spare_room(self) -> int:
        """Pages a prefetch may fill now without touching any lane's reservation."""
        return max(0, min(self.budget.headroom(), self.kv.num_free + self.index.prefetch_room()))

    def maybe_prefetch(self, job: Request) -> int:
        """Prefetch for the blocked head `job` if the rules above allow; blocks copied."""
        if not self.enabled() or job.blocks is None or self.batch_id is not None:
            return 0
        if any(not rec.activated for rec in self.index.lanes.values()):
            return 0  # never beside an open admission
        room = self.spare_room()
        last = self._last
        same_head = last is not None and last.request_id == job.request_id
        if same_head and not last.copied and room <= last.room:
            return 0  # nothing copied last time and no more room: matching would be wasted
        copied = self._prefetch(job, room) if room > 0 else 0
        self._last = _Attempt(job.request_id, copied, room)
        return copied

    def _prefetch(self, job: Request, room: int) -> int:
        index, kv = self.index, self.kv
        quote = index.quote(job.blocks, self.budget.quote(job))
        if quote.readiness == Readiness.PERMANENTLY_INFEASIBLE:
            return 0
        plan = index.plan_prefetch(quote, kv.num_free, max_blocks=min(MAX_PREFETCH_BLOCKS, room))
        kv.free(plan.evicted_pages)
        if not plan.nodes:
            return 0
        pages = kv.alloc(len(plan.nodes))
        batch = index.begin_prefetch(plan.nodes, pages)
        self.ticket = self.transfer.restore(batch, -1)  # no image: the slot is unused
        self.batch_id = batch.batch_id
        self.batches += 1
        return len(plan.nodes)

    def landed(self, batch_id: int) -> None:
        """The owner's poll saw restore batch `batch_id` land."""
        if batch_id == self.batch_id:
            self.batch_id, self.ticket = None, None

    def settle(self) -> bool:
        """Wait for the in-flight batch, if any (before a quote). True when one was waited for:
        the caller then polls the transfer so that the index sees it landed."""
        if self.batch_id is None:
            return False
        self.ticket.synchronize()
        return True
