"""Plain data exchanged between the PrefixIndex and the engine (docs/cache-api.md)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from ninfer.cache.common import SnapshotKind, ceil_div
from ninfer.cache.host_pool import SlabGeometry, cut_slabs
from ninfer.cache.keys import PromptBlocks
from ninfer.cache.taps import TapConfig


@dataclass(slots=True, frozen=True)
class CacheConfig:
    """Sizes the index needs; none of them assumes a KV dtype.

    slab_bytes: one Host slab = one block bundle (every full-attention layer's page of the
    block) rounded up to 4 KiB. image_bytes: one snapshot StateImage. host_cache_bytes: the
    Host tier (0 = Device only). device_snapshot_slots: D. host: the Host tier's geometry
    when the engine computed it (`for_host`: the sizes above are then read from it).
    """

    slab_bytes: int
    image_bytes: int
    host_cache_bytes: int
    device_snapshot_slots: int
    host_chunk_bytes: int = 4 << 30
    taps: TapConfig = TapConfig()
    host: SlabGeometry | None = None

    @classmethod
    def for_host(
        cls, geometry: SlabGeometry, device_snapshot_slots: int, taps: TapConfig | None = None
    ) -> CacheConfig:
        """The config of an index over the Host tier `geometry` (the engine's one geometry)."""
        g = geometry
        return cls(
            slab_bytes=g.slab_bytes,
            image_bytes=g.image_bytes,
            host_cache_bytes=g.total_bytes,
            device_snapshot_slots=device_snapshot_slots,
            host_chunk_bytes=g.slabs_per_chunk * g.slab_bytes,
            taps=TapConfig() if taps is None else taps,
            host=g,
        )

    @property
    def image_slabs(self) -> int:
        return ceil_div(self.image_bytes, self.slab_bytes)

    def host_geometry(self) -> SlabGeometry | None:
        """The Host tier's geometry: `host` when given, else host_cache_bytes cut into
        slab_bytes slabs (`cut_slabs`); None without a Host tier."""
        if self.host is not None:
            return self.host
        if not self.host_cache_bytes:
            return None
        return cut_slabs(
            self.host_cache_bytes, self.slab_bytes, self.host_chunk_bytes, self.image_bytes
        )


class Readiness(enum.IntEnum):
    READY = 0
    TEMPORARILY_BLOCKED = 1  # active entitlements hold the pages: retry later
    PERMANENTLY_INFEASIBLE = 2  # does not fit even on an empty cache


class MatchResult(NamedTuple):
    path: list[int]  # node ids N_0 .. N_{k-1}
    candidates: list[int]  # valid snapshot ids on the path, deepest first
    cached_prefix_tokens: int  # 64 * k


@dataclass(slots=True, frozen=True)
class QuoteParams:
    entitlement_pages: int  # the lane's whole page entitlement from position 0
    free_pages: int  # free Device pages now
    total_pages: int  # Device pool size (for PermanentlyInfeasible)


@dataclass(slots=True)
class SourceCost:
    source: int | None  # snapshot id, None = root
    frontier: int
    restore_blocks: int
    restore_tail: bool
    restore_image: bool
    restore_bytes: int
    need_pages: int
    evictable_pages: int
    cost_s: float


@dataclass(slots=True)
class Quote:
    readiness: Readiness
    source: int | None
    frontier: int  # F: tokens the lane does not prefill (cached_tokens)
    need_pages: int
    restore_blocks: int
    restore_tail: bool
    restore_image: bool
    restore_bytes: int
    cached_prefix_tokens: int
    cost_s: float
    epoch: int
    prompt: PromptBlocks
    match: MatchResult
    considered: list[SourceCost] = field(default_factory=list)


@dataclass(slots=True)
class Staged:
    """What the memory layer does after `stage`: free `evicted_pages`, then allocate
    `restore_pages_needed` pages and call `begin_restore` (required when that count is nonzero
    or `restore_image`); copy the state from `source_slot` (Device) or let the restore bring
    it; COW the tail from `source_tail_page` (or the restored tail page) when `frontier % 64`."""

    lane: int
    source: int | None
    frontier: int
    path: list[int]
    evicted_pages: list[int]
    restore_pages_needed: int
    source_slot: int  # -1 when the image is Host-only (or root)
    source_tail_page: int  # -1 when no tail or the tail is Host-only (restored)
    hit_tier: str  # "device" | "host" | "root"
    restore_image: bool  # the image comes from Host slabs: begin_restore is required


class BlockCopy(NamedTuple):
    node: int
    page: int
    slab: int


class TailCopy(NamedTuple):
    snapshot: int
    page: int
    slab: int


class ImageCopy(NamedTuple):
    snapshot: int
    slabs: list[int]  # byte o of the image lives in slabs[o // slab_bytes]


@dataclass(slots=True)
class RestoreBatch:
    batch_id: int
    blocks: list[BlockCopy]  # block order
    tail: TailCopy | None
    image: ImageCopy | None  # into the lane's own active state slot
    bytes: int


@dataclass(slots=True)
class BlockWriteBatch:
    batch_id: int
    blocks: list[BlockCopy]  # block order
    bytes: int


@dataclass(slots=True)
class SnapshotWrite:
    batch_id: int
    snapshot: int
    slot: int
    slabs: list[int]
    tail_page: int  # -1 without a tail
    tail_slab: int
    bytes: int


class CommitKind(enum.IntEnum):
    INSERTED = 0  # the new node owns the page (cache-owned now)
    DUPLICATE = 1  # the page stays lane-private: free it at release
    ADOPTED = 2  # a Host-only node took the page as its Device copy (cache-owned now)


class CommitResult(NamedTuple):
    kind: CommitKind
    node: int


class SlotGrant(NamedTuple):
    slot: int
    displaced: int | None  # snapshot that lost the slot
    displaced_deleted: bool
    freed_pages: list[int]  # tail pages of deleted snapshots: return them to the free list


class PublishResult(NamedTuple):
    snapshot: int
    duplicate: bool  # the slot was freed by the index; tail_page stays the engine's
    write: SnapshotWrite | None
    freed_pages: list[int]  # pages freed by Host eviction (tails of deleted snapshots)


class ReleaseResult(NamedTuple):
    write: BlockWriteBatch | None
    lru_added: list[int]  # node ids that became evictable, in LRU order
    freed_pages: list[int]


@dataclass(slots=True)
class LaneRecord:
    """The index's view of one active sequence."""

    id: int
    path: list[int]  # pinned node ids in block order
    base: int  # F_s
    source: int | None
    source_kind: SnapshotKind | None
    existing: list[int]  # frontiers of valid snapshots on the prompt path at stage
    activated: bool = False
    source_pinned: bool = False
    source_superseded: bool = False
    last_tap: int | None = None
    latest_frontier: int = 0
    staging: set[int] = field(default_factory=set)
    # per staging slot: the snapshots its allocation superseded, retained again if it is freed
    superseded_for: dict[int, list[int]] = field(default_factory=dict)
    restore_batch: int | None = None
    restore_required: bool = False  # Host-only parts not yet handed to begin_restore


@dataclass(slots=True)
class TransferRecord:
    """An in-flight transfer batch and the objects the index pinned for it."""

    kind: str  # "restore" | "blocks" | "snapshot"
    nodes: list[int] = field(default_factory=list)
    snapshot: int | None = None
    tail: bool = False
    lane: int | None = None
