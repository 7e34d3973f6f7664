"""Device page accounting of active lanes: entitlements, growth, suspension (§6.3, §9.5).

A lane is admitted with an entitlement: the pages it may take without a further check, i.e.
its remaining prompt plus a bounded output window (and one page for a COW'd tail). The sum of
the entitlements not yet drawn is `reserved`; admission of a new lane needs

    need(new) <= free + evictable - reserved          (evictable: unpinned Device cache pages)

so every active lane can always draw its entitlement (cached pages never count against it:
taking a page may evict cache, never an active lane). `evictable` is exactly what eviction can
free (`PrefixIndex.evictable_pages`), and the index's quote checks this same rule (`quote`
passes free - reserved unclamped). Beyond its entitlement a lane grows one page at a time while
`free + evictable - reserved > 0`. When that fails the engine suspends the lane instead of
cutting it short: it is released through its endpoint snapshot and resumes from there, with
everything it generated, when pages allow (stepper.py `Stepper._suspend`). A request therefore ends
"length" only at max_tokens or the model length (`resolve()` makes the pool hold one
max-length request).

Mutates: the lane's `pages` / `private` / `entitled_pages`, the KV pool's free list, and (via
`evict`) the prefix index's Device LRU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ninfer.cache.records import QuoteParams
from ninfer.engine.kv.lane import KVLane
from ninfer.memory.kv_pool import KVPool
from ninfer.page import PAGE_SIZE

if TYPE_CHECKING:
    from ninfer.cache.index import PrefixIndex
    from ninfer.engine.request import Request

OUTPUT_WINDOW = 512  # tokens of output an admission reserves pages for


def pages_for(tokens: int) -> int:
    return -(-tokens // PAGE_SIZE)


class PageBudget:
    """Page reservations of the active lanes over the KV pool plus the cache's evictable pages.

    `index` is the prefix index (None when prefix reuse is off: nothing is evictable).
    """

    def __init__(self, pool: KVPool, index: PrefixIndex | None, max_model_len: int) -> None:
        self.pool = pool
        self.index = index
        self.max_model_len = max_model_len
        self.reserved = 0

    def evictable(self) -> int:
        """Unpinned Device cache pages: what `evict` can free. Reads only."""
        return 0 if self.index is None else self.index.evictable_pages()

    def evict(self, n: int) -> None:
        """Drop at least n evictable pages from the cache (Device LRU order) and return their
        page ids to the pool."""
        if self.index is None:
            raise RuntimeError("no cache to evict from")
        self.pool.free(self.index.evict_device_pages(n))

    def entitlement(self, prompt_len: int, max_tokens: int, mapped_pages: int) -> int:
        """Private pages a lane resuming with `mapped_pages` shared pages is entitled to."""
        total = min(prompt_len + min(max_tokens, OUTPUT_WINDOW), self.max_model_len)
        return max(pages_for(total) - mapped_pages, 1)

    def quote(self, job: Request) -> QuoteParams:
        """What `job` asks of the Device pool now: its whole entitlement, the free pages less the
        active lanes' reservations and the pool size (admission and the prefetcher quote alike).

        Not clamped at 0: the index's quote then checks the rule above,
        need <= free + evictable - reserved, so an admitted lane can always draw its entitlement.
        Reads only."""
        entitlement = self.entitlement(len(job.tokens), job.tokens_left(), 0)
        return QuoteParams(entitlement, self.pool.num_free - self.reserved, self.pool.num_pages)

    def headroom(self) -> int:
        """Pages a new admission or an over-entitlement growth may take."""
        return self.pool.num_free + self.evictable() - self.reserved

    def take(self, n: int) -> list[int] | None:
        """Take n pages from the pool, evicting Device cache as needed; None (nothing taken)
        if eviction comes up short (an unbacked entry whose subtree is pinned cannot go)."""
        short = n - self.pool.num_free
        if short > 0:
            self.evict(short)
        if self.pool.num_free < n:
            return None
        return self.pool.alloc(n)

    def reserve(self, lane: KVLane, pages: int) -> None:
        lane.entitled_pages += pages
        self.reserved += pages

    def unreserve(self, lane: KVLane) -> None:
        self.reserved -= lane.entitled_pages
        lane.entitled_pages = 0

    def grow_entitled(self, lane: KVLane, upto: int) -> bool:
        """`grow` for pages that only speed the lane up: from its own entitlement and the free
        pages only (no eviction, nothing another lane or admission could claim). Returns
        False, mapping nothing, where those do not cover [0, upto)."""
        need = pages_for(upto) - len(lane.pages)
        if need <= 0:
            return True
        if need > lane.entitled_pages or need > self.pool.num_free:
            return False
        self._map(lane, self.pool.alloc(need), need)
        return True

    def grow(self, lane: KVLane, upto: int) -> bool:
        """Map pages so that `lane.pages` covers positions [0, upto). Returns False (mapping
        nothing new) when the pool cannot extend the lane: the engine suspends it."""
        need = pages_for(upto) - len(lane.pages)
        if need <= 0:
            return True
        from_entitlement = min(need, lane.entitled_pages)
        extra = need - from_entitlement
        if extra > 0 and self.headroom() < extra:
            return False
        pages = self.take(need)
        if pages is None:
            return False
        self._map(lane, pages, from_entitlement)
        return True

    def _map(self, lane: KVLane, pages: list[int], from_entitlement: int) -> None:
        """Append `pages` to the lane as its private pages, `from_entitlement` of them drawn
        from its entitlement (and so from the reservations)."""
        lane.entitled_pages -= from_entitlement
        self.reserved -= from_entitlement
        lane.pages.extend(pages)
        lane.private.extend([True] * len(pages))
