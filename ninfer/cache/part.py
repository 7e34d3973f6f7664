"""The base of the PrefixIndex's parts (index.py): each runs a piece of the lane protocol over
the three stores, the liveness rules and the registry it is built with, and never holds the
index itself."""

from __future__ import annotations

from ninfer.cache.blocks import BlockStore
from ninfer.cache.host_tier import HostTier
from ninfer.cache.liveness import Liveness
from ninfer.cache.records import CacheConfig
from ninfer.cache.registry import Registry
from ninfer.cache.snapshot_store import SnapshotStore


class IndexPart:
    def __init__(
        self,
        config: CacheConfig,
        blocks: BlockStore,
        snapshots: SnapshotStore,
        host_tier: HostTier,
        liveness: Liveness,
        registry: Registry,
    ) -> None:
        self.config, self.blocks, self.snapshots = config, blocks, snapshots
        self.host_tier, self.liveness, self.registry = host_tier, liveness, registry
