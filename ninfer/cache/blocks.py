"""BlockStore (design §5.1-§5.2, §9.1, §9.3 dead KV): the block tree and what derives from it.

Owns: the block tree (`tree`: nodes, their residency, pins and counters), the Device LRU
(`lru`: the cached node pages and snapshot tail pages eviction may take, §9.1), the dead-KV
set (`dead`: Host-resident blocks no snapshot needs, in sweep order) and the Device pages freed
since the last result (`freed`, handed out by `take_freed`).

It re-derives a node's or a tail's LRU and dead-KV membership from the record's fields
(`node_changed`, `tail_changed`), reading a snapshot's tail fields for its tail page. It marks
the snapshots whose exclusive bytes change through the `mark` it is given (the Host tier's).
It never deletes a snapshot, frees a slab or chooses a victim: PrefixIndex coordinates those.

A node's Device or Host copy appears only through `set_device_copy` / `set_host_copy` and goes
only through `clear_device_copy` / `clear_host_copy` or `remove`, which keep the counts of
nodes holding each copy (`device_copies`, `host_copies`: the stats gauges, read in O(1)); a
copy landing (Filling -> Resident) is written in place and changes no count.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from ninfer.cache.common import BLOCK_BYTES, ROOT, Residency
from ninfer.cache.device_lru import DeviceEntry, DeviceLru, EntryKind
from ninfer.cache.snapshots import Snapshot
from ninfer.cache.tree import BlockNode, BlockTree

_ABSENT, _RESIDENT, _FILLING = Residency.ABSENT, Residency.RESIDENT, Residency.FILLING


class BlockStore:
    """Invariants (check_invariants): the tree is linked, unique per (parent, tokens, extra),
    and every node has a copy (§9.4) whose page or slab id matches its state; Filling copies
    are pinned (§10.6); the Device LRU holds exactly the unpinned Device-resident nodes and tails
    (backed iff Host-resident) and the dead-KV set exactly the reclaimable Host blocks;
    `device_copies` / `host_copies` count the nodes with a Device / Host copy (checked against
    a recount by `invariants.recount_gauges`)."""

    def __init__(self, mark: Callable[[int], None]) -> None:
        self.tree = BlockTree()
        self.lru = DeviceLru()
        self.dead: OrderedDict[int, None] = OrderedDict()  # dead-KV sweep order
        self.freed: list[int] = []  # Device pages freed since the last result
        self.device_copies = 0  # nodes with a Device copy (Filling or Resident)
        self.host_copies = 0  # nodes with a Host copy (Filling or Resident)
        self._mark = mark

    def free_page(self, page: int) -> None:
        """A cached Device page the cache no longer holds (handed out by take_freed)."""
        self.freed.append(page)

    def take_freed(self) -> list[int]:
        """The pages freed since the last call (the caller returns them to its free list)."""
        out, self.freed = self.freed, []
        return out

    # ---- nodes ---------------------------------------------------------------------------------

    def insert(self, parent: int, lookup_hash: int, tokens: bytes, extra: int) -> BlockNode:
        """A new child of `parent` without any copy yet (the caller checked find_child missed
        and gives it one at once)."""
        return self.tree.insert(parent, lookup_hash, tokens, extra)

    def remove(self, node: BlockNode) -> None:
        """Unlink a childless node whose page and slab the caller has freed: it leaves the
        Device LRU, the dead-KV set and the copy counts with it."""
        self.lru.discard(DeviceEntry(EntryKind.NODE, node.id))
        self.dead.pop(node.id, None)
        self.device_copies -= node.device_page >= 0
        self.host_copies -= node.host_slab >= 0
        self.tree.remove(node)

    # ---- copies (the caller re-derives membership with node_changed afterwards) -------------

    def set_device_copy(self, node: BlockNode, page: int, state: Residency) -> None:
        """The node, without a Device copy, gets one on `page` in `state` (Filling/Resident)."""
        assert node.device_page < 0 and state != _ABSENT, f"node {node.id} Device copy"
        node.device_page, node.device_state = page, state
        self.device_copies += 1

    def clear_device_copy(self, node: BlockNode) -> None:
        """The node's Device copy goes: its page is freed (handed out by take_freed)."""
        assert node.device_page >= 0, f"node {node.id} has no Device copy"
        self.free_page(node.device_page)
        node.device_page, node.device_state = -1, _ABSENT
        self.device_copies -= 1

    def set_host_copy(self, node: BlockNode, slab: int, state: Residency) -> None:
        """The node, without a Host copy, gets one in `slab` (allocated by the caller)."""
        assert node.host_slab < 0 and state != _ABSENT, f"node {node.id} Host copy"
        node.host_slab, node.host_state = slab, state
        self.host_copies += 1

    def clear_host_copy(self, node: BlockNode) -> None:
        """The node's Host copy goes (the caller frees its slab)."""
        assert node.host_slab >= 0, f"node {node.id} has no Host copy"
        node.host_slab, node.host_state = -1, _ABSENT
        self.host_copies -= 1

    # ---- Device LRU / dead-KV membership ---------------------------------------------------

    def touch(self, nid: int) -> None:
        """A hit: node `nid`'s LRU entry (if any) moves to the MRU end of its list."""
        self.lru.touch(DeviceEntry(EntryKind.NODE, nid))

    def forget_tail(self, sid: int) -> None:
        """Snapshot `sid`'s tail page left the Device: its LRU entry goes."""
        self.lru.discard(DeviceEntry(EntryKind.TAIL, sid))

    def node_changed(self, node: BlockNode) -> None:
        """Re-derive the node's Device LRU and dead-KV membership from its fields."""
        if node.id == ROOT:
            return
        entry = DeviceEntry(EntryKind.NODE, node.id)
        if node.device_state == _RESIDENT and not node.active_refs and not node.restore_pins:
            self.lru.put(entry, node.host_state == _RESIDENT)
        else:
            self.lru.discard(entry)
        self.refresh_dead(node)

    def refresh_dead(self, node: BlockNode) -> None:
        # Dead KV (§9.3 step 1): Host-resident, no snapshot below, unpinned. A Host-only node is
        # only reclaimable as a leaf, so the sweep runs leaves first and never deletes a subtree.
        ready = (
            node.host_state == _RESIDENT
            and node.live_below == 0
            and not node.active_refs
            and not node.restore_pins
            and (node.device_state == _RESIDENT or not node.children)
            and node.id != ROOT
        )
        if ready:
            if node.id not in self.dead:
                self.dead[node.id] = None
        else:
            self.dead.pop(node.id, None)

    def tail_changed(self, s: Snapshot) -> None:
        """Re-derive the Device LRU membership of snapshot s's tail page."""
        entry = DeviceEntry(EntryKind.TAIL, s.id)
        if s.tail and s.tail_device == _RESIDENT and not s.restore_pins:
            self.lru.put(entry, s.host_state == _RESIDENT)
        else:
            self.lru.discard(entry)

    def order_path(self, deepest: int) -> None:
        """§7.7 step 2, §9.1: deeper blocks are evicted before shallower ones on a path. Move
        every Device LRU entry from `deepest` up to the root to its list's MRU end, deepest
        first. Called when nodes enter the LRU late (a write-through or restore landing): a
        released lane's shallower, already backed blocks went in at its release and would
        otherwise be evicted before the deeper blocks that landed after them (O(depth))."""
        nodes, lru = self.tree.nodes, self.lru
        nid = deepest
        while nid != ROOT:
            lru.touch(DeviceEntry(EntryKind.NODE, nid))
            nid = nodes[nid].parent

    # ---- counters along a path -------------------------------------------------------------

    def walk(self, anchor: int, live_delta: int, retained_delta: int, sid: int) -> None:
        """Add to live_below / retained_below from `anchor` up to the root (O(depth)).

        When a node's retained count crosses 1, the snapshot that owned (or now owns) its
        exclusive bytes changes value: mark it (its xor identifies it, §9.3 Z).
        """
        nodes, mark = self.tree.nodes, self._mark
        node = nodes[anchor]
        while True:
            if live_delta:
                before = node.live_below
                node.live_below = before + live_delta
                if (before == 0) != (node.live_below == 0):
                    self.refresh_dead(node)
            if retained_delta:
                before = node.retained_below
                if before == 1:
                    mark(node.retained_xor)
                node.retained_below = before + retained_delta
                node.retained_xor ^= sid
                if node.retained_below == 1:
                    mark(node.retained_xor)
            if node.id == ROOT:
                return
            node = nodes[node.parent]

    # ---- invariants --------------------------------------------------------------------------

    def check_invariants(self, snaps: dict[int, Snapshot], has_host: bool) -> None:
        """Raise AssertionError naming the first broken invariant (O(nodes + snapshots)).
        `snaps`: the snapshot records (their tails are LRU entries); `has_host`: whether a
        Host tier exists. PrefixIndex runs the two halves around its cross-store checks."""
        self.check_tree(has_host)
        self.check_membership(snaps)

    def check_tree(self, has_host: bool) -> None:
        nodes = self.tree.nodes
        keys = set()
        for n in nodes.values():
            if n.id == ROOT:
                continue
            p = nodes.get(n.parent)
            assert p is not None and n.id in p.children, f"§5.2 node {n.id} not linked to parent"
            assert n.depth == p.depth + 1, f"node {n.id} depth"
            assert len(n.tokens) == BLOCK_BYTES, f"node {n.id} holds a partial block"
            key = (n.parent, n.tokens, n.extra)
            assert key not in keys, f"§10.2 duplicate node for key of {n.id}"
            keys.add(key)
            assert n.has_copy, f"§9.4 node {n.id} has no copy but exists"
            assert (n.device_page >= 0) == (n.device_state != _ABSENT), f"node {n.id} device page"
            assert (n.host_slab >= 0) == (n.host_state != _ABSENT), f"node {n.id} host slab"
            if not has_host:
                assert n.host_state == _ABSENT, f"node {n.id} Host copy without a Host tier"
            if n.device_state == _FILLING or n.host_state == _FILLING:
                assert n.restore_pins > 0, f"§10.6 Filling node {n.id} is not pinned"
            for c in n.children:
                assert nodes[c].parent == n.id
        self.tree.check_hash_map()

    def check_membership(self, snaps: dict[int, Snapshot]) -> None:
        nodes = self.tree.nodes
        want = {}
        for n in nodes.values():
            if (
                n.id != ROOT
                and n.device_state == _RESIDENT
                and not n.active_refs
                and not n.restore_pins
            ):
                want[DeviceEntry(EntryKind.NODE, n.id)] = n.host_state == _RESIDENT
        for s in snaps.values():
            if s.tail and s.tail_device == _RESIDENT and not s.restore_pins:
                want[DeviceEntry(EntryKind.TAIL, s.id)] = s.host_state == _RESIDENT
        lru = self.lru
        have = {e: True for e in lru.backed} | {e: False for e in lru.unbacked}
        assert len(lru.backed) + len(lru.unbacked) == len(have), "LRU entry in both lists"
        assert have == want, "§9.1 Device LRU membership or backed/unbacked list is wrong"
        dead = {
            n.id
            for n in nodes.values()
            if n.id != ROOT
            and n.host_state == _RESIDENT
            and n.live_below == 0
            and not n.active_refs
            and not n.restore_pins
            and (n.device_state == _RESIDENT or not n.children)
        }
        assert dead == set(self.dead), "§9.3 dead-KV set is wrong"
