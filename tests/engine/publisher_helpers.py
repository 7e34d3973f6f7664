"""Stand-in parts for driving `Publisher` alone (ninfer/engine/kv/publisher.py): a recording
index of one lane, pools and a budget, and a lane prefilled to a given frontier."""

from __future__ import annotations

from types import SimpleNamespace

from engine_helpers import greedy

from ninfer.cache.records import CommitKind, SlotGrant
from ninfer.engine.kv.counters import EngineCounters
from ninfer.engine.kv.lane import KVLane
from ninfer.engine.kv.publisher import Publisher
from ninfer.engine.request import PromptHints, Request

LANE = 7
SNAP_PHYS = [10, 11, 12, 13]  # physical state slot of each logical snapshot slot


class RecordingCache:
    """Stand-in index of lane 7: every block newly inserted, a publication new unless its
    frontier is in `duplicates`; records every call."""

    def __init__(self):
        self.calls: list[tuple] = []
        self._slots = iter(range(4))
        self.duplicates: set[int] = set()

    def commit_block(self, lane, b, data, page, extra=0):
        assert lane == LANE
        self.calls.append(("commit", b, page))
        return SimpleNamespace(kind=CommitKind.INSERTED)

    def allocate_snapshot_slot(self, lane, f, kind):
        assert lane == LANE
        slot = next(self._slots)
        self.calls.append(("allocate", f, kind, slot))
        return SlotGrant(slot, None, False, [])

    def has_snapshot(self, lane, f, tail_tokens):
        assert lane == LANE
        self.calls.append(("has", f, tuple(tail_tokens)))
        return f in self.duplicates

    def free_snapshot_slot(self, lane, slot):
        assert lane == LANE
        self.calls.append(("free_slot", slot))

    def publish_snapshot(self, lane, f, slot, kind, tail_tokens, tail_page, finishing):
        assert lane == LANE
        self.calls.append(("publish", f, slot, kind, tuple(tail_tokens), tail_page, finishing))
        return SimpleNamespace(freed_pages=[], write=None, duplicate=f in self.duplicates)


class PublisherParts:
    def __init__(self):
        self.cache = RecordingCache()
        self.freed: list = []
        self.copies: list[tuple[int, int, int]] = []
        self.state_taps: list[tuple[int, int]] = []
        kv = SimpleNamespace(
            free=self.freed.extend, copy_prefix=lambda s, d, n: self.copies.append((s, d, n))
        )
        states = SimpleNamespace(
            snap_phys=SNAP_PHYS, tap=lambda a, b: self.state_taps.append((a, b))
        )
        budget = SimpleNamespace(headroom=lambda: 4, take=lambda n: [90 + i for i in range(n)])
        self.counters = EngineCounters()
        self.pub = Publisher(self.cache, kv, states, budget, None, self.counters)


def prefilled_lane(n: int, taps, computed: int) -> KVLane:
    """A lane of an n-token prompt, prefilled to `computed` (its full blocks committed), state
    slot 3, pages 50, 51, ... (private until committed)."""
    job = Request("r", list(range(1000, 1000 + n)), greedy(4), PromptHints(), sink=None)
    lane = KVLane(job, LANE, 3, n, computed)
    lane.pages = [50 + i for i in range(6)]
    lane.private = [True] * 6
    lane.committed_blocks = computed // 64
    lane.taps = list(taps)
    return lane
