"""The hybrid prefix cache index (design §5-§10): model-agnostic, pure Python, no torch.

It decides which blocks and snapshots exist and where their copies live; the engine's memory
layer moves the bytes. See docs/cache-api.md.
"""

from __future__ import annotations

from ninfer.cache.common import (
    ROOT,
    LaneError,
    Residency,
    SnapshotKind,
    Span,
    StaleQuoteError,
)
from ninfer.cache.cost import CacheCostModel
from ninfer.cache.host_pool import HostSlabPool
from ninfer.cache.index import PrefixIndex
from ninfer.cache.keys import (
    MediaItem,
    PromptBlocks,
    block_hashes,
    media_block_extras,
    pack_tokens,
    prepare_prompt,
)
from ninfer.cache.records import (
    BlockCopy,
    BlockWriteBatch,
    CacheConfig,
    CommitKind,
    CommitResult,
    ImageCopy,
    MatchResult,
    PublishResult,
    Quote,
    QuoteParams,
    Readiness,
    ReleaseResult,
    RestoreBatch,
    SlotGrant,
    SnapshotWrite,
    Staged,
    TailCopy,
)
from ninfer.cache.stats import CacheStats
from ninfer.cache.taps import HintKind, Placement, Tap, TapConfig, TapHint, plan_taps

__all__ = [
    "ROOT",
    "BlockCopy",
    "BlockWriteBatch",
    "CacheConfig",
    "CacheCostModel",
    "CacheStats",
    "CommitKind",
    "CommitResult",
    "HintKind",
    "HostSlabPool",
    "ImageCopy",
    "LaneError",
    "MatchResult",
    "MediaItem",
    "Placement",
    "PrefixIndex",
    "PromptBlocks",
    "PublishResult",
    "Quote",
    "QuoteParams",
    "Readiness",
    "ReleaseResult",
    "Residency",
    "RestoreBatch",
    "SlotGrant",
    "SnapshotKind",
    "SnapshotWrite",
    "Span",
    "Staged",
    "StaleQuoteError",
    "TailCopy",
    "Tap",
    "TapConfig",
    "TapHint",
    "block_hashes",
    "media_block_extras",
    "pack_tokens",
    "plan_taps",
    "prepare_prompt",
]
