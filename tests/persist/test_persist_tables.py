"""The prefix cache file's header and tables (`ninfer/persist/tables.py`, spec §5.5): the exact
bytes `encode` writes, what `decode` reads back, every way `decode` refuses a file (the exact
`PersistError` message, naming the field), and what `check_compatible` names as different."""

from __future__ import annotations

import io
import json
import struct

import pytest
import xxhash

from ninfer.cache.common import SnapshotKind
from ninfer.cache.host_pool import SlabGeometry
from ninfer.persist import tables
from ninfer.persist.tables import BlockRecord, PersistError, SnapshotRecord, Tables

GEOMETRY = SlabGeometry(2, 2048, 4096, 40, 5, 6000, 2)  # 4096-byte slabs, 2-slab images
SLAB = GEOMETRY.slab_bytes
FINGERPRINT = {"dtype": "float32", "model": {"checkpoint": "test"}, "format_version": 1}
FIXED = struct.Struct("<8sIIQQQQ")
FIELDS = ("magic", "version", "flags", "meta_len", "tables_len", "n_slabs", "offset")


def toks(seed: int, n: int) -> bytes:
    return struct.pack(f"<{n}i", *(seed * 1000 + i for i in range(n)))


def meta() -> dict:
    return {"fingerprint": dict(FINGERPRINT), "geometry": GEOMETRY.file_dict()}


def sample() -> Tables:
    """3 blocks (two below the root, one below block 0) and 4 snapshots: a Boundary on the
    root with a 10-token tail in file slab 0, a superseded Tap and an Endpoint with a 1-token
    tail on block 1, a Tap with a 63-token tail on block 0; 14 file slabs."""
    blocks = [
        BlockRecord(-1, 3, 0, toks(1, 64)),
        BlockRecord(0, 4, 7, toks(2, 64)),
        BlockRecord(-1, 5, 2**40, toks(3, 64)),
    ]
    snaps = [
        SnapshotRecord(-1, 10, 3, SnapshotKind.BOUNDARY, toks(4, 10), 0, (1, 2)),
        SnapshotRecord(1, 128, 0, SnapshotKind.TAP, b"", -1, (6, 7), superseded=True),
        SnapshotRecord(1, 129, 2**31, SnapshotKind.ENDPOINT, toks(5, 1), 10, (8, 9)),
        SnapshotRecord(0, 127, 1, SnapshotKind.TAP, toks(6, 63), 13, (11, 12)),
    ]
    sums = [(i + 1) * 0x9E3779B97F4A7C15 % 2**64 for i in range(14)]
    return Tables(meta(), blocks, snaps, sums)


def decode(head: bytes, file_size: int | None = None) -> Tables:
    """decode() of a file whose payload is as long as its header says (unless `file_size`)."""
    if file_size is None:
        fields = FIXED.unpack_from(head)
        file_size = fields[6] + fields[5] * SLAB
    return tables.decode(io.BytesIO(head), file_size)


def forge(head: bytes, body: bytes | None = None, **fields) -> bytes:
    """The header `head` with some fixed fields (or its tables) replaced, checksummed again:
    what another writer could have written. Padded to its payload offset when that is later."""
    vals = dict(zip(FIELDS, FIXED.unpack_from(head), strict=True))
    start = FIXED.size + vals["meta_len"]
    meta_b = head[FIXED.size : start]
    if body is None:
        body = head[start : start + vals["tables_len"]]
    vals["tables_len"] = len(body)
    vals.update(fields)
    fixed = FIXED.pack(*vals.values())
    out = fixed + meta_b + body + struct.pack("<Q", xxhash.xxh3_64_intdigest(fixed + meta_b + body))
    return out + bytes(max(0, vals["offset"] - len(out)))


# ---- what encode writes -------------------------------------------------------------------


