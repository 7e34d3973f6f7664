"""The prefix cache file without an engine (spec §5.5): what a save writes, byte-exact
restores, partial restores by GDSF density, damaged and foreign files, abandoned saves."""

from __future__ import annotations

import logging

import pytest
from persist_helpers import (
    add_chain,
    add_snapshot,
    check_contents,
    file_for,
    make_tier,
    name_of,
    names,
)

from ninfer.cache.common import Residency
from ninfer.cache.host_pool import SlabGeometry
from ninfer.persist import plan, tables


def four_snapshots(num_slabs: int = 40):
    """A (1 block, 0 hits), B (4 blocks, 5 hits), D (on B's 2nd block, 0 hits), C (2 blocks,
    1 hit); 7 blocks + 4 images of 2 slabs = 15 file slabs."""
    b = make_tier(num_slabs)
    add_snapshot(b, add_chain(b, 1, 1)[-1], hits=0)  # c1@64
    chain2 = add_chain(b, 2, 4)
    add_snapshot(b, chain2[-1], hits=5)  # c2@256
    add_snapshot(b, chain2[1], hits=0)  # c2@128
    add_snapshot(b, add_chain(b, 3, 2)[-1], hits=1)  # c3@128
    return b


def saved(tmp_path, source, **kw):
    f = file_for(tmp_path / "cache.hpc", **kw)
    assert f.save(source) is not None
    return f


def test_round_trip_restores_every_entry_byte_for_byte(tmp_path):
    src = four_snapshots()
    add_snapshot(src, add_chain(src, 4, 1)[-1], tail=list(range(100, 110)))  # c4@74, a tail
    f = saved(tmp_path, src)
    size = f.path.stat().st_size
    assert size % 4096 == 0 and size == 4096 + (8 + 10 + 1) * 4096  # head page + 19 slabs
    dst = make_tier(40)
    assert f.load(dst) == 5
    assert names(dst.index) == names(src.index) == {
        "c1@64", "c2@256", "c2@128", "c3@128", "c4@74",
    }  # fmt: skip
    for s in dst.index.snapshots.by_id.values():
        assert s.device_state == Residency.ABSENT and s.host_state == Residency.RESIDENT
    hits = {s.frontier: s.hits for s in dst.index.snapshots.by_id.values()}
    assert hits[256] == 5 and hits[64] == 0
    assert len(dst.index.blocks.tree) == 8
    check_contents(dst)
    dst.index.check_invariants()
    assert f.last_load.bytes == 19 * 4096


def test_superseded_snapshots_are_saved_flagged_and_dead_blocks_are_not(tmp_path):
    """A restarted process resumes what the running one would have: a superseded snapshot
    still serves a retry until Host eviction takes it (§9.3), so it is saved, flagged, and
    comes back superseded (first to go again)."""
    src = four_snapshots()
    add_chain(src, 9, 3)  # dead KV: no snapshot below
    index = src.index
    victim = next(s for s in index.snapshots.by_id.values() if s.frontier == 64)
    assert index.liveness.supersede(victim)
    chosen = plan.collect(index, {})
    assert len(chosen.tables.snapshots) == 4 and len(chosen.tables.blocks) == 7
    assert [s.frontier for s in chosen.tables.snapshots if s.superseded] == [64]
    f = saved(tmp_path, src)
    dst = make_tier(40)
    f.load(dst)
    assert names(dst.index) == {"c1@64", "c2@256", "c2@128", "c3@128"}
    assert {name_of(dst.index, s) for s in dst.index.snapshots.by_id.values() if s.superseded} == {
        "c1@64"
    }
    check_contents(dst)
    dst.index.check_invariants()


def test_a_smaller_tier_restores_superseded_snapshots_last(tmp_path):
    src = four_snapshots()
    densest = next(s for s in src.index.snapshots.by_id.values() if s.frontier == 256)
    assert src.index.liveness.supersede(densest)  # B: by density alone it would go first
    f = saved(tmp_path, src)
    dst = make_tier(10)
    f.load(dst)
    assert names(dst.index) == {"c2@128", "c3@128"}
    check_contents(dst)


def test_format_1_files_are_still_read(tmp_path, monkeypatch):
    src = four_snapshots()
    monkeypatch.setattr(tables, "FORMAT_VERSION", 1)
    f = saved(tmp_path, src)
    monkeypatch.undo()
    dst = make_tier(40)
    assert f.load(dst) == 4
    assert not any(s.superseded for s in dst.index.snapshots.by_id.values())


