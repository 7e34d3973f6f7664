"""Prefetching the blocked FIFO head (design §6.6): copy up to 256 of the Host-only path blocks
its quote would restore into spare Device pages while it waits.

Room comes from free pages and from Host-backed cached blocks, least recently used first: a
prefetch never drops a block's last copy, never evicts the head's own path, and never waits.
The prefetched blocks are ordinary cached blocks: Filling (pinned) until the batch lands, then
at the MRU end of the Device LRU.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import NamedTuple

from ninfer.cache.common import Residency, StaleQuoteError
from ninfer.cache.device_lru import DeviceEntry, EntryKind
from ninfer.cache.part import IndexPart
from ninfer.cache.records import BlockCopy, Quote, RestoreBatch, TransferRecord
from ninfer.page import PAGE_SIZE

_ABSENT, _FILLING = Residency.ABSENT, Residency.FILLING


class PrefetchPlan(NamedTuple):
    evicted_pages: list[int]  # free these first
    nodes: list[int]  # Host-only path blocks to copy, block order; allocate len(nodes) pages


class Prefetch(IndexPart):
    """prefetch_room, plan_prefetch and begin_prefetch of the PrefixIndex."""

    def prefetch_room(self) -> int:
        """Pages a prefetch could use besides the free ones: Host-backed evictable entries."""
        return len(self.blocks.lru.backed)

    def plan_prefetch(self, quote: Quote, free_pages: int, max_blocks: int) -> PrefetchPlan:
        """Choose the head's Host-only path blocks (up to the frontier of the cheapest source
        the quote considered) and make room for them by evicting only Host-backed entries
        outside the head's path.

        Raises StaleQuoteError when the cache changed since `quote`. Mutates: evictions only.
        """
        if quote.epoch != self.registry.epoch:
            raise StaleQuoteError(f"quote epoch {quote.epoch}, cache epoch {self.registry.epoch}")
        self.registry.mutated()
        nodes = self.blocks.tree.nodes
        # the source admission would choose if room allowed (a blocked quote picks the root)
        best = min(quote.considered, key=lambda o: (o.cost_s, o.restore_bytes))
        path = quote.match.path[: best.frontier // PAGE_SIZE]
        todo = [nid for nid in path if nodes[nid].device_state == _ABSENT][:max_blocks]
        keep = {DeviceEntry(EntryKind.NODE, nid) for nid in quote.match.path}
        room = free_pages
        # Each drop removes exactly one backed entry (a backed copy is never the last), so the
        # loop reads at most the drops it needs plus the path's entries: O(path), not O(LRU).
        scan = max(0, len(todo) - room) + len(keep)
        for entry in list(islice(self.blocks.lru.backed, scan)):
            if room >= len(todo):
                break
            if entry in keep:
                continue
            if entry.kind == EntryKind.NODE:
                self.liveness.drop_node_device(nodes[entry.id])
            else:
                self.liveness.drop_tail_device(self.snapshots.by_id[entry.id])
            room += 1
        return PrefetchPlan(self.blocks.take_freed(), todo[: max(0, room)])

    def begin_prefetch(self, nodes: Sequence[int], pages: Sequence[int]) -> RestoreBatch | None:
        """Make `nodes` (from plan_prefetch, still Host-only) Device Filling into `pages`; the
        batch pins them until on_restore_landed. ValueError on a length mismatch."""
        if len(nodes) != len(pages):
            raise ValueError(f"{len(nodes)} nodes but {len(pages)} pages")
        if not nodes:
            return None
        self.registry.mutated()
        batch = TransferRecord("restore")
        blocks = []
        for nid, page in zip(nodes, pages, strict=True):
            node = self.blocks.tree.nodes[nid]
            if node.device_state != _ABSENT:
                raise ValueError(f"node {nid} is not Host-only")
            self.blocks.set_device_copy(node, page, _FILLING)
            node.restore_pins += 1
            self.blocks.node_changed(node)
            batch.nodes.append(nid)
            blocks.append(BlockCopy(nid, page, node.host_slab))
        nbytes = len(blocks) * self.config.slab_bytes
        self.registry.counters.prefetched_blocks += len(blocks)
        self.registry.counters.restored_host_bytes += nbytes
        return RestoreBatch(self.registry.new_batch(batch), blocks, None, None, nbytes)