def test_encode_writes_the_documented_layout():
    t = sample()
    head = tables.encode(t)
    meta_b = json.dumps(meta(), sort_keys=True).encode()
    body = struct.pack("<II", 3, 4)
    for b in t.blocks:
        body += struct.pack("<iIQ", b.parent, b.slab, b.extra) + b.tokens
    for s, kind_byte in zip(t.snapshots, (2, 0x80, 1, 0), strict=True):
        tail_len = len(s.tail) // 4
        body += struct.pack(
            "<iIIiHB", s.anchor, s.frontier, s.hits, s.tail_slab, tail_len, kind_byte
        )
        body += struct.pack("<2I", *s.image_slabs) + s.tail
    body += struct.pack("<14Q", *t.slab_sums)
    fixed = FIXED.pack(b"NINFHPC\x00", 2, 0, len(meta_b), len(body), 14, 4096)
    checked = fixed + meta_b + body
    digest = struct.pack("<Q", xxhash.xxh3_64_intdigest(checked))
    assert head == checked + digest + bytes(4096 - len(checked) - 8)
    assert t.payload_offset == 4096 == len(head)


def test_encode_pads_to_the_next_page_and_sets_the_payload_offset():
    t = Tables({**meta(), "pad": "x" * 5000}, [], [], [])
    head = tables.encode(t)
    assert len(head) == t.payload_offset == 8192
    assert FIXED.unpack_from(head)[6] == 8192
    assert head[-100:] == bytes(100)


def test_a_header_that_fills_its_page_exactly_has_no_padding():
    base = tables.encode(Tables({**meta(), "pad": ""}, [], [], []))
    meta_len = FIXED.unpack_from(base)[3]
    head_len = FIXED.size + meta_len + 8 + 8  # empty tables: the two counts, then the checksum
    t = Tables({**meta(), "pad": "x" * (4096 - head_len)}, [], [], [])
    head = tables.encode(t)
    assert len(head) == t.payload_offset == 4096
    assert head[-8:] == struct.pack("<Q", xxhash.xxh3_64_intdigest(head[:-8]))
    assert decode(head) == t


def test_the_header_does_not_depend_on_the_meta_key_order():
    reordered = {
        "geometry": dict(reversed(list(GEOMETRY.file_dict().items()))),
        "fingerprint": dict(reversed(list(FINGERPRINT.items()))),
    }
    t = sample()
    assert tables.encode(Tables(reordered, t.blocks, t.snapshots, t.slab_sums)) == tables.encode(t)


# ---- what decode reads back ---------------------------------------------------------------


def test_decode_reads_back_every_record_exactly():
    t = sample()
    back = decode(tables.encode(t))
    assert back == t  # meta, blocks, snapshots (flags included), checksums, payload offset
    assert [s.kind for s in back.snapshots] == [2, 0, 1, 0]
    assert [s.superseded for s in back.snapshots] == [False, True, False, False]
    assert [s.n_slabs for s in back.snapshots] == [3, 2, 3, 3]
    assert back.n_slabs == 14


def test_an_empty_file_is_only_its_header():
    t = Tables(meta(), [], [], [])
    head = tables.encode(t)
    back = decode(head, file_size=len(head))
    assert back == t and back.payload_offset == 4096


def test_format_1_reads_the_kind_byte_without_flags():
    t = sample()
    t.snapshots[1] = SnapshotRecord(1, 128, 0, SnapshotKind.TAP, b"", -1, (6, 7))
    back = decode(forge(tables.encode(t), version=1))
    assert back == t and not any(s.superseded for s in back.snapshots)


# ---- what decode refuses ------------------------------------------------------------------


def _sample_head() -> bytes:
    return tables.encode(sample())


def _offset_inside_the_tables():
    head = _sample_head()
    meta_len, tables_len = FIXED.unpack_from(head)[3:5]
    return forge(head, offset=FIXED.size + meta_len + tables_len + 8 - 1), None


def _offset_beyond_the_file():
    return forge(_sample_head(), offset=3 * 4096), 2 * 4096


def _cut_while_reading():
    head = _sample_head()
    meta_len, tables_len = FIXED.unpack_from(head)[3:5]
    return head[: FIXED.size + meta_len + tables_len + 8 - 1], 4096 + 14 * SLAB


def _flipped(offset):
    def damaged():
        data = bytearray(_sample_head())
        data[offset] ^= 0x5A
        return bytes(data), None

    return damaged


