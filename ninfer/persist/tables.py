"""The prefix cache file's format (design §5.5): its header and tables, encoded and decoded.

Pure Python (no torch). Which blocks and snapshots go into a file, and which come back, is
`plan.py`'s; the slab bytes are moved by `payload.py`.

File layout (format 2; all integers little-endian):

    offset 0        fixed header  "<8sIIQQQQ": magic, format version, flags (0),
                                   meta_len, tables_len, n_slabs, payload_offset
                    meta          meta_len bytes of JSON: {"fingerprint": {...},
                                   "geometry": {...}}
                    tables        "<II" n_blocks, n_snapshots
                                   block table     n_blocks x ("<iIQ" parent, slab, extra
                                                   + 256 bytes of tokens), parents first
                                   snapshot table  n_snapshots x ("<iIIiHB" anchor, frontier,
                                                   hits, tail_slab, tail_len, kind
                                                   (bit 7: superseded; format 1 has none)
                                                   + image_slabs x "<I" image slabs in order
                                                   + tail_len x "<i" tail tokens)
                                   slab checksums  n_slabs x "<Q" (xxh3_64 of each slab)
                    checksum      "<Q" xxh3_64 of fixed header + meta + tables
                    zero padding to payload_offset (a multiple of 4 KiB)
    payload_offset  slab bytes    n_slabs x slab_bytes: file slab i at payload_offset +
                                   i * slab_bytes (its n_fa cells in layer order)
    end             file size == payload_offset + n_slabs * slab_bytes

`parent` and `anchor` are block-table indices (-1 = the root). A slab index is a file slab:
every file slab belongs to exactly one block, image position or tail. The header and tables
come before any slab byte, so a loader decides what to restore before it reads slabs.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import BinaryIO

import xxhash

from ninfer.cache.common import BLOCK_BYTES, TOKEN_BYTES, SnapshotKind, ceil_div
from ninfer.cache.host_pool import SlabGeometry
from ninfer.page import PAGE_SIZE

MAGIC = b"NINFHPC\x00"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
SUPERSEDED_BIT = 0x80  # in a snapshot's kind byte (format 2)
PAYLOAD_ALIGN = 4096

_FIXED = struct.Struct("<8sIIQQQQ")
_COUNTS = struct.Struct("<II")
_BLOCK = struct.Struct("<iIQ")
_SNAP = struct.Struct("<iIIiHB")
_SUM = struct.Struct("<Q")


class PersistError(ValueError):
    """The file cannot be used; the message says why (damaged or foreign)."""


@dataclass(frozen=True, slots=True)
class BlockRecord:
    parent: int  # block-table index, -1 = root
    slab: int  # file slab
    extra: int
    tokens: bytes  # 256 bytes


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    anchor: int  # block-table index, -1 = root
    frontier: int
    hits: int
    kind: int
    tail: bytes  # packed tail tokens
    tail_slab: int  # file slab, -1 without a tail
    image_slabs: tuple[int, ...]  # file slabs, in image order
    superseded: bool = False  # §9.3: reloaded superseded, so Host eviction takes it first

    @property
    def n_slabs(self) -> int:
        return len(self.image_slabs) + (self.tail_slab >= 0)


@dataclass(slots=True)
class Tables:
    """Decoded header and tables of one file (or the tables a save is about to write)."""

    meta: dict
    blocks: list[BlockRecord]
    snapshots: list[SnapshotRecord]
    slab_sums: list[int]  # per file slab
    payload_offset: int = 0

    @property
    def n_slabs(self) -> int:
        return len(self.slab_sums)


def encode(tables: Tables) -> bytes:
    """Fixed header + meta + tables + checksum + padding: the bytes before the payload.
    Sets `tables.payload_offset`; its length never depends on the checksum values."""
    meta = json.dumps(tables.meta, sort_keys=True).encode()
    parts = [_COUNTS.pack(len(tables.blocks), len(tables.snapshots))]
    for b in tables.blocks:
        parts += [_BLOCK.pack(b.parent, b.slab, b.extra), b.tokens]
    for s in tables.snapshots:
        tail_len = len(s.tail) // TOKEN_BYTES
        kind = s.kind | (SUPERSEDED_BIT if s.superseded else 0)
        parts.append(_SNAP.pack(s.anchor, s.frontier, s.hits, s.tail_slab, tail_len, kind))
        parts += [struct.pack(f"<{len(s.image_slabs)}I", *s.image_slabs), s.tail]
    parts.append(struct.pack(f"<{len(tables.slab_sums)}Q", *tables.slab_sums))
    body = b"".join(parts)
    head_len = _FIXED.size + len(meta) + len(body) + _SUM.size
    offset = ceil_div(head_len, PAYLOAD_ALIGN) * PAYLOAD_ALIGN
    tables.payload_offset = offset
    fixed = _FIXED.pack(MAGIC, FORMAT_VERSION, 0, len(meta), len(body), tables.n_slabs, offset)
    digest = xxhash.xxh3_64_intdigest(fixed + meta + body)
    return fixed + meta + body + _SUM.pack(digest) + bytes(offset - head_len)


# ---- load side ----------------------------------------------------------------------------


def decode(f: BinaryIO, file_size: int) -> Tables:
    """Read and check the header and tables (not the payload). Raises PersistError naming
    what is wrong: bad magic or version, a truncated file, a bad checksum, bad tables."""
    raw = f.read(_FIXED.size)
    if len(raw) < _FIXED.size:
        raise PersistError("truncated header")
    magic, version, _flags, meta_len, tables_len, n_slabs, offset = _FIXED.unpack(raw)
    if magic != MAGIC:
        raise PersistError("not a ninfer prefix cache file (bad magic)")
    if version not in READABLE_VERSIONS:
        raise PersistError(f"format version {version}, this ninfer reads {READABLE_VERSIONS}")
    head_len = _FIXED.size + meta_len + tables_len + _SUM.size
    if head_len > offset or offset > file_size:
        raise PersistError("truncated tables")
    rest = f.read(meta_len + tables_len + _SUM.size)
    if len(rest) < meta_len + tables_len + _SUM.size:
        raise PersistError("truncated tables")
    meta_b, body = rest[:meta_len], rest[meta_len : meta_len + tables_len]
    (digest,) = _SUM.unpack(rest[meta_len + tables_len :])
    if xxhash.xxh3_64_intdigest(raw + meta_b + body) != digest:
        raise PersistError("table checksum mismatch (damaged file)")
    try:
        meta = json.loads(meta_b)
        tables = _parse_body(meta, body, n_slabs, flags=version >= 2)
        slab_bytes = int(meta["geometry"]["slab_bytes"])
    except (ValueError, KeyError, TypeError, struct.error) as e:
        raise PersistError(f"bad tables: {e!r}") from None
    tables.payload_offset = offset
    if file_size != offset + n_slabs * slab_bytes:
        raise PersistError(
            f"size {file_size} B does not match its tables ({offset + n_slabs * slab_bytes} B): "
            "truncated or extended"
        )
    return tables


def _parse_body(meta: dict, body: bytes, n_slabs: int, flags: bool = True) -> Tables:
    k = int(meta["geometry"]["image_slabs"])
    n_blocks, n_snaps = _COUNTS.unpack_from(body, 0)
    off = _COUNTS.size
    blocks, depth = [], []
    for i in range(n_blocks):
        parent, slab, extra = _BLOCK.unpack_from(body, off)
        off += _BLOCK.size
        tokens = body[off : off + BLOCK_BYTES]
        off += BLOCK_BYTES
        if not -1 <= parent < i or len(tokens) != BLOCK_BYTES:
            raise ValueError(f"block {i}: parent {parent} is not an earlier block")
        depth.append(0 if parent < 0 else depth[parent] + 1)
        blocks.append(BlockRecord(parent, slab, extra, tokens))
    snaps, keys = [], set()
    for i in range(n_snaps):
        anchor, frontier, hits, tail_slab, tail_len, kind = _SNAP.unpack_from(body, off)
        superseded = flags and bool(kind & SUPERSEDED_BIT)
        kind = kind & ~SUPERSEDED_BIT if flags else kind
        off += _SNAP.size
        image = struct.unpack_from(f"<{k}I", body, off)
        off += 4 * k
        tail = body[off : off + tail_len * TOKEN_BYTES]
        off += tail_len * TOKEN_BYTES
        snap = SnapshotRecord(anchor, frontier, hits, kind, tail, tail_slab, image, superseded)
        _check_snapshot(i, snap, tail_len, depth, keys)
        snaps.append(snap)
    sums = list(struct.unpack_from(f"<{n_slabs}Q", body, off))
    if off + 8 * n_slabs != len(body):
        raise ValueError("table length disagrees with its counts")
    used = [b.slab for b in blocks]
    for s in snaps:
        used += [*s.image_slabs, *([s.tail_slab] if s.tail_slab >= 0 else [])]
    if sorted(used) != list(range(n_slabs)):
        raise ValueError("file slabs are not each used exactly once")
    return Tables(meta, blocks, snaps, sums)


def _check_snapshot(i: int, s: SnapshotRecord, tail_len: int, depth: list[int], keys: set) -> None:
    """ValueError unless snapshot `i` fits the blocks' `depth` and adds a new key to `keys`."""
    n_blocks = len(depth)
    d = depth[s.anchor] if 0 <= s.anchor < n_blocks else -1  # out of range: refused below
    if not -1 <= s.anchor < n_blocks or s.frontier != PAGE_SIZE * (d + 1) + tail_len:
        raise ValueError(f"snapshot {i}: anchor {s.anchor} / frontier {s.frontier} disagree")
    bad_kind = s.kind > max(SnapshotKind)
    if tail_len >= PAGE_SIZE or (s.tail_slab >= 0) != (tail_len > 0) or bad_kind:
        raise ValueError(f"snapshot {i}: bad tail or kind")
    if (s.anchor, s.tail) in keys:
        raise ValueError(f"snapshot {i}: duplicate (anchor, tail)")
    keys.add((s.anchor, s.tail))
    SnapshotKind(s.kind)


def check_compatible(tables: Tables, fingerprint: dict, geometry: SlabGeometry) -> None:
    """PersistError naming what differs when the file was made by another checkpoint, dtype,
    RoPE setting, ninfer version or Host geometry."""
    theirs = tables.meta.get("fingerprint", {})
    diff = sorted(k for k in set(theirs) | set(fingerprint) if theirs.get(k) != fingerprint.get(k))
    if diff:
        raise PersistError(f"made for another engine ({', '.join(diff)} differ)")
    g = tables.meta.get("geometry", {})
    gdiff = sorted(k for k, v in geometry.file_dict().items() if g.get(k) != v)
    if gdiff:
        raise PersistError(f"another Host geometry ({', '.join(gdiff)} differ)")
