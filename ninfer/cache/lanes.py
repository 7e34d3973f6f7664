"""The lane lifecycle of the PrefixIndex: stage -> (begin_restore) -> activate -> commits and
snapshots -> release, or stage -> cancel_stage (design §6.4, §7.4, §7.6, §7.7).

A lane pins its path (active_refs) from stage until release; the source snapshot is pinned
from stage until activate; transfers pin what they read or write until they land.
"""

from __future__ import annotations

from collections.abc import Sequence

from ninfer.cache.common import (
    PAGE_SIZE,
    LaneError,
    Residency,
    StaleQuoteError,
)
from ninfer.cache.device_lru import DeviceEntry, EntryKind
from ninfer.cache.part import IndexPart
from ninfer.cache.records import (
    BlockCopy,
    BlockWriteBatch,
    ImageCopy,
    LaneRecord,
    Quote,
    Readiness,
    ReleaseResult,
    RestoreBatch,
    Staged,
    TailCopy,
    TransferRecord,
)
from ninfer.cache.snapshots import Snapshot

_ABSENT, _RESIDENT, _FILLING = Residency.ABSENT, Residency.RESIDENT, Residency.FILLING


class LaneLifecycle(IndexPart):
    """stage, begin_restore, activate, cancel_stage and release of the PrefixIndex."""

    # ---- admission transaction (§6.4) ------------------------------------------------------

    def stage(self, quote: Quote, lane: int, free_pages: int) -> Staged:
        """Open `lane` on the quoted source: pin its path and snapshot, evict for capacity.

        Raises StaleQuoteError (epoch moved: quote again), LaneError (lane already open),
        ValueError (quote not READY). The memory layer frees `evicted_pages`, then allocates
        `restore_pages_needed` pages for begin_restore.
        """
        self._check_stageable(quote, lane)
        t = self.registry.mutated()
        f = quote.frontier
        snaps = self.snapshots.by_id
        s = None if quote.source is None else snaps[quote.source]
        rec = LaneRecord(
            lane,
            list(quote.match.path[: f // PAGE_SIZE]),
            f,
            quote.source,
            None if s is None else s.kind,
            [snaps[sid].frontier for sid in quote.match.candidates],
            latest_frontier=f,
        )
        self._pin_path(rec, quote.match.path, t)
        tier = self._count_hit(rec, s, t, host=bool(quote.restore_bytes))
        self.registry.lanes[lane] = rec
        deficit = quote.need_pages - free_pages
        if deficit > 0:
            self.liveness.evict(deficit)
        return self._staged(rec, s, tier)

    def _check_stageable(self, quote: Quote, lane: int) -> None:
        """stage's refusals, before anything changes."""
        if quote.epoch != self.registry.epoch:
            raise StaleQuoteError(f"quote epoch {quote.epoch}, cache epoch {self.registry.epoch}")
        if lane in self.registry.lanes:
            raise LaneError(f"lane {lane} is already open")
        if quote.readiness != Readiness.READY:
            raise ValueError(f"cannot stage a {quote.readiness.name} quote")

    def _pin_path(self, rec: LaneRecord, path: Sequence[int], t: int) -> None:
        """Pin the lane's share of the matched path and touch the rest:

        matched path  N_0 ... N_{a-1} | N_a ... N_{k-1}
                      pinned (shared)  | recomputed: touched only (MRU), committed later
        """
        nodes = self.blocks.tree.nodes
        for nid in rec.path:
            node = nodes[nid]
            node.active_refs += 1
            node.last_access = t
            self.blocks.node_changed(node)
        # a hit moves the whole path to MRU, deepest first
        for nid in reversed(path[len(rec.path) :]):
            nodes[nid].last_access = t
            self.blocks.touch(nid)

    def _count_hit(self, rec: LaneRecord, s: Snapshot | None, t: int, host: bool) -> str:
        """Count the lookup and pin the source snapshot `s` for the lane until activate; the
        tier the hit came from: "root" (no snapshot), "host" (`host`: bytes to restore) or
        "device"."""
        st = self.registry.counters
        st.lookups += 1
        st.reuse_tokens += rec.base
        if s is None:
            st.hits_root += 1
            return "root"
        tier = "host" if host else "device"
        st.hits_host += tier == "host"
        st.hits_device += tier == "device"
        s.restore_pins += 1
        rec.source_pinned = True
        s.hits += 1
        s.l_at = self.host_tier.L
        s.last_hit = t
        self.liveness.retain(s)  # a hit on a superseded snapshot retains it again (§9.3)
        self.host_tier.mark(s.id)
        self.blocks.tail_changed(s)
        return tier

    def _staged(self, rec: LaneRecord, s: Snapshot | None, tier: str) -> Staged:
        """What stage tells the memory layer: pages freed, pages to allocate for the restore,
        and where the source's Device copy lies."""
        nodes = self.blocks.tree.nodes
        restore = sum(nodes[nid].device_state == _ABSENT for nid in rec.path)
        restore += bool(s is not None and s.tail and s.tail_device == _ABSENT)
        image = s is not None and s.device_state == _ABSENT
        rec.restore_required = bool(restore or image)
        return Staged(
            lane=rec.id,
            source=rec.source,
            frontier=rec.base,
            path=list(rec.path),
            evicted_pages=self.blocks.take_freed(),
            restore_pages_needed=restore,
            source_slot=-1 if s is None or s.device_state != _RESIDENT else s.device_slot,
            source_tail_page=-1 if s is None or s.tail_device != _RESIDENT else s.tail_page,
            hit_tier=tier,
            restore_image=image,
        )

    def begin_restore(self, lane: int, pages: Sequence[int]) -> RestoreBatch | None:
        """Mark the staged lane's Host-only path blocks (and tail) Filling into `pages`.

        Needs exactly `restore_pages_needed` pages (ValueError otherwise). The batch pins what
        it writes and the snapshot it reads until on_restore_landed. None if nothing is
        Host-only.
        """
        rec = self.registry.lane(lane, activated=False)
        nodes = self.blocks.tree.nodes
        todo = [nodes[nid] for nid in rec.path if nodes[nid].device_state == _ABSENT]
        s = None if rec.source is None else self.snapshots.by_id[rec.source]
        tail = s is not None and bool(s.tail) and s.tail_device == _ABSENT
        image = s is not None and s.device_state == _ABSENT
        if len(pages) != len(todo) + tail:
            raise ValueError(f"begin_restore needs {len(todo) + tail} pages, got {len(pages)}")
        rec.restore_required = False
        if not todo and not tail and not image:
            return None
        self.registry.mutated()
        slab = self.config.slab_bytes
        batch = TransferRecord("restore", lane=lane)
        blocks = []
        for node, page in zip(todo, pages, strict=False):
            self.blocks.set_device_copy(node, page, _FILLING)
            node.restore_pins += 1
            self.blocks.node_changed(node)
            batch.nodes.append(node.id)
            blocks.append(BlockCopy(node.id, page, node.host_slab))
        tail_copy = image_copy = None
        if tail or image:
            batch.snapshot, batch.tail = s.id, tail
            s.restore_pins += 1
        if tail:
            self.snapshots.set_tail_device(s, pages[-1], _FILLING)
            tail_copy = TailCopy(s.id, s.tail_page, s.tail_slab)
        if image:
            image_copy = ImageCopy(s.id, list(s.host_slabs))
        nbytes = (len(blocks) + tail) * slab + image * self.config.image_bytes
        bid = self.registry.new_batch(batch)
        rec.restore_batch = bid
        self.registry.counters.restores += 1
        self.registry.counters.restored_host_bytes += nbytes
        return RestoreBatch(bid, blocks, tail_copy, image_copy, nbytes)

    def activate(self, lane: int) -> None:
        """The lane starts (its state was copied or is being restored): drop the stage's
        snapshot pin. Raises LaneError if Host-only parts were never given to begin_restore."""
        rec = self.registry.lane(lane, activated=False)
        if rec.restore_required:
            raise LaneError(f"lane {lane} has Host-only parts: call begin_restore first")
        self.registry.mutated()
        rec.activated = True
        self._unpin_source(rec)

    def _unpin_source(self, rec: LaneRecord) -> None:
        if rec.source_pinned:
            s = self.snapshots.by_id[rec.source]
            s.restore_pins -= 1
            rec.source_pinned = False
            self.blocks.tail_changed(s)

    def cancel_stage(self, lane: int) -> list[int]:
        """Undo stage before activate. A begun restore must have landed (LaneError
        otherwise): restored pages stay cached. Returns pages freed (normally none)."""
        rec = self.registry.lane(lane, activated=False)
        if rec.restore_batch is not None:
            raise LaneError(f"lane {lane}: restore batch {rec.restore_batch} has not landed")
        self.registry.mutated()
        self._unpin_source(rec)
        for slot in rec.staging:
            self.snapshots.release_slot(slot)
        for nid in reversed(rec.path):
            node = self.blocks.tree.nodes[nid]
            node.active_refs -= 1
            self.blocks.node_changed(node)
        del self.registry.lanes[lane]
        return self.blocks.take_freed()

    # ---- release (§7.6 write-through, §7.7 step 2) -----------------------------------------

    def release(self, lane: int) -> ReleaseResult:
        """Unpin the lane's path; Device-only nodes get Host slabs (evicting as §9.3 orders)
        and stay pinned until on_write_through_landed; the others enter the Device LRU in
        reverse block order. Frees staging slots the lane still holds."""
        rec = self.registry.lane(lane)
        t = self.registry.mutated()
        for slot in rec.staging:
            self.snapshots.release_slot(slot)
        rec.staging.clear()
        nodes = self.blocks.tree.nodes
        blocks: list[BlockCopy] = []
        if self.host_tier.pool is not None:
            # Allocate while the path is still pinned, so eviction cannot touch it.
            for nid in rec.path:
                node = nodes[nid]
                if node.device_state != _RESIDENT or node.host_state != _ABSENT:
                    continue
                slabs = self.liveness.host_alloc(1)
                if slabs is None:
                    break  # Host full of pinned or more valuable data: stays unbacked
                self.blocks.set_host_copy(node, slabs[0], _FILLING)
                node.restore_pins += 1
                if node.retained_below == 1:
                    self.host_tier.mark(node.retained_xor)
                blocks.append(BlockCopy(nid, node.device_page, slabs[0]))
        added = []
        for nid in reversed(rec.path):
            node = nodes[nid]
            node.active_refs -= 1
            node.last_access = t
            self.blocks.node_changed(node)
            if DeviceEntry(EntryKind.NODE, nid) in self.blocks.lru:
                added.append(nid)
        del self.registry.lanes[lane]
        write = None
        if blocks:
            bid = self.registry.new_batch(TransferRecord("blocks", nodes=[b.node for b in blocks]))
            nbytes = len(blocks) * self.config.slab_bytes
            self.registry.counters.write_through_bytes += nbytes
            write = BlockWriteBatch(bid, blocks, nbytes)
        return ReleaseResult(write, added, self.blocks.take_freed())
