"""SnapshotStore (design §5.3, §9.2, §9.3): the snapshots, their links, supersession and the
Device snapshot slot table.

Owns: the records by id (`by_id`) and by key (`by_key`, one per (anchor, tail)), the
supersession order (`superseded`, oldest first), the ancestor links (`ancestor`, `dependents`,
`root_deps` for the snapshots with none above), the ids, the `superseded` flags, and the
Device slot table (`slots`: free, staging for a lane, or owned by a snapshot), plus each
anchor node's list of the snapshots anchored there.

A registered snapshot's tail page and Host copy appear only through `set_tail_device` /
`set_host_copy` and go only through `clear_tail_device` / `clear_host_copy` or `remove`
(`add` counts what the record holds), which keep the counts the stats gauges read in O(1):
`tail_pages` (tails on the Device), `host_copies` (snapshots with a Host copy) and
`host_slabs` (the slabs of those copies); the images in Device slots are the slot table's
`snapshot_count`. A copy landing (Filling -> Resident) is written in place.

Reads, never writes, the rest of the block tree (ancestor search, the Boundary rule's
single-chain test). Marks snapshots whose GDSF value changes through the `mark` it is given
(the Host tier's). It does not free pages or slabs, walk the tree's counters or delete blocks:
PrefixIndex coordinates those around `add`, `remove`, `supersede` and `retain`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from ninfer.cache.common import ROOT, Residency, SnapshotKind
from ninfer.cache.device_slots import DeviceSlots, SlotState
from ninfer.cache.snapshots import Snapshot
from ninfer.cache.tree import BlockTree


class SnapshotStore:
    """Invariants (check_invariants): `by_key` indexes every snapshot once by (anchor, tail);
    `superseded` holds exactly the superseded ones; `ancestor` is the nearest other snapshot
    whose tokens are a prefix (None = the root) and `dependents` / `root_deps` are its inverse;
    a slot owned by a snapshot is that snapshot's `device_slot` and back; the slot table's own
    (a slot is on the free stack iff free); the copy counts equal a recount
    (`invariants.recount_gauges`)."""

    def __init__(self, n_slots: int, tree: BlockTree, mark: Callable[[int], None]) -> None:
        self.by_id: dict[int, Snapshot] = {}
        self.by_key: dict[tuple[int, bytes], int] = {}
        self.superseded: OrderedDict[int, None] = OrderedDict()  # supersession order
        self.root_deps: set[int] = set()  # snapshots with no snapshot above them
        self.slots = DeviceSlots(n_slots)
        self._tree, self._mark = tree, mark
        self._next_id = 1
        self.tail_pages = 0  # snapshots holding their tail page on the Device
        self.host_copies = 0  # snapshots with a Host copy (image + tail, Filling or Resident)
        self.host_slabs = 0  # slabs of those Host copies

    def __len__(self) -> int:
        return len(self.by_id)

    def find(self, anchor: int, tail: bytes) -> int | None:
        """The snapshot at (anchor, tail), or None (§5.3: at most one)."""
        return self.by_key.get((anchor, tail))

    # ---- membership ------------------------------------------------------------------------

    def add(self, s: Snapshot) -> None:
        """Register `s` (its id from `new_id`) under its key, on its anchor node and as the
        owner of its Device slot if it has one; `link` it once the tree's counters count it."""
        if s.device_slot >= 0:
            self.slots.assign(s.device_slot, SlotState.SNAPSHOT, s.id)
        self.by_id[s.id] = s
        self.by_key[(s.anchor, s.tail)] = s.id
        self._tree.nodes[s.anchor].snapshots.append(s.id)
        self._count(s, +1)

    def new_id(self) -> int:
        sid = self._next_id
        self._next_id += 1
        return sid

    def remove(self, s: Snapshot) -> None:
        """Forget `s`: its slot goes back to the table, its dependents to its ancestor, its
        copies leave the counts (the caller frees its tail page and slabs)."""
        if s.device_slot >= 0:
            self.slots.release(s.device_slot)
        self._count(s, -1)
        self._mark_dependents(s)
        self._unlink(s)
        self._tree.nodes[s.anchor].snapshots.remove(s.id)
        del self.by_key[(s.anchor, s.tail)]
        self.superseded.pop(s.id, None)
        del self.by_id[s.id]

    # ---- copies ----------------------------------------------------------------------------

    def _count(self, s: Snapshot, sign: int) -> None:
        self.tail_pages += sign * (s.tail_page >= 0)
        if s.host_state != Residency.ABSENT:
            self._count_host(s, sign)

    def set_tail_device(self, s: Snapshot, page: int, state: Residency) -> None:
        """Registered `s`, its tail not on the Device, gets it on `page` in `state`."""
        assert s.tail and s.tail_page < 0 and state != Residency.ABSENT, f"snapshot {s.id} tail"
        s.tail_page, s.tail_device = page, state
        self.tail_pages += 1

    def clear_tail_device(self, s: Snapshot) -> None:
        """Registered `s` loses its Device tail page (the caller frees the page)."""
        assert s.tail_page >= 0, f"snapshot {s.id} has no Device tail"
        s.tail_page, s.tail_device = -1, Residency.ABSENT
        self.tail_pages -= 1

    def set_host_copy(
        self, s: Snapshot, slabs: list[int], tail_slab: int, state: Residency
    ) -> None:
        """Registered `s`, without a Host copy, gets one: image `slabs` and `tail_slab` (-1
        without a tail), allocated by the caller, in `state`."""
        assert s.host_state == Residency.ABSENT and state != Residency.ABSENT
        s.host_slabs, s.tail_slab, s.host_state = slabs, tail_slab, state
        self._count_host(s, +1)

    def clear_host_copy(self, s: Snapshot) -> None:
        """Registered `s` loses its Host copy (the caller frees the slabs)."""
        if s.host_state != Residency.ABSENT:
            self._count_host(s, -1)
        s.host_slabs, s.tail_slab, s.host_state = [], -1, Residency.ABSENT

    def _count_host(self, s: Snapshot, sign: int) -> None:
        self.host_copies += sign
        self.host_slabs += sign * (len(s.host_slabs) + (s.tail_slab >= 0))

    # ---- ancestor links (§9.3: nearest snapshot above, and its dependents) -----------------

    def _deps(self, sid: int | None) -> set[int]:
        return self.root_deps if sid is None else self.by_id[sid].dependents

    def find_ancestor(self, s: Snapshot) -> int | None:
        """The deepest other snapshot whose tokens are a prefix of s's, or None (root)."""
        nodes, snaps = self._tree.nodes, self.by_id
        anchor = nodes[s.anchor]
        best = None
        for sid in anchor.snapshots:
            t = snaps[sid]
            if (
                t is not s
                and t.frontier < s.frontier
                and s.tail.startswith(t.tail)
                and (best is None or t.frontier > best.frontier)
            ):
                best = t
        child = anchor
        while best is None and child.id != ROOT:
            node = nodes[child.parent]
            for sid in node.snapshots:
                t = snaps[sid]
                if child.tokens.startswith(t.tail) and (best is None or t.frontier > best.frontier):
                    best = t
            child = node
        return None if best is None else best.id

    def _is_below(self, t: Snapshot, s: Snapshot) -> bool:
        """True when s's tokens are a strict prefix of t's."""
        if t.frontier <= s.frontier:
            return False
        if t.anchor == s.anchor:
            return t.tail.startswith(s.tail)
        # t's path block just below s's anchor: its parent must be the anchor, and its tokens
        # must start with s's tail (trivially true without a tail).
        y = self._tree.at_depth(self._tree.nodes[t.anchor], s.anchor_depth + 1)
        return y is not None and y.parent == s.anchor and y.tokens.startswith(s.tail)

    def link(self, s: Snapshot) -> None:
        """Insert s between its nearest ancestor and the ancestor's dependents below s. Needs
        the anchor's live_below to count s already."""
        a = self.find_ancestor(s)
        s.ancestor = a
        deps = self._deps(a)
        # Only snapshots in the anchor's subtree can lie below s; none there (other than s,
        # already counted) means nothing to take over, without scanning a's dependents.
        below = [] if self._tree.nodes[s.anchor].live_below <= 1 else deps
        for tid in [tid for tid in below if self._is_below(self.by_id[tid], s)]:
            deps.discard(tid)
            s.dependents.add(tid)
            self.by_id[tid].ancestor = s.id
        deps.add(s.id)
        # The taken-over snapshots now value against s, and so do the retained ones below a
        # superseded one among them (their nearest retained ancestor was above s): all of them
        # change C, however deep below s they hang.
        self._mark_dependents(s)

    def _unlink(self, s: Snapshot) -> None:
        deps = self._deps(s.ancestor)
        deps.discard(s.id)
        for tid in s.dependents:
            self.by_id[tid].ancestor = s.ancestor
            deps.add(tid)
        s.dependents = set()

    def _mark_dependents(self, s: Snapshot) -> None:
        """Snapshots whose nearest *retained* ancestor is s change C when s changes."""
        stack = list(s.dependents)
        while stack:
            t = self.by_id[stack.pop()]
            self._mark(t.id)
            if t.superseded:
                stack.extend(t.dependents)

    # ---- supersession (§9.3) ---------------------------------------------------------------

    def _single_chain_below(self, s: Snapshot) -> bool:
        """True while no other conversation continued from s: the tree below it is one chain."""
        nodes = self._tree.nodes
        node = nodes[s.anchor]
        if s.tail:
            kids = [c for c in node.children if nodes[c].tokens.startswith(s.tail)]
            if len(kids) != 1:
                return len(kids) == 0
            node = nodes[kids[0]]
        while node.children:
            if len(node.children) > 1:
                return False
            node = nodes[node.children[0]]
        return True

    def can_supersede(self, s: Snapshot) -> bool:
        """Retained, and not a Boundary that another conversation continued from."""
        if s.superseded:
            return False
        return s.kind != SnapshotKind.BOUNDARY or self._single_chain_below(s)

    def supersede(self, s: Snapshot, tick: int) -> None:
        """Mark s superseded at `tick` (check can_supersede first); the tree's retained
        counters are the caller's."""
        s.superseded = True
        s.superseded_tick = tick
        self.superseded[s.id] = None
        self._mark_dependents(s)

    def retain(self, s: Snapshot) -> bool:
        """A superseded s is retained again (False when it was not superseded); the tree's
        retained counters are the caller's."""
        if not s.superseded:
            return False
        s.superseded = False
        del self.superseded[s.id]
        self._mark(s.id)
        self._mark_dependents(s)
        return True

    # ---- Device slots (§5.4, §9.2) ---------------------------------------------------------

    def take_free_slot(self) -> int | None:
        """A free slot (lowest first, reused LIFO), still free in the table, or None."""
        return self.slots.take_free()

    def stage_slot(self, slot: int, lane: int) -> None:
        """`slot` (from take_free_slot) now stages an image for `lane`."""
        self.slots.assign(slot, SlotState.STAGING, lane)

    def release_slot(self, slot: int) -> None:
        """A staging slot goes back to the free stack."""
        self.slots.release(slot)

    def drop_image_device(self, s: Snapshot) -> None:
        """s loses its Device image: its slot goes back to the free stack."""
        self.slots.release(s.device_slot)
        s.device_slot, s.device_state = -1, Residency.ABSENT

    def slot_owners(self) -> list[tuple[int, Snapshot]]:
        """(slot, snapshot) for every slot a published, unpinned snapshot owns, by slot."""
        snaps = self.by_id
        owned = [(slot, snaps[sid]) for slot, sid in self.slots.owned_by_snapshots()]
        return [(slot, s) for slot, s in owned if not s.restore_pins]

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (O(snapshots x depth))."""
        snaps = self.by_id
        for slot, o in enumerate(self.slots.owners):
            if o.state == SlotState.SNAPSHOT:
                s = snaps.get(o.owner)
                assert s is not None and s.device_slot == slot, f"slot {slot} owner mismatch"
        assert set(self.superseded) == {s.id for s in snaps.values() if s.superseded}
        for s in snaps.values():
            assert self.by_key.get((s.anchor, s.tail)) == s.id, "§5.3 one snapshot per key"
            if s.device_slot >= 0:
                assert self.slots.owners[s.device_slot] == (SlotState.SNAPSHOT, s.id)
            assert s.ancestor == self.find_ancestor(s), f"snapshot {s.id} ancestor link"
            for t in s.dependents:
                assert snaps[t].ancestor == s.id
        assert len(self.by_key) == len(snaps)
        assert {s.id for s in snaps.values() if s.ancestor is None} == self.root_deps
        self.slots.check_invariants()
