"""Device snapshot slots (design §5.4, §9.2): which of the D state-pool snapshot slots holds what.

A slot is free, *staging* (a lane copied a tap or endpoint image there and has not published
it yet), or owned by a published snapshot. The choice of a victim slot is policy and lives in
PrefixIndex.allocate_snapshot_slot; this class only keeps the ownership table.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class SlotState(enum.IntEnum):
    FREE = 0
    STAGING = 1  # owner = lane id
    SNAPSHOT = 2  # owner = snapshot id


class SlotOwner(NamedTuple):
    state: SlotState
    owner: int


_FREE = SlotOwner(SlotState.FREE, -1)


class DeviceSlots:
    """Invariants: a slot is on the free stack iff its state is FREE; `snapshot_count` is the
    number of slots in state SNAPSHOT. Free slots come out lowest index first and are reused
    LIFO."""

    __slots__ = ("owners", "_free", "snapshot_count")

    def __init__(self, n_slots: int) -> None:
        if n_slots < 0:
            raise ValueError(f"device_snapshot_slots must be >= 0, got {n_slots}")
        self.owners: list[SlotOwner] = [_FREE] * n_slots
        self._free: list[int] = list(range(n_slots - 1, -1, -1))
        self.snapshot_count = 0  # slots owned by a published snapshot (kept as they change)

    def __len__(self) -> int:
        return len(self.owners)

    @property
    def free_count(self) -> int:
        return len(self._free)

    def take_free(self) -> int | None:
        return self._free.pop() if self._free else None

    def assign(self, slot: int, state: SlotState, owner: int) -> None:
        assert state != SlotState.FREE
        self.snapshot_count += (state == SlotState.SNAPSHOT) - (
            self.owners[slot].state == SlotState.SNAPSHOT
        )
        self.owners[slot] = SlotOwner(state, owner)

    def release(self, slot: int) -> None:
        state = self.owners[slot].state
        assert state != SlotState.FREE, f"slot {slot} already free"
        self.snapshot_count -= state == SlotState.SNAPSHOT
        self.owners[slot] = _FREE
        self._free.append(slot)

    def owned_by_snapshots(self) -> list[tuple[int, int]]:
        """(slot, snapshot id) for every slot holding a published snapshot, by slot index."""
        return [(i, o.owner) for i, o in enumerate(self.owners) if o.state == SlotState.SNAPSHOT]

    def check_invariants(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "slot on the free stack twice"
        for i, o in enumerate(self.owners):
            assert (o.state == SlotState.FREE) == (i in free), f"slot {i} free-stack mismatch"
        owned = sum(o.state == SlotState.SNAPSHOT for o in self.owners)
        assert self.snapshot_count == owned, f"snapshot slot count {self.snapshot_count} != {owned}"
