"""The seam between the engine and Host <-> Device copies (spec §6.5, §7.6).

The engine hands every copy list the prefix index produces to a `Transfer`: restore batches at
admission, block write-through at release, snapshot image writes at publication. It calls
`poll()` once per step and reports what landed back to the index. `DeviceOnlyTransfer` is the
implementation without a Host tier: the index never produces Host copies then, so receiving one
is a logic error. The Host-tier implementation (`ninfer.memory.host_transfer`) replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class Landed:
    """Batch ids whose copies have completed since the previous poll."""

    restores: list[int] = field(default_factory=list)
    writes: list[int] = field(default_factory=list)


class Transfer(Protocol):
    host_bytes: int  # pinned Host bytes this transfer layer holds (0 = none)

    def restore(self, batch: Any, lane_slot: int) -> Any:
        """Queue a RestoreBatch: block slabs -> pages, tail slab -> page, image -> lane_slot.
        Returns a ticket with wait_prelude() / wait_all() / hook() (per-layer waits) and
        synchronize() (host wait, for a prefetch)."""
        ...

    def write_blocks(self, batch: Any) -> None:
        """Queue a BlockWriteBatch (Device pages -> Host slabs) on the transfer stream."""
        ...

    def write_snapshot(self, write: Any, phys_slot: int) -> None:
        """Queue a SnapshotWrite (image of physical slot, and tail page) -> Host slabs."""
        ...

    def poll(self) -> Landed:
        """Batches that landed since the last poll (the engine tells the index)."""
        ...

    def drain(self) -> Landed:
        """Wait for every queued batch; what landed."""
        ...


class DeviceOnlyTransfer:
    """No Host tier: nothing is ever copied to or from the Host."""

    host_bytes = 0

    def restore(self, batch: Any, lane_slot: int) -> Any:
        raise RuntimeError("Device-only cache: the index asked for a Host restore")

    def write_blocks(self, batch: Any) -> None:
        raise RuntimeError("Device-only cache: the index asked for a Host write-through")

    def write_snapshot(self, write: Any, phys_slot: int) -> None:
        raise RuntimeError("Device-only cache: the index asked for a Host snapshot write")

    def poll(self) -> Landed:
        return Landed()

    def drain(self) -> Landed:
        return Landed()