@pytest.mark.parametrize(
    ("capacity", "kept", "blocks"),
    [
        # density ~ (1 + hits) * prefill(F) / (image + path bytes): B >> C > D > A
        (10, {"c2@256", "c3@128"}, 6),  # B (6 slabs), C (4): full, D and A left out
        (9, {"c2@256", "c2@128"}, 4),  # B (6), C does not fit, D needs only its image (2)
        (4, {"c3@128"}, 2),  # B does not fit at all; C (4) exactly fills it
        (15, {"c1@64", "c2@256", "c2@128", "c3@128"}, 7),  # the whole file
    ],
)
def test_partial_restore_keeps_the_densest_snapshots(tmp_path, caplog, capacity, kept, blocks):
    f = saved(tmp_path, four_snapshots())
    dst = make_tier(capacity)
    with caplog.at_level(logging.INFO, logger="ninfer.cache"):
        f.load(dst)
    assert names(dst.index) == kept
    assert len(dst.index.blocks.tree) == blocks  # only the path blocks the kept snapshots need
    check_contents(dst)
    dst.index.check_invariants()
    partly = [r for r in caplog.records if "partly restored" in r.getMessage()]
    assert bool(partly) == (capacity < 15)
    assert any("prefix cache read |" in r.getMessage() for r in caplog.records)


def test_density_prefers_hits_and_depth_per_byte():
    geom = SlabGeometry(2, 2048, 4096, 40, 5, 6000, 2)  # 40 slabs, 5 per chunk: not used
    rec = tables.SnapshotRecord(0, 256, 5, 1, b"", -1, (0, 1))
    cheap = tables.SnapshotRecord(0, 64, 0, 1, b"", -1, (0, 1))

    def prefill(base, n):
        return float(n)

    def restore(nbytes):
        return 0.0

    assert plan.density(rec, 4, geom, prefill, restore) == 6 * 256 / (6000 + 4 * 4096)
    assert plan.density(cheap, 1, geom, prefill, restore) == 64 / (6000 + 4096)


def test_a_tier_that_holds_no_snapshot_restores_nothing(tmp_path, caplog):
    src = make_tier(40)
    add_snapshot(src, add_chain(src, 2, 4)[-1])  # needs 6 slabs
    f = saved(tmp_path, src)
    dst = make_tier(5)
    with caplog.at_level(logging.WARNING, logger="ninfer.cache"):
        assert f.load(dst) == 0
    assert len(dst.index.blocks.tree) == 0 and not dst.index.snapshots.by_id
    (msg,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "not restored" in msg and "replaces the file" in msg


def _truncate(p):
    p.write_bytes(p.read_bytes()[:-100])


def _extend(p):
    p.write_bytes(p.read_bytes() + b"\0" * 4096)


def _flip(offset):
    def damage(p):
        data = bytearray(p.read_bytes())
        data[offset] ^= 0x5A
        p.write_bytes(bytes(data))

    return damage


def _flip_last_slab(p):
    _flip(p.stat().st_size - 7)(p)


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (_truncate, "does not match its tables"),
        (_extend, "does not match its tables"),
        (_flip(len(tables.MAGIC) + 1), "format version"),
        (_flip(60), "checksum"),  # inside the tables
        (_flip_last_slab, "checksum mismatch"),  # a payload slab, found while reading
        (lambda p: p.write_bytes(b"NINF"), "truncated"),
    ],
)
def test_a_damaged_file_loads_nothing(tmp_path, caplog, damage, why):
    f = saved(tmp_path, four_snapshots())
    damage(f.path)
    dst = make_tier(40)
    with caplog.at_level(logging.WARNING, logger="ninfer.cache"):
        assert f.load(dst) == 0
    assert len(dst.index.blocks.tree) == 0 and not dst.index.snapshots.by_id
    assert dst.index.host.free_slabs == 40
    dst.index.check_invariants()
    (msg,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "not used" in msg and why in msg and "replaces it" in msg


def test_a_foreign_file_loads_nothing(tmp_path, caplog):
    f = saved(tmp_path, four_snapshots())
    other = file_for(f.path, {**f.fingerprint, "dtype": "bfloat16"})
    dst = make_tier(40)
    with caplog.at_level(logging.WARNING, logger="ninfer.cache"):
        assert other.load(dst) == 0
        assert f.load(make_tier(40, image_bytes=5000)) == 0  # another Host geometry
    assert not dst.index.snapshots.by_id
    msgs = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "dtype differ" in msgs[0] and "image_bytes differ" in msgs[1]


class _AbandonAfter:
    """An Event stand-in that turns set after `n` checks."""

    def __init__(self, n: int) -> None:
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        return self.n < 0

    def set(self) -> None:
        self.n = 0


@pytest.mark.parametrize("checks", [0, 1, 3, 5])
def test_an_abandoned_save_leaves_the_previous_file(tmp_path, checks):
    src = four_snapshots()
    f = saved(tmp_path, src)
    before = f.path.read_bytes()
    add_snapshot(src, add_chain(src, 5, 3)[-1], hits=2)
    again = file_for(f.path)
    again.batch_bytes = 2 * 4096  # 2 slabs per batch: 10 batches
    again._abandon = _AbandonAfter(checks)  # before the start, between slabs
    assert again.save(src) is None
    assert f.path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.hpc"]  # no temporary file
    again._abandon = _AbandonAfter(10**6)
    assert again.save(src) is not None and f.path.read_bytes() != before


def test_empty_cache_saves_an_empty_file_that_loads(tmp_path):
    f = saved(tmp_path, make_tier(10))
    assert f.path.stat().st_size == 4096
    dst = make_tier(10)
    assert f.load(dst) == 0 and not dst.index.snapshots.by_id
