"""The Host tier (design §5.4, §9.3): the slab pool and the GDSF priorities of the snapshots.

    H(s) = L_s + F(s) * C(s) / Z(s)
    C(s) = max(0, prefill_seconds(base=F_a, tokens=F_s - F_a) - restore_seconds(image_bytes))
           a = nearest retained snapshot above s on its path (F_a = 0 at the root)
    Z(s) = image_bytes + tail slab bytes + exclusive_path_bytes(s)
           exclusive path: Host bytes of the nodes on path(s) whose only retained snapshot
           below is s (the chain from the anchor up to the first node shared with another)
    F(s) = 1 + hits(s)

Cached H values are recomputed lazily: every event that can change C or Z of a snapshot marks
its id dirty (`mark`), and victim selection flushes the dirty set first. L only rises: after a
GDSF eviction L := max(L, H(victim)) (`charge`).

Owns: the `HostSlabPool` over the one `SlabGeometry` (`pool`, None without a Host tier), the
clock `L`, the dirty set and each snapshot's cached `h` (written only here). Reads, never
writes: the block tree (exclusive path bytes) and the snapshot records (ancestor links, hits,
residency). Which node or snapshot holds a slab is the records'; the §9.3 order across stores
(dead KV, then superseded snapshots, then GDSF) and every deletion are the PrefixIndex's.
"""

from __future__ import annotations

from collections.abc import Callable

from ninfer.cache.common import ROOT, Residency
from ninfer.cache.cost import CacheCostModel
from ninfer.cache.host_pool import HostSlabPool, SlabGeometry, check_host_budget
from ninfer.cache.records import CacheConfig
from ninfer.cache.snapshots import Snapshot
from ninfer.cache.tree import BlockTree
from ninfer.page import PAGE_SIZE

_ABSENT, _RESIDENT = Residency.ABSENT, Residency.RESIDENT


class HostTier:
    """Invariants (check_invariants): the pool's own (every slab free or allocated, once), and
    every retained snapshot's cached H equals a recomputation once the dirty set is flushed."""

    def __init__(
        self,
        config: CacheConfig,
        cost: CacheCostModel,
        tree: BlockTree,
        snaps: dict[int, Snapshot],
        host_pool: Callable[[SlabGeometry], HostSlabPool] = HostSlabPool,
    ) -> None:
        self._config, self._cost = config, cost
        self._tree, self._snaps = tree, snaps
        self.pool: HostSlabPool | None = None
        geometry = config.host_geometry()
        if geometry is not None:
            check_host_budget(geometry, "host_cache_bytes", config.host_cache_bytes)
            self.pool = host_pool(geometry)
        self.L = 0.0
        self.dirty: set[int] = set()  # snapshots whose cached H is stale

    def set_cost(self, cost: CacheCostModel) -> None:
        """Value with `cost` from now on (cached H values are recomputed when next marked)."""
        self._cost = cost

    # ---- slabs ---------------------------------------------------------------------------

    @property
    def free_slabs(self) -> int:
        return self.pool.free_slabs if self.pool is not None else 0

    @property
    def n_slabs(self) -> int:
        return self.pool.n_slabs if self.pool is not None else 0

    def allocate(self, k: int) -> list[int] | None:
        """k free slabs (lowest first), or None (nothing changes) without enough free ones or
        without a Host tier. Never evicts: PrefixIndex frees room first."""
        return None if self.pool is None else self.pool.allocate(k)

    def free(self, slabs: list[int]) -> None:
        """Return slabs to the pool (ValueError on a slab not allocated)."""
        self.pool.free(slabs)

    # ---- GDSF priorities -----------------------------------------------------------------

    def mark(self, sid: int) -> None:
        """C or Z of snapshot `sid` may have changed: recompute its H before the next use."""
        self.dirty.add(sid)

    def forget(self, sid: int) -> None:
        """Snapshot `sid` is gone."""
        self.dirty.discard(sid)

    def charge(self, h: float) -> None:
        """A snapshot of priority `h` was evicted by value: L := max(L, h)."""
        self.L = max(self.L, h)

    def _retained_ancestor(self, s: Snapshot) -> Snapshot | None:
        snaps = self._snaps
        a = s.ancestor
        while a is not None and snaps[a].superseded:
            a = snaps[a].ancestor
        return None if a is None else snaps[a]

    def _exclusive_bytes(self, s: Snapshot) -> int:
        nodes, slab = self._tree.nodes, self._config.slab_bytes
        total = 0
        node = nodes[s.anchor]
        while node.id != ROOT and node.retained_below == 1:
            if node.host_state != _ABSENT:
                total += slab
            node = nodes[node.parent]
        return total

    def value(self, s: Snapshot) -> float:
        """H(s) from scratch (s retained). Read-only."""
        a = self._retained_ancestor(s)
        fa = 0 if a is None else a.frontier
        cfg, cost = self._config, self._cost
        c = max(
            0.0,
            cost.prefill_seconds(fa, s.frontier - fa) - cost.restore_seconds(cfg.image_bytes),
        )
        z = cfg.image_bytes + (cfg.slab_bytes if s.tail else 0) + self._exclusive_bytes(s)
        return s.l_at + (1 + s.hits) * c / z

    def estimate_new(self, previous: int, frontier: int, has_tail: bool) -> float:
        """§9.2 step 3: a new snapshot's H with no hits, owning the blocks since the lane's
        previous snapshot (or its base) at `previous`. Read-only."""
        cfg, cost = self._config, self._cost
        c = max(
            0.0,
            cost.prefill_seconds(previous, frontier - previous)
            - cost.restore_seconds(cfg.image_bytes),
        )
        blocks = frontier // PAGE_SIZE - previous // PAGE_SIZE
        z = cfg.image_bytes + (cfg.slab_bytes if has_tail else 0) + blocks * cfg.slab_bytes
        return self.L + c / z

    def flush(self) -> None:
        """Recompute the cached H of every dirty retained snapshot; empty the dirty set."""
        snaps = self._snaps
        for sid in self.dirty:
            s = snaps.get(sid)
            if s is not None and not s.superseded:
                s.h = self.value(s)
        self.dirty.clear()

    def revalue_all(self) -> None:
        """Recompute the cached H of every retained snapshot now."""
        self.dirty.update(self._snaps)
        self.flush()

    def victim(self) -> Snapshot | None:
        """The retained, unpinned, Host-resident snapshot of minimum (H, last hit, id), by the
        cached H (flush first). Read-only."""
        best = None
        for s in self._snaps.values():
            if s.superseded or s.restore_pins or s.host_state != _RESIDENT:
                continue
            if best is None or (s.h, s.last_hit, s.id) < (best.h, best.last_hit, best.id):
                best = s
        return best

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (flushes the dirty set)."""
        if self.pool is not None:
            self.pool.check_invariants()
        self.flush()
        for s in self._snaps.values():
            if not s.superseded:
                h = self.value(s)
                assert abs(s.h - h) <= 1e-9 * max(1.0, abs(h)), f"§9.3 stale H of snapshot {s.id}"
