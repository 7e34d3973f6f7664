"""Device LRU (design §9.1): evictable cached Device pages, tail-first, backed before unbacked.

An entry is a node's page or a snapshot tail's page whose owner has no refs and no pins. Two
ordered lists, head = least recently used: `backed` (a Host copy exists: eviction only drops the
Device copy) and `unbacked` (eviction loses the last copy, §9.4). Backed entries are always
consumed first. Release appends a lane's nodes in reverse block order, so the deepest block is
evicted first; nodes that enter later (a write-through or a restore landing) re-order their
whole path deepest first behind them (`BlockStore.order_path`), so on any path deeper
blocks go before shallower ones (design §7.7 step 2):

    turn 1 releases 1-4, turn 2 resumes at 4 and writes 5-8 through:
    at release   backed [4, 3, 2, 1]              (5-8 pinned until their copy lands)
    at landing   backed [8, 7, 6, 5, 4, 3, 2, 1]  (not [4, 3, 2, 1, 8, 7, 6, 5])
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterator
from typing import NamedTuple


class EntryKind(enum.IntEnum):
    NODE = 0
    TAIL = 1


class DeviceEntry(NamedTuple):
    kind: EntryKind
    id: int  # node id or snapshot id


class DeviceLru:
    """Invariant: an entry is in at most one list, once."""

    __slots__ = ("backed", "unbacked")

    def __init__(self) -> None:
        self.backed: OrderedDict[DeviceEntry, None] = OrderedDict()
        self.unbacked: OrderedDict[DeviceEntry, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.backed) + len(self.unbacked)

    def __contains__(self, entry: DeviceEntry) -> bool:
        return entry in self.backed or entry in self.unbacked

    def is_backed(self, entry: DeviceEntry) -> bool:
        return entry in self.backed

    def put(self, entry: DeviceEntry, backed: bool) -> None:
        """Insert at the MRU end of its list unless already there in the right list (no move)."""
        want, other = (self.backed, self.unbacked) if backed else (self.unbacked, self.backed)
        if entry in want:
            return
        other.pop(entry, None)
        want[entry] = None

    def discard(self, entry: DeviceEntry) -> None:
        self.backed.pop(entry, None)
        self.unbacked.pop(entry, None)

    def touch(self, entry: DeviceEntry) -> None:
        """Move to the MRU end of its list (a hit)."""
        for lst in (self.backed, self.unbacked):
            if entry in lst:
                lst.move_to_end(entry)
                return

    def order(self) -> Iterator[DeviceEntry]:
        """Eviction order: backed head to tail, then unbacked head to tail."""
        yield from self.backed
        yield from self.unbacked