@pytest.mark.parametrize(
    ("damaged", "message"),
    [
        (lambda: (_sample_head()[:47], 4096), "truncated header"),
        (_flipped(3), "not a ninfer prefix cache file (bad magic)"),
        (
            lambda: (forge(_sample_head(), version=3), None),
            "format version 3, this ninfer reads (1, 2)",
        ),
        (
            lambda: (forge(_sample_head(), version=0), None),
            "format version 0, this ninfer reads (1, 2)",
        ),
        (_offset_inside_the_tables, "truncated tables"),
        (_offset_beyond_the_file, "truncated tables"),
        (_cut_while_reading, "truncated tables"),
        (_flipped(48 + 10), "table checksum mismatch (damaged file)"),  # in the meta
        (_flipped(600), "table checksum mismatch (damaged file)"),  # in the tables
        (
            lambda: (_sample_head(), 4096 + 15 * SLAB),
            f"size {4096 + 15 * SLAB} B does not match its tables ({4096 + 14 * SLAB} B): "
            "truncated or extended",
        ),
        (
            lambda: (_sample_head(), 4096 + 13 * SLAB + 1),
            f"size {4096 + 13 * SLAB + 1} B does not match its tables ({4096 + 14 * SLAB} B): "
            "truncated or extended",
        ),
    ],
)
def test_decode_refuses_a_damaged_file_naming_why(damaged, message):
    head, size = damaged()
    with pytest.raises(PersistError) as e:
        decode(head, size)
    assert str(e.value) == message


def _with(blocks=None, snapshots=None, n_slabs=None) -> bytes:
    """The sample's header with some records replaced (encode writes what it is given)."""
    t = sample()
    t.blocks = blocks if blocks is not None else t.blocks
    t.snapshots = snapshots if snapshots is not None else t.snapshots
    t.slab_sums = t.slab_sums if n_slabs is None else [0] * n_slabs
    return tables.encode(t)


def _block(i: int, **change) -> list[BlockRecord]:
    bl = sample().blocks
    r = bl[i]
    bl[i] = BlockRecord(
        **{**{f: getattr(r, f) for f in ("parent", "slab", "extra", "tokens")}, **change}
    )
    return bl


def _snap(i: int, **change) -> list[SnapshotRecord]:
    sn = sample().snapshots
    r = sn[i]
    keys = ("anchor", "frontier", "hits", "kind", "tail", "tail_slab", "image_slabs", "superseded")
    sn[i] = SnapshotRecord(**{**{f: getattr(r, f) for f in keys}, **change})
    return sn


def _bad(message: str) -> str:
    return f"bad tables: ValueError({message!r})"


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (
            lambda: _with(blocks=_block(1, parent=1)),
            _bad("block 1: parent 1 is not an earlier block"),
        ),
        (
            lambda: _with(blocks=_block(1, parent=2)),
            _bad("block 1: parent 2 is not an earlier block"),
        ),
        (
            lambda: _with(blocks=_block(2, parent=-2)),
            _bad("block 2: parent -2 is not an earlier block"),
        ),
        (
            lambda: _with(snapshots=_snap(0, anchor=-2)),  # frontier as if on the root
            _bad("snapshot 0: anchor -2 / frontier 10 disagree"),
        ),
        (
            lambda: _with(snapshots=_snap(3, frontier=128)),
            _bad("snapshot 3: anchor 0 / frontier 128 disagree"),
        ),
        (
            lambda: _with(snapshots=_snap(0, frontier=74)),  # the root is not a block
            _bad("snapshot 0: anchor -1 / frontier 74 disagree"),
        ),
        (
            lambda: _with(snapshots=_snap(3, tail=toks(6, 64), frontier=128)),
            _bad("snapshot 3: bad tail or kind"),
        ),
        (
            lambda: _with(snapshots=_snap(1, tail_slab=14), n_slabs=15),  # a slab without a tail
            _bad("snapshot 1: bad tail or kind"),
        ),
        (
            lambda: _with(snapshots=_snap(2, tail_slab=-1), n_slabs=14),  # a tail without a slab
            _bad("snapshot 2: bad tail or kind"),
        ),
        (
            lambda: _with(snapshots=_snap(2, kind=max(SnapshotKind) + 1)),
            _bad("snapshot 2: bad tail or kind"),
        ),
        (lambda: _with(snapshots=_snap(2, kind=0x7F)), _bad("snapshot 2: bad tail or kind")),
        (
            lambda: _with(snapshots=_snap(2, anchor=1, tail=b"", tail_slab=-1, frontier=128)),
            _bad("snapshot 2: duplicate (anchor, tail)"),
        ),
        (
            lambda: _with(blocks=_block(2, slab=4)),
            _bad("file slabs are not each used exactly once"),
        ),
        (lambda: _with(n_slabs=15), _bad("file slabs are not each used exactly once")),
        (
            lambda: forge(_sample_head(), _body(_sample_head()) + bytes(8)),
            _bad("table length disagrees with its counts"),
        ),
        (
            lambda: tables.encode(Tables({"geometry": {"image_slabs": 2}}, [], [], [])),
            "bad tables: KeyError('slab_bytes')",
        ),
    ],
)
def test_decode_refuses_inconsistent_tables_naming_the_record(head, message):
    with pytest.raises(PersistError) as e:
        decode(head())
    assert str(e.value) == message


