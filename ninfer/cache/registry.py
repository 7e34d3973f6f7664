"""The PrefixIndex's own records (design §6.4, §7.6): the open lanes, the transfer batches in
flight, the counters, and the epoch and clock that every mutation advances.

The stores own the blocks, snapshots and slabs; the registry owns what the lane protocol adds on
top of them. Every part of the index that mutates takes the registry at construction.
"""

from __future__ import annotations

from ninfer.cache.common import LaneError
from ninfer.cache.records import LaneRecord, TransferRecord
from ninfer.cache.stats import CacheStats


class Registry:
    def __init__(self) -> None:
        self.lanes: dict[int, LaneRecord] = {}
        self.batches: dict[int, TransferRecord] = {}
        self.counters = CacheStats()
        self.epoch = 0  # bumped by every mutation: a quote from an older epoch is stale
        self.clock = 0  # recency ticks (last access, last hit, supersession order)
        self._next_batch = 1

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def mutated(self) -> int:
        """A mutation: the epoch moves and the clock ticks (returned)."""
        self.epoch += 1
        return self.tick()

    def lane(self, lane: int, activated: bool | None = True) -> LaneRecord:
        """The open lane's record; LaneError if it is not open or (unless `activated` is None)
        not in the asked activation state."""
        rec = self.lanes.get(lane)
        if rec is None:
            raise LaneError(f"lane {lane} is not open")
        if activated is not None and rec.activated != activated:
            raise LaneError(f"lane {lane} is {'' if rec.activated else 'not '}activated")
        return rec

    def new_batch(self, batch: TransferRecord) -> int:
        """Record a transfer batch in flight; returns its id (1, 2, ...)."""
        bid = self._next_batch
        self._next_batch += 1
        self.batches[bid] = batch
        return bid
