"""Block identity keys (design §5.1): packed token bytes, chained lookup hashes, media keys.

Pure functions, safe to run off the engine loop (the frontend computes them while preparing a
prompt). A lookup hash only *selects* a candidate node; the tree compares the 256 token bytes
and the extra key exactly on every hit, so a hash collision can cost a probe but never a false
hit.

The chain is `lookup_hash(b) = xxh3_64(lookup_hash(b-1) || tokens || extra)` with the
parent hash entering as xxh3's 64-bit seed instead of 8 prefixed bytes: each block's bytes are
hashed as they are, with no concatenation (`tools/bench_cache.py` times the hashing). The prompt is
split into per-block bytes once (`PromptBlocks.blocks`), which hashing and the tree walk share.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

from ninfer.cache.common import BLOCK_BYTES, Span
from ninfer.page import PAGE_SIZE

HASH_SEED = 0x9E3779B97F4A7C15  # lookup_hash(-1)

_xxh3 = xxhash.xxh3_64_intdigest


def pack_tokens(tokens: Sequence[int] | bytes | bytearray) -> bytes:
    """Token ids as little-endian int32 bytes (4 per token). Bytes pass through unchanged."""
    if isinstance(tokens, (bytes, bytearray)):
        return bytes(tokens)
    return struct.pack(f"<{len(tokens)}i", *tokens)


def block_hash(parent_hash: int, block: bytes | memoryview, extra: int = 0) -> int:
    """lookup_hash of one block given its parent's hash (HASH_SEED for block 0)."""
    if extra:
        return _xxh3(bytes(block) + extra.to_bytes(8, "little"), parent_hash)
    return _xxh3(block, parent_hash)


def split_blocks(data: bytes) -> list[bytes]:
    """The 256-byte token blocks of packed `data` (full blocks only)."""
    return [data[o : o + BLOCK_BYTES] for o in range(0, len(data) - BLOCK_BYTES + 1, BLOCK_BYTES)]


def hash_blocks(blocks: Sequence[bytes], extras: Sequence[int] | None = None) -> list[int]:
    """Chained lookup hashes of `blocks`; `extras[b]` is block b's media key (0 = none)."""
    out: list[int] = []
    append = out.append
    h = HASH_SEED
    if not extras or not any(extras):
        for blk in blocks:  # hot path (text prompts): one xxh3 call per block
            h = _xxh3(blk, h)
            append(h)
        return out
    for blk, extra in zip(blocks, extras, strict=True):
        h = block_hash(h, blk, extra)
        append(h)
    return out


def block_hashes(data: bytes, extras: Sequence[int] | None = None) -> list[int]:
    """Chained lookup hashes of every *full* block of packed `data`."""
    return hash_blocks(split_blocks(data), extras)


@dataclass(slots=True, frozen=True)
class MediaItem:
    """One Vision item of a prompt: its content digest and where its placeholder tokens lie."""

    digest: bytes  # 32-byte content digest
    modality: int
    grid: tuple[int, ...]
    begin: int  # first placeholder token position
    length: int  # placeholder token count

    def encode(self) -> bytes:
        grid = struct.pack(f"<{len(self.grid)}I", *self.grid)
        return (
            self.digest
            + struct.pack("<BIqq", self.modality, len(self.grid), self.begin, self.length)
            + grid
        )


def media_block_extras(n_tokens: int, items: Sequence[MediaItem]) -> list[int]:
    """media_key(b) for every full block b of an n-token prompt (design §5.1).

    Block b covers [64b, 64b+64). Its key is 0 unless some item's span overlaps it; then it is
    xxh3_64 over every item that begins before the block's end (earlier items shift later MRoPE
    positions through rope_delta, so they are part of the identity):

        items      |--img0--|        |----img1----|
        blocks   | b0 | b1 | b2 | b3 | b4 | b5 | b6 | b7 |
        key        k(0) k(0)  0    k(01) k(01) k(01) 0 ...
    """
    ordered = sorted(items, key=lambda m: m.begin)
    extras = [0] * (n_tokens // PAGE_SIZE)
    for b in range(len(extras)):
        lo, hi = b * PAGE_SIZE, (b + 1) * PAGE_SIZE
        if not any(m.begin < hi and lo < m.begin + m.length for m in ordered):
            continue
        extras[b] = _xxh3(b"".join(m.encode() for m in ordered if m.begin < hi)) or 1
    return extras


@dataclass(slots=True)
class PromptBlocks:
    """A prompt prepared for the cache: packed tokens, per-block hashes and media keys."""

    data: bytes
    n_tokens: int
    hashes: list[int]
    extras: list[int] = field(default_factory=list)  # empty = all zero
    vision_spans: tuple[Span, ...] = ()
    blocks: list[bytes] = field(default_factory=list)  # split_blocks(data), filled if empty

    def __post_init__(self) -> None:
        if not self.blocks:
            self.blocks = split_blocks(self.data)

    def extra(self, b: int) -> int:
        return self.extras[b] if self.extras else 0


def prepare_prompt(tokens: Sequence[int] | bytes, media: Sequence[MediaItem] = ()) -> PromptBlocks:
    """Pack, key and hash a prompt (tokens as ids or as pack_tokens bytes)."""
    data = pack_tokens(tokens)
    n = len(data) // 4
    extras = media_block_extras(n, media) if media else []
    spans = tuple(Span(m.begin, m.length) for m in sorted(media, key=lambda m: m.begin))
    blocks = split_blocks(data)
    return PromptBlocks(data, n, hash_blocks(blocks, extras), extras, spans, blocks)
