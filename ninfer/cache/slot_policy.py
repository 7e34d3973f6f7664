"""Device snapshot slot policy (design §9.2), run after the lineage's supersession (§9.3).

A tap or endpoint takes a slot in this order:
  1. a free slot;
  2. a superseded owner's slot, oldest supersession first (it keeps its Host copy, or is
     deleted without one);
  3. the lowest-H Device-only owner's slot, only if the new snapshot's estimate is at least
     as high (the owner is lost, L := its H);
  4. the least recently hit Host-backed owner's slot (it loses only its Device image).
Otherwise the tap is skipped. Pinned owners are never displaced.
"""

from __future__ import annotations

from ninfer.cache.common import LaneError, Residency, SnapshotKind
from ninfer.cache.part import IndexPart
from ninfer.cache.records import LaneRecord, SlotGrant
from ninfer.page import PAGE_SIZE

_ABSENT, _RESIDENT = Residency.ABSENT, Residency.RESIDENT


class SlotPolicy(IndexPart):
    """allocate_snapshot_slot and free_snapshot_slot of the PrefixIndex."""

    def _displace_slot(
        self, rec: LaneRecord, frontier: int, has_tail: bool
    ) -> tuple[int, int, bool] | None:
        """Steps 2-4 of §9.2. Returns (slot, displaced id, deleted) or None."""
        owned = self.snapshots.slot_owners()
        sup = [x for x in owned if x[1].superseded]
        if sup:
            _, s = min(sup, key=lambda x: (x[1].superseded_tick, x[1].id))
            deleted = s.host_state != _RESIDENT
            if deleted:
                self.liveness.delete_snapshot(s)  # no Host copy: the slot was its last image copy
            else:
                self.liveness.drop_snapshot_image_device(s)
            return self.snapshots.take_free_slot(), s.id, deleted
        device_only = [x for x in owned if x[1].host_state == _ABSENT]
        if device_only:
            self.host_tier.flush()
            _, v = min(device_only, key=lambda x: (x[1].h, x[1].last_hit, x[1].id))
            if self.host_tier.estimate_new(rec.latest_frontier, frontier, has_tail) >= v.h:
                self.host_tier.charge(v.h)
                self.liveness.delete_snapshot(v)
                return self.snapshots.take_free_slot(), v.id, True
        backed = [x for x in owned if x[1].host_state == _RESIDENT]
        if backed:
            _, v = min(backed, key=lambda x: (x[1].last_hit, x[1].id))
            self.liveness.drop_snapshot_image_device(v)
            return self.snapshots.take_free_slot(), v.id, False
        return None

    def allocate_snapshot_slot(
        self, lane: int, frontier: int, kind: SnapshotKind
    ) -> SlotGrant | None:
        """A staging Device slot for a tap or endpoint at `frontier` of `lane` (§9.2).

        First supersedes the lane's lineage (§9.3: the snapshot it resumed from; its previous
        tap when the new one is a tap). Returns SlotGrant or None (skip, counted).
        """
        rec = self.registry.lane(lane)
        self.registry.mutated()
        superseded: list[int] = []
        if rec.source is not None and not rec.source_superseded and frontier > rec.base:
            s = self.snapshots.by_id.get(rec.source)
            if s is not None and self.liveness.supersede(s):
                superseded.append(s.id)
            rec.source_superseded = True
        if SnapshotKind(kind).is_tap and rec.last_tap is not None:
            s = self.snapshots.by_id.get(rec.last_tap)
            if s is not None and s.frontier < frontier and self.liveness.supersede(s):
                superseded.append(s.id)
        slot = self.snapshots.take_free_slot()
        displaced, deleted = None, False
        if slot is None:
            got = self._displace_slot(rec, frontier, frontier % PAGE_SIZE != 0)
            if got is None:
                self.registry.counters.taps_skipped_no_slot += 1
                self._unsupersede(rec, superseded)
                return None
            slot, displaced, deleted = got
            self.registry.counters.slot_displaced += 1
        self.snapshots.stage_slot(slot, lane)
        rec.staging.add(slot)
        if superseded:
            rec.superseded_for[slot] = superseded
        return SlotGrant(slot, displaced, deleted, self.blocks.take_freed())

    def free_snapshot_slot(self, lane: int, slot: int) -> None:
        """Return a staging slot the lane will not publish (a dropped tap)."""
        rec = self.registry.lane(lane, None)
        if slot not in rec.staging:
            raise LaneError(f"slot {slot} is not staged by lane {lane}")
        self.registry.mutated()
        rec.staging.discard(slot)
        self.snapshots.release_slot(slot)
        self._unsupersede(rec, rec.superseded_for.pop(slot, ()))

    def _unsupersede(self, rec: LaneRecord, ids) -> None:
        """A skipped or dropped tap is no deeper snapshot: what its allocation superseded stays
        the lineage's resume point (§9.3), unless the allocation displaced it already."""
        for sid in ids:
            s = self.snapshots.by_id.get(sid)
            if s is not None:
                self.liveness.retain(s)
            if sid == rec.source:
                rec.source_superseded = False
