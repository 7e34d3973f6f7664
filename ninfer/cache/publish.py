"""Publication into the cache (design §7.4, §7.6, §7.7): a lane's committed blocks become tree
nodes, its taps and endpoint become snapshots.

Deferral is the engine's: a snapshot is published only once the blocks it anchors on are
committed by the lane (a frontier inside a block also needs that block; an MTP backend commits
one token behind). The index checks it and raises LaneError otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

from ninfer.cache.common import (
    BLOCK_BYTES,
    PAGE_SIZE,
    ROOT,
    TOKEN_BYTES,
    LaneError,
    Residency,
    SnapshotKind,
)
from ninfer.cache.keys import block_hash, pack_tokens
from ninfer.cache.part import IndexPart
from ninfer.cache.records import (
    CommitKind,
    CommitResult,
    LaneRecord,
    PublishResult,
    SnapshotWrite,
    TransferRecord,
)
from ninfer.cache.snapshots import Snapshot

_ABSENT, _RESIDENT, _FILLING = Residency.ABSENT, Residency.RESIDENT, Residency.FILLING


class Publication(IndexPart):
    """commit_block, endpoint_worthwhile and publish_snapshot of the PrefixIndex."""

    # ---- block commit (§7.6) ---------------------------------------------------------------

    def commit_block(
        self,
        lane: int,
        block_index: int,
        tokens: Sequence[int] | bytes,
        page: int,
        extra: int,
        lookup_hash: int | None,
    ) -> CommitResult:
        """Publish the lane's committed block `block_index` (must equal its path length).

        INSERTED: a new node owns `page`. DUPLICATE: a node with a Device copy exists and `page`
        stays lane-private. ADOPTED: a Host-only node takes `page` as its Device copy. The node
        is pinned for the lane (active_refs += 1) in every case. Raises LaneError / ValueError.
        """
        rec = self.registry.lane(lane)
        if block_index != len(rec.path):
            raise LaneError(f"lane {lane} commits block {block_index}, expected {len(rec.path)}")
        data = pack_tokens(tokens)
        if len(data) != BLOCK_BYTES:
            raise ValueError(f"a block holds {PAGE_SIZE} tokens, got {len(data) // 4}")
        t = self.registry.mutated()
        nodes = self.blocks.tree.nodes
        parent = nodes[rec.path[-1]] if rec.path else self.blocks.tree.root
        h = block_hash(parent.lookup_hash, data, extra) if lookup_hash is None else lookup_hash
        node = self.blocks.tree.find_child(parent.id, h, data, extra)
        st = self.registry.counters
        if node is None:
            node = self.blocks.insert(parent.id, h, data, extra)
            self.blocks.set_device_copy(node, page, _RESIDENT)
            kind = CommitKind.INSERTED
            st.blocks_inserted += 1
            self.blocks.refresh_dead(parent)
        elif node.device_state == _ABSENT:
            self.blocks.set_device_copy(node, page, _RESIDENT)
            kind = CommitKind.ADOPTED
            st.blocks_adopted += 1
        else:
            kind = CommitKind.DUPLICATE
            st.blocks_duplicate += 1
        node.active_refs += 1
        node.last_access = t
        self.blocks.node_changed(node)
        rec.path.append(node.id)
        return CommitResult(kind, node.id)

    # ---- snapshots (§7.4, §7.7) ------------------------------------------------------------

    def endpoint_worthwhile(self, lane: int, frontier: int) -> bool:
        """§7.7: an endpoint at `frontier` is worth publishing only 64+ tokens past the deepest
        snapshot on the lane's path (its base, its own taps, snapshots met at stage). The lane's
        own PROMPT_END and OUTPUT snapshots do not count: they serve clients that drop or
        re-render the reply, the endpoint those that echo it, so a short reply (or the end of
        one past its last boundary) still leaves its endpoint."""
        rec = self.registry.lane(lane)
        deepest = max([rec.latest_frontier, *(f for f in rec.existing if f <= frontier)])
        return frontier - deepest >= PAGE_SIZE

    def has_snapshot(self, lane: int, frontier: int, tail_tokens: Sequence[int] | bytes) -> bool:
        """Whether a snapshot at `frontier` of the lane's committed path exists already (its
        anchor block committed; `tail_tokens` the frontier's partial block), so the engine need
        not stage a copy that publication would find a duplicate."""
        rec = self.registry.lane(lane)
        a = frontier // PAGE_SIZE
        if len(rec.path) < a:
            return False
        anchor = rec.path[a - 1] if a else ROOT
        return self.snapshots.find(anchor, pack_tokens(tail_tokens)) is not None

    def publish_snapshot(
        self,
        lane: int,
        frontier: int,
        slot: int,
        kind: SnapshotKind,
        tail_tokens: Sequence[int] | bytes,
        tail_page: int | None,
        finishing: bool,
    ) -> PublishResult:
        """Publish the image in staging `slot` as a snapshot at `frontier` of `lane`.

        The engine defers the call until the anchor blocks are committed (LaneError before);
        a tap with a tail also waits for the block holding it, unless the lane is `finishing`
        (§7.4: it publishes from its own last page, whose block never fills).
        On a duplicate (same anchor and tail) the index frees the slot and the engine keeps
        `tail_page`; otherwise the snapshot owns both and Host slabs are sought (GDSF-bounded).
        """
        rec = self.registry.lane(lane)
        tail = self._publishable(rec, frontier, slot, kind, tail_tokens, tail_page, finishing)
        kind = SnapshotKind(kind)
        t = self.registry.mutated()
        rec.staging.discard(slot)
        rec.superseded_for.pop(slot, None)
        a = frontier // PAGE_SIZE
        anchor = rec.path[a - 1] if a else ROOT
        if not kind.tail_known:  # the endpoint's 64-token rule looks past it
            rec.latest_frontier = max(rec.latest_frontier, frontier)
        dup = self.snapshots.find(anchor, tail)
        if dup is not None:  # §5.3: a duplicate is a no-op that refreshes recency
            return self._refresh_duplicate(rec, dup, slot, kind, t)
        s = Snapshot(
            self.snapshots.new_id(), anchor, a - 1, frontier, tail, kind,
            l_at=self.host_tier.L, last_hit=t,
        )  # fmt: skip
        self._add_snapshot(rec, s, slot, tail_page)
        write = None if self.host_tier.pool is None else self._write_through(s, slot)
        self.blocks.tail_changed(s)
        return PublishResult(s.id, False, write, self.blocks.take_freed())

    def _publishable(
        self,
        rec: LaneRecord,
        frontier: int,
        slot: int,
        kind: SnapshotKind,
        tail_tokens: Sequence[int] | bytes,
        tail_page: int | None,
        finishing: bool,
    ) -> bytes:
        """publish_snapshot's arguments checked against the lane (LaneError, ValueError); the
        packed tail tokens. Reads only."""
        if slot not in rec.staging:
            raise LaneError(f"slot {slot} is not staged by lane {rec.id}")
        a, tail_len = divmod(frontier, PAGE_SIZE)
        tail = pack_tokens(tail_tokens)
        if frontier <= 0 or len(tail) != tail_len * TOKEN_BYTES:
            raise ValueError(f"frontier {frontier} needs {tail_len} tail tokens")
        if (tail_page is None) != (tail_len == 0):
            raise ValueError("tail_page is required exactly when frontier % 64 != 0")
        committed = len(rec.path)
        early = SnapshotKind(kind).is_tap and not finishing
        if committed < a or (early and tail_len and committed <= a):
            raise LaneError(
                f"lane {rec.id} publishes F={frontier} with {committed} blocks committed"
            )
        nodes = self.blocks.tree.nodes
        if tail_len and committed > a and not nodes[rec.path[a]].tokens.startswith(tail):
            raise ValueError("tail tokens differ from the committed block")
        return tail

    def _refresh_duplicate(
        self, rec: LaneRecord, dup: int, slot: int, kind: SnapshotKind, t: int
    ) -> PublishResult:
        """The snapshot `dup` holds this image already: free the staged slot, refresh its
        recency (a tap still supersedes the lane's previous one)."""
        self.snapshots.release_slot(slot)
        s = self.snapshots.by_id[dup]
        s.last_hit = t
        if kind.is_tap:
            self._follow_previous_tap(rec, s)
        self.registry.counters.snapshots_duplicate += 1
        return PublishResult(dup, True, None, self.blocks.take_freed())

    def _add_snapshot(self, rec: LaneRecord, s: Snapshot, slot: int, tail_page: int | None) -> None:
        """`s` enters the store owning the staged `slot` and, with a tail, `tail_page`."""
        s.device_slot, s.device_state = slot, _RESIDENT
        if s.tail:
            s.tail_page, s.tail_device = tail_page, _RESIDENT
        self.snapshots.add(s)
        self.blocks.walk(s.anchor, +1, +1, s.id)
        self.snapshots.link(s)
        self.host_tier.mark(s.id)
        if s.kind.is_tap:
            self._follow_previous_tap(rec, s)  # before it takes Host slabs (§9.3)
        st = self.registry.counters
        st.snapshots_published += 1
        st.taps_published += s.kind.is_tap

    def _write_through(self, s: Snapshot, slot: int) -> SnapshotWrite | None:
        """Host slabs for the new snapshot `s`, if GDSF keeps it, and the write that fills
        them from `slot` (and its tail page); None when no slabs are granted."""
        self.host_tier.flush()  # s.h is the bound: never insert what GDSF would evict next
        has_tail = bool(s.tail)
        slabs = self.liveness.host_alloc(self.config.image_slabs + has_tail, bound=s.h)
        if slabs is None:
            return None
        tail_slab = slabs[-1] if has_tail else -1
        self.snapshots.set_host_copy(s, slabs[: self.config.image_slabs], tail_slab, _FILLING)
        s.restore_pins += 1
        nbytes = self.config.image_bytes + has_tail * self.config.slab_bytes
        bid = self.registry.new_batch(TransferRecord("snapshot", snapshot=s.id))
        self.registry.counters.write_through_bytes += nbytes
        return SnapshotWrite(bid, s.id, slot, list(s.host_slabs), s.tail_page, s.tail_slab, nbytes)

    def _follow_previous_tap(self, rec: LaneRecord, s: Snapshot) -> None:
        """§9.3: of the lane's taps in this prompt, the shallower is superseded by the deeper.

        Allocating a tap's slot supersedes the previous tap already published; this covers the
        taps published out of that order: a tap with a tail waits for the block holding it, so
        a deeper tap's slot can be allocated before the shallower tap is published."""
        prev = None if rec.last_tap is None else self.snapshots.by_id.get(rec.last_tap)
        if prev is not None and prev.frontier > s.frontier:
            self.liveness.supersede(s)
            return
        if prev is not None and prev.frontier < s.frontier:
            self.liveness.supersede(prev)
        rec.last_tap = s.id
