"""Host-only entries rebuilt without evicting anything (design §5.5 persistence load), also used
to build large trees for benchmarks. Parents must be loaded before children."""

from __future__ import annotations

from collections.abc import Sequence

from ninfer.cache.common import BLOCK_BYTES, TOKEN_BYTES, Residency, SnapshotKind
from ninfer.cache.keys import block_hash, pack_tokens
from ninfer.cache.part import IndexPart
from ninfer.cache.snapshots import Snapshot
from ninfer.page import PAGE_SIZE

_RESIDENT = Residency.RESIDENT


class Loader(IndexPart):
    """load_block and load_snapshot of the PrefixIndex."""

    def load_block(
        self,
        parent: int,
        tokens: Sequence[int] | bytes,
        extra: int,
        lookup_hash: int | None,
    ) -> int:
        """A Host-resident child of `parent` (returns an existing equal node unchanged).

        Takes one free slab; raises ValueError without a Host tier or a free slab.
        """
        data = pack_tokens(tokens)
        if len(data) != BLOCK_BYTES:
            raise ValueError(f"a block holds {PAGE_SIZE} tokens")
        p = self.blocks.tree.nodes[parent]
        h = block_hash(p.lookup_hash, data, extra) if lookup_hash is None else lookup_hash
        node = self.blocks.tree.find_child(parent, h, data, extra)
        if node is not None:
            return node.id
        slabs = self.host_tier.allocate(1)
        if slabs is None:
            raise ValueError("no free Host slab to load a block into")
        self.registry.epoch += 1
        node = self.blocks.insert(parent, h, data, extra)
        self.blocks.set_host_copy(node, slabs[0], _RESIDENT)
        self.blocks.node_changed(node)
        self.blocks.refresh_dead(p)
        return node.id

    def load_snapshot(
        self,
        anchor: int,
        tail: Sequence[int] | bytes,
        kind: SnapshotKind,
        hits: int,
        superseded: bool,
    ) -> int:
        """A Host-only snapshot at `anchor` + `tail` (image and tail slabs from the free pool),
        superseded (§9.3) when `superseded` (a saved snapshot that was).

        Raises ValueError without enough free slabs or when (anchor, tail) already exists.
        """
        tail_b = pack_tokens(tail)
        node = self.blocks.tree.nodes[anchor]
        if self.snapshots.find(anchor, tail_b) is not None:
            raise ValueError("snapshot already present")
        k = self.config.image_slabs + bool(tail_b)
        slabs = self.host_tier.allocate(k)
        if slabs is None:
            raise ValueError("not enough free Host slabs to load a snapshot")
        self.registry.epoch += 1
        frontier = PAGE_SIZE * (node.depth + 1) + len(tail_b) // TOKEN_BYTES
        sid = self.snapshots.new_id()
        s = Snapshot(
            sid, anchor, node.depth, frontier, tail_b, kind, hits=hits, l_at=self.host_tier.L
        )
        s.host_slabs = slabs[: self.config.image_slabs]
        s.tail_slab = slabs[-1] if tail_b else -1
        s.host_state = _RESIDENT
        self.snapshots.add(s)
        self.blocks.walk(anchor, +1, +1, sid)
        self.snapshots.link(s)
        self.host_tier.mark(sid)
        if superseded:
            self.liveness.supersede(s)
        return sid
