"""BlockTree (design §5.1-§5.2): immutable 64-token block nodes keyed by (parent, tokens, extra).

A node's identity never changes after insertion (§10.2); only its residency, pins and counters
do. Children are found through one map keyed by lookup_hash (the hash already chains the
parent's hash), and every probe compares parent, the 256 token bytes and the extra key exactly:
colliding hashes go to an overflow list, so a forced constant hash costs probes, never a false
hit (§10.5).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ninfer.cache.common import ROOT, Residency
from ninfer.cache.keys import HASH_SEED


@dataclass(slots=True, eq=False)
class BlockNode:
    """One cached 64-token block; the node at depth b covers positions [64b, 64b+64).

    Residency: `device_page` is >= 0 iff `device_state` is not ABSENT (likewise `host_slab` /
    `host_state`); a non-root node always has at least one copy (§9.4 deletes it otherwise).
    Counters: `active_refs` (lanes whose path holds it), `restore_pins` (in-flight transfers
    reading or writing it), `live_below` (snapshots anchored in its subtree, itself included),
    `retained_below` / `retained_xor` (count and xor of the ids of *retained* ones: when the
    count is 1 the xor is that snapshot's id, the owner of the node's exclusive bytes, §9.3).
    """

    id: int
    parent: int
    depth: int
    lookup_hash: int
    extra: int
    tokens: bytes  # 256 bytes: 64 little-endian int32 token ids
    children: list[int] = field(default_factory=list)
    snapshots: list[int] = field(default_factory=list)  # anchored here
    device_page: int = -1
    device_state: Residency = Residency.ABSENT
    host_slab: int = -1
    host_state: Residency = Residency.ABSENT
    active_refs: int = 0
    restore_pins: int = 0
    live_below: int = 0
    retained_below: int = 0
    retained_xor: int = 0
    last_access: int = 0

    @property
    def has_copy(self) -> bool:
        return self.device_state != Residency.ABSENT or self.host_state != Residency.ABSENT

    @property
    def pinned(self) -> bool:
        return self.active_refs > 0 or self.restore_pins > 0


class BlockTree:
    """Nodes by id plus the lookup-hash map. Mutations: `insert`, `remove` (leaf only)."""

    __slots__ = ("nodes", "root", "_by_hash", "_overflow", "_next_id")

    def __init__(self) -> None:
        self.root = BlockNode(ROOT, -1, -1, HASH_SEED, 0, b"")
        self.nodes: dict[int, BlockNode] = {ROOT: self.root}
        self._by_hash: dict[int, BlockNode] = {}
        self._overflow: dict[int, list[BlockNode]] = {}
        self._next_id = ROOT + 1

    def __len__(self) -> int:
        return len(self.nodes) - 1  # the root is not a block

    def find_child(
        self, parent: int, lookup_hash: int, tokens: bytes, extra: int
    ) -> BlockNode | None:
        """The child of `parent` with exactly these tokens and extra key, or None."""
        node = self._by_hash.get(lookup_hash)
        if node is None:
            return None
        if node.parent == parent and node.extra == extra and node.tokens == tokens:
            return node
        for other in self._overflow.get(lookup_hash, ()):
            if other.parent == parent and other.extra == extra and other.tokens == tokens:
                return other
        return None

    def insert(self, parent: int, lookup_hash: int, tokens: bytes, extra: int) -> BlockNode:
        """Add a child of `parent` (the caller checked find_child missed). No residency yet."""
        p = self.nodes[parent]
        node = BlockNode(self._next_id, parent, p.depth + 1, lookup_hash, extra, tokens)
        self._next_id += 1
        self.nodes[node.id] = node
        p.children.append(node.id)
        if lookup_hash in self._by_hash:
            self._overflow.setdefault(lookup_hash, []).append(node)
        else:
            self._by_hash[lookup_hash] = node
        return node

    def remove(self, node: BlockNode) -> None:
        """Unlink a childless node (deletion runs leaves first, §9.4)."""
        assert not node.children and node.id != ROOT
        del self.nodes[node.id]
        self.nodes[node.parent].children.remove(node.id)
        h = node.lookup_hash
        if self._by_hash.get(h) is node:
            rest = self._overflow.get(h)
            if rest:
                self._by_hash[h] = rest.pop(0)
                if not rest:
                    del self._overflow[h]
            else:
                del self._by_hash[h]
        else:
            self._overflow[h].remove(node)
            if not self._overflow[h]:
                del self._overflow[h]

    def ancestors(self, node: BlockNode) -> Iterator[BlockNode]:
        """`node`, its parent, ... up to and including the root."""
        nodes = self.nodes
        while True:
            yield node
            if node.id == ROOT:
                return
            node = nodes[node.parent]

    def at_depth(self, node: BlockNode, depth: int) -> BlockNode | None:
        """The ancestor of `node` at `depth` (-1 = root), or None when `node` is shallower."""
        if node.depth < depth:
            return None
        nodes = self.nodes
        while node.depth > depth:
            node = nodes[node.parent]
        return node

    def subtree_postorder(self, node: BlockNode) -> list[BlockNode]:
        """Every node of the subtree, children before parents."""
        out: list[BlockNode] = []
        stack = [node]
        nodes = self.nodes
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(nodes[c] for c in n.children)
        out.reverse()
        return out

    def check_hash_map(self) -> None:
        seen = 0
        for h, node in self._by_hash.items():
            assert node.lookup_hash == h and self.nodes.get(node.id) is node, "stale hash entry"
            seen += 1
        for h, lst in self._overflow.items():
            assert lst and h in self._by_hash, "overflow without a primary entry"
            for node in lst:
                assert node.lookup_hash == h and self.nodes.get(node.id) is node
                seen += 1
        assert seen == len(self), "hash map does not index every node exactly once"
