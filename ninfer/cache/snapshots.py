"""Snapshots (design §5.3): a recurrent-state image at frontier F, anchored on a tree node.

    positions  0 ........ 64(d+1) ........ F
               |-- path(anchor), d+1 blocks --|-- tail: F - 64(d+1) tokens (0..63) --|

A snapshot owns its StateImage (a Device snapshot slot and/or Host slabs) and, when the tail is
not empty, one private page bundle holding the tail KV (a Device page and/or one Host slab).
The Host copy of image and tail is written and dropped together (`host_state`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ninfer.cache.common import TOKEN_BYTES, Residency, SnapshotKind
from ninfer.page import PAGE_SIZE


@dataclass(slots=True, eq=False)
class Snapshot:
    """Invariants (PrefixIndex.check_invariants):
    - valid while it exists: every path node has a copy, the image has a copy (device slot or
      Host slabs) and, with a tail, the tail has a copy (§5.3, deleted eagerly otherwise);
    - at most one snapshot per (anchor, tail);
    - `ancestor` is the nearest snapshot above it on its path (None = the root), and
      `dependents` are exactly the snapshots naming it as ancestor;
    - `superseded` snapshots are not counted in the nodes' retained counters.
    """

    id: int
    anchor: int
    anchor_depth: int  # -1 when anchored at the root (F < 64)
    frontier: int
    tail: bytes  # packed tail tokens, tail_len * 4 bytes
    kind: SnapshotKind
    device_slot: int = -1
    device_state: Residency = Residency.ABSENT  # the image's Device copy
    tail_page: int = -1
    tail_device: Residency = Residency.ABSENT
    host_slabs: list[int] = field(default_factory=list)  # image slabs
    tail_slab: int = -1
    host_state: Residency = Residency.ABSENT  # image + tail Host copy
    restore_pins: int = 0
    superseded: bool = False
    superseded_tick: int = 0
    hits: int = 0
    l_at: float = 0.0  # L when published or last hit (L_s in §9.3)
    h: float = 0.0  # cached GDSF priority, valid unless the id is in the dirty set
    last_hit: int = 0
    ancestor: int | None = None
    dependents: set[int] = field(default_factory=set)

    @property
    def tail_len(self) -> int:
        return len(self.tail) // TOKEN_BYTES

    @property
    def device_complete(self) -> bool:
        """Image in a Device slot and tail (if any) Device-resident: restorable without Host."""
        return self.device_state == Residency.RESIDENT and (
            not self.tail or self.tail_device == Residency.RESIDENT
        )

    def image_has_copy(self) -> bool:
        return self.device_state != Residency.ABSENT or self.host_state != Residency.ABSENT

    def tail_has_copy(self) -> bool:
        return (
            not self.tail
            or self.tail_device != Residency.ABSENT
            or self.host_state != Residency.ABSENT
        )

    def expected_frontier(self) -> int:
        return PAGE_SIZE * (self.anchor_depth + 1) + self.tail_len