def test_decode_refuses_a_snapshot_anchored_past_the_block_table():
    for anchor in (3, 4):  # 3 blocks; the frontier is the root's, as a bad writer might set it
        with pytest.raises(PersistError) as e:
            decode(_with(snapshots=_snap(0, anchor=anchor)))
        assert str(e.value) == _bad(f"snapshot 0: anchor {anchor} / frontier 10 disagree")


def test_format_1_has_no_superseded_flag():
    """Format 1's kind byte is the kind alone: bit 7 set there is a bad kind, not a flag."""
    head = forge(tables.encode(sample()), version=1)  # snapshot 1 is written with bit 7 set
    with pytest.raises(PersistError) as e:
        decode(head)
    assert str(e.value) == _bad("snapshot 1: bad tail or kind")


def _body(head: bytes) -> bytes:
    meta_len, tables_len = FIXED.unpack_from(head)[3:5]
    return head[FIXED.size + meta_len : FIXED.size + meta_len + tables_len]


# ---- check_compatible ---------------------------------------------------------------------


def _file_meta(**meta_b) -> Tables:
    return Tables(meta_b, [], [], [])


def test_a_file_of_the_same_engine_and_geometry_is_compatible():
    tables.check_compatible(_file_meta(**meta()), dict(FINGERPRINT), GEOMETRY)


@pytest.mark.parametrize(
    ("theirs", "message"),
    [
        ({**FINGERPRINT, "dtype": "bfloat16"}, "made for another engine (dtype differ)"),
        (
            {**FINGERPRINT, "dtype": "bfloat16", "model": {"checkpoint": "other"}},
            "made for another engine (dtype, model differ)",
        ),
        (
            {"dtype": "float32", "model": {"checkpoint": "test"}},
            "made for another engine (format_version differ)",
        ),
        ({**FINGERPRINT, "rope": 1.0}, "made for another engine (rope differ)"),
        (None, "made for another engine (dtype, format_version, model differ)"),
    ],
)
def test_another_engines_file_is_refused_naming_what_differs(theirs, message):
    m = {"geometry": GEOMETRY.file_dict()}
    if theirs is not None:
        m["fingerprint"] = theirs
    with pytest.raises(PersistError) as e:
        tables.check_compatible(_file_meta(**m), dict(FINGERPRINT), GEOMETRY)
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("geometry", "message"),
    [
        (
            {**GEOMETRY.file_dict(), "image_bytes": 5000},
            "another Host geometry (image_bytes differ)",
        ),
        (
            {**GEOMETRY.file_dict(), "cell_bytes": 1024, "slab_bytes": 2048},
            "another Host geometry (cell_bytes, slab_bytes differ)",
        ),
        (
            None,
            "another Host geometry (cell_bytes, image_bytes, image_slabs, n_fa_layers, "
            "slab_bytes differ)",
        ),
    ],
)
def test_another_host_geometrys_file_is_refused_naming_what_differs(geometry, message):
    m = {"fingerprint": dict(FINGERPRINT)}
    if geometry is not None:
        m["geometry"] = geometry
    with pytest.raises(PersistError) as e:
        tables.check_compatible(_file_meta(**m), dict(FINGERPRINT), GEOMETRY)
    assert str(e.value) == message


def test_a_geometry_with_another_slab_count_is_still_compatible():
    other = SlabGeometry(2, 2048, 4096, 7, 3, 6000, 2)  # another tier size and chunking
    tables.check_compatible(_file_meta(**meta()), dict(FINGERPRINT), other)
