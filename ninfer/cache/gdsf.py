"""Host tier eviction (spec §9.3): dead-KV sweep, superseded snapshots, then GDSF.

    H(s) = L_s + F(s) * C(s) / Z(s)
    C(s) = max(0, prefill_seconds(base=F_a, tokens=F_s - F_a) - restore_seconds(image_bytes))
           a = nearest retained snapshot above s on its path (F_a = 0 at the root)
    Z(s) = image_bytes + tail slab bytes + exclusive_path_bytes(s)
           exclusive path: Host bytes of the nodes on path(s) whose only retained snapshot
           below is s (the chain from the anchor up to the first node shared with another)
    F(s) = 1 + hits(s)

Cached H values are recomputed lazily: every event that can change C or Z of a snapshot adds
its id to `dirty`, and victim selection flushes the dirty set first. L only rises: after a GDSF
eviction L := max(L, H(victim)).
"""

from __future__ import annotations

from ninfer.cache.common import BLOCK_TOKENS, ROOT, Residency
from ninfer.cache.records import Lane
from ninfer.cache.snapshots import Snapshot

_ABSENT, _RESIDENT = Residency.ABSENT, Residency.RESIDENT


class GdsfMixin:
    def _exclusive_bytes(self, s: Snapshot) -> int:
        nodes, slab = self.tree.nodes, self.config.slab_bytes
        total = 0
        node = nodes[s.anchor]
        while node.id != ROOT and node.retained_below == 1:
            if node.host_state != _ABSENT:
                total += slab
            node = nodes[node.parent]
        return total

    def _value(self, s: Snapshot) -> float:
        """H(s) from scratch (s retained)."""
        a = self._retained_ancestor(s)
        fa = 0 if a is None else a.frontier
        cfg, cost = self.config, self.cost
        c = max(
            0.0,
            cost.prefill_seconds(fa, s.frontier - fa) - cost.restore_seconds(cfg.image_bytes),
        )
        z = cfg.image_bytes + (cfg.slab_bytes if s.tail else 0) + self._exclusive_bytes(s)
        return s.l_at + (1 + s.hits) * c / z

    def _estimate_new(self, lane: Lane, frontier: int, has_tail: bool) -> float:
        """§9.2 step 3: a new snapshot's H with no hits, owning the blocks since the lane's
        previous snapshot (or its base)."""
        cfg, cost = self.config, self.cost
        prev = lane.latest_frontier
        c = max(
            0.0,
            cost.prefill_seconds(prev, frontier - prev) - cost.restore_seconds(cfg.image_bytes),
        )
        blocks = frontier // BLOCK_TOKENS - prev // BLOCK_TOKENS
        z = cfg.image_bytes + (cfg.slab_bytes if has_tail else 0) + blocks * cfg.slab_bytes
        return self.L + c / z

    def _flush_dirty(self) -> None:
        snaps = self.snaps
        for sid in self.dirty:
            s = snaps.get(sid)
            if s is not None and not s.superseded:
                s.h = self._value(s)
        self.dirty.clear()

    def _host_victim(self) -> Snapshot | None:
        """The retained, unpinned, Host-resident snapshot of minimum (H, last hit, id)."""
        best = None
        for s in self.snaps.values():
            if s.superseded or s.restore_pins or s.host_state != _RESIDENT:
                continue
            if best is None or (s.h, s.last_hit, s.id) < (best.h, best.last_hit, best.id):
                best = s
        return best

    def _oldest_superseded_host(self) -> Snapshot | None:
        for sid in self.superseded:
            s = self.snaps[sid]
            if s.host_state == _RESIDENT and not s.restore_pins:
                return s
        return None

    def _sweep_dead_one(self) -> bool:
        """§9.3 step 1: reclaim one dead-KV slab (leaves first). False when none is dead."""
        nid = next(iter(self.dead), None)
        if nid is None:
            return False
        self.counters.host_dead_kv_reclaimed += 1
        self._drop_node_host(self.tree.nodes[nid])
        return True

    def _host_alloc(self, k: int, bound: float | None = None) -> list[int] | None:
        """k Host slabs, evicting as §9.3 orders, or None (and a partial eviction) if impossible.

        `bound`: an image write's own H; GDSF stops at a victim worth more (never inserts what
        it would evict next). Block writes pass None (not bounded).
        """
        host = self.host
        if host is None or k > host.n_slabs:
            return None
        while host.free_slabs < k:
            if self._sweep_dead_one():
                continue
            s = self._oldest_superseded_host()
            if s is not None:
                self.counters.host_superseded_evicted += 1
                self._delete_snapshot(s)  # both copies; L unchanged
                continue
            self._flush_dirty()
            v = self._host_victim()
            if v is None or (bound is not None and v.h > bound):
                if v is not None:
                    self.counters.host_image_writes_refused += 1
                self.counters.host_alloc_failures += 1
                return None
            self.L = max(self.L, v.h)
            self.counters.host_gdsf_evicted += 1
            if v.device_complete:
                self._drop_snapshot_host(v)  # still restorable from the Device
            else:
                self._delete_snapshot(v)
        return host.allocate(k)
