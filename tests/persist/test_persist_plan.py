"""What a prefix cache file holds and what a load restores (`ninfer/persist/plan.py`, spec
§5.5): the exact tables `collect` writes from an index, the anchor paths, the GDSF density, the
exact `RestorePlan` of a whole or partial restore, the Host-only `rebuild` with its slab pairs,
and the sizes the load's log lines report."""

from __future__ import annotations

import pytest
from persist_helpers import make_tier

from ninfer.cache.common import ROOT, SnapshotKind
from ninfer.cache.host_pool import SlabGeometry
from ninfer.persist import plan
from ninfer.persist.plan import RestorePlan
from ninfer.persist.tables import BlockRecord, SnapshotRecord, Tables
from tests.cache.cache_helpers import Driver, make_index, tokens

GEOMETRY = SlabGeometry(2, 2048, 4096, 40, 5, 6000, 2)  # 4096-byte slabs, 2-slab images
META = {"fingerprint": {"dtype": "float32"}, "geometry": GEOMETRY.file_dict()}


def prefill(base: int, n: int) -> float:
    return float(n - base)


def no_restore(nbytes: int) -> float:
    return 0.0


def toks(seed: int, n: int) -> list[int]:
    return [seed * 1000 + i for i in range(n)]


def packed(seed: int, n: int) -> bytes:
    return b"".join(t.to_bytes(4, "little") for t in toks(seed, n))


def file_tables() -> Tables:
    """4 blocks (0 <- 1 <- 2 and 3, both chains from the root) and 4 snapshots:
    s0 on block 2 (5 hits), s1 on block 0 with a 10-token tail in file slab 0 (1 hit),
    s2 on block 3 (a Boundary), s3 on the root with a 20-token tail (4 hits, superseded never);
    14 file slabs. Each one's need (its slabs + its path): 5, 4, 3, 3."""
    blocks = [
        BlockRecord(-1, 1, 0, packed(1, 64)),
        BlockRecord(0, 2, 9, packed(2, 64)),
        BlockRecord(1, 3, 0, packed(3, 64)),
        BlockRecord(-1, 4, 2**33, packed(4, 64)),
    ]
    snaps = [
        SnapshotRecord(2, 192, 5, SnapshotKind.ENDPOINT, b"", -1, (5, 6)),
        SnapshotRecord(0, 74, 1, SnapshotKind.TAP, packed(5, 10), 0, (7, 8)),
        SnapshotRecord(3, 64, 0, SnapshotKind.BOUNDARY, b"", -1, (9, 10)),
        SnapshotRecord(-1, 20, 4, SnapshotKind.TAP, packed(6, 20), 13, (11, 12)),
    ]
    return Tables(dict(META), blocks, snaps, [0] * 14)


def restore_plan(t: Tables, capacity: int) -> RestorePlan:
    return plan.plan_restore(t, capacity, GEOMETRY, prefill, no_restore)


# ---- collect: what a save writes ----------------------------------------------------------


def _records(ix, saved) -> tuple[list, list]:
    """The index's block and snapshot records the save set's tables stand for, in table order:
    (node id, parent node id) per block, snapshot id per snapshot (found by contents)."""
    by_tokens = {n.tokens: n for n in ix.blocks.tree.nodes.values() if n.id != ROOT}
    nodes = [by_tokens[b.tokens] for b in saved.tables.blocks]
    sids = []
    for r in saved.tables.snapshots:
        anchor = ROOT if r.anchor < 0 else nodes[r.anchor].id
        (s,) = [s for s in ix.snapshots.by_id.values() if (s.anchor, s.tail) == (anchor, r.tail)]
        sids.append(s.id)
    return nodes, sids


def test_collect_writes_host_resident_snapshots_and_exactly_their_paths():
    """Two conversations on a Host tier too small for all of them: the Device-only snapshots
    and the blocks below the last saved anchor stay out; the block table is in depth order
    (parents first), the snapshot table in frontier order, each file slab numbered in turn."""
    ix = make_index(host_slabs=12)
    d = Driver(ix)
    d.run(0, tokens(1, 300), taps=[128], endpoint=300)
    d.run(1, tokens(2, 200), taps=[64], endpoint=200)
    host = [s for s in ix.snapshots.by_id.values() if s.host_slabs]
    device_only = [s for s in ix.snapshots.by_id.values() if not s.host_slabs]
    assert [(s.frontier, bool(s.tail)) for s in host] == [(128, False), (200, True)]
    assert [s.frontier for s in device_only] == [300, 64]  # between the two in id order

    saved = plan.collect(ix, META)
    nodes, sids = _records(ix, saved)
    depth_of = [n.depth for n in nodes]
    assert depth_of == [0, 0, 1, 1, 2]  # chain 1's first two blocks, chain 2's three
    pos = {n.id: i for i, n in enumerate(nodes)}
    pos[ROOT] = -1
    assert saved.tables.blocks == [
        BlockRecord(pos[n.parent], i, n.extra, n.tokens) for i, n in enumerate(nodes)
    ]
    s128, s200 = (ix.snapshot(s) for s in sids)
    assert (s128.frontier, s200.frontier) == (128, 200)
    assert saved.tables.snapshots == [
        SnapshotRecord(pos[s128.anchor], 128, s128.hits, SnapshotKind.TAP, b"", -1, (5, 6)),
        SnapshotRecord(
            pos[s200.anchor], 200, s200.hits, SnapshotKind.ENDPOINT, s200.tail, 9, (7, 8)
        ),
    ]
    assert saved.sources == [
        *(n.host_slab for n in nodes),
        *s128.host_slabs,
        *s200.host_slabs,
        s200.tail_slab,
    ]
    assert saved.n_slabs == 10
    assert saved.tables.slab_sums == [0] * 10  # the save fills them in as it writes
    assert saved.tables.meta == META


def test_collect_leaves_out_snapshots_whose_path_has_not_landed_on_the_host():
    """A snapshot whose image landed but whose path blocks are still being written cannot be
    resumed from the file: it is not saved, and neither are its blocks; later ones are."""
    ix = make_index(host_slabs=40)
    d = Driver(ix, land=False)
    d.run(0, tokens(1, 300), taps=[128], endpoint=300)
    for b in d.pending:
        if ix.batches[b].kind == "snapshot":
            ix.on_write_through_landed(b)
    first = list(ix.snapshots.by_id.values())
    assert all(s.host_slabs for s in first)
    d.land = True
    d.run(1, tokens(2, 200), taps=[64], endpoint=200)

    saved = plan.collect(ix, META)
    nodes, sids = _records(ix, saved)
    assert [ix.snapshot(s).frontier for s in sids] == [64, 200]
    assert [n.depth for n in nodes] == [0, 1, 2]
    assert {s.id for s in first}.isdisjoint(sids)
    assert saved.n_slabs == 3 + 2 + 3


def test_collect_of_an_index_without_snapshots_is_empty():
    ix = make_index(host_slabs=40)
    d = Driver(ix)
    d.admit(0, tokens(1, 200))
    d.commit(0, 192)
    d.release(0)  # dead KV: blocks on the Host, no snapshot
    saved = plan.collect(ix, META)
    assert saved.tables.blocks == [] and saved.tables.snapshots == [] and saved.sources == []


# ---- the restore plan ---------------------------------------------------------------------


def test_snapshot_paths_list_each_anchor_path_root_first():
    assert plan.snapshot_paths(file_tables()) == [[0, 1, 2], [0], [3], []]


def test_density_is_the_saved_prefill_times_hits_per_byte():
    t = file_tables()

    def restore(nbytes: int) -> float:
        return nbytes / 1000  # an image: 6 s

    # (1 + hits) * (prefill(0, F) - restore(image)) / (image + slab * (tail + path blocks))
    assert plan.density(t.snapshots[0], 3, GEOMETRY, prefill, restore) == 6 * 186 / (
        6000 + 4096 * 3
    )
    assert plan.density(t.snapshots[1], 1, GEOMETRY, prefill, restore) == 2 * 68 / (
        6000 + 4096 * 2
    )  # a tail in file slab 0 is a tail
    assert plan.density(t.snapshots[3], 0, GEOMETRY, prefill, restore) == 5 * 14 / (6000 + 4096)
    assert plan.density(t.snapshots[2], 1, GEOMETRY, prefill, restore) == 58 / (6000 + 4096)
    slow = plan.density(t.snapshots[0], 3, GEOMETRY, prefill, lambda n: 1000.0)
    assert slow == 0.0  # a restore slower than the prefill saves nothing


def test_a_tier_that_holds_the_file_restores_all_of_it():
    t = file_tables()
    whole = RestorePlan([0, 1, 2, 3], [0, 1, 2, 3], 14, True, 14, 3, [])
    assert restore_plan(t, 14) == whole
    assert restore_plan(t, 40) == whole


def test_an_empty_file_restores_nothing_and_completely():
    t = Tables(dict(META), [], [], [])
    assert restore_plan(t, 0) == RestorePlan([], [], 0, True, 0, 0, [])


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        # density order s0 (6*192/18288), s1 (2*74/14192), s3 (5*20/10096), s2 (64/10096)
        (13, RestorePlan([0, 1, 2], [0, 1, 3], 11, False, 14, 3, [2])),
        (8, RestorePlan([0, 1, 2], [0, 1], 8, False, 14, 3, [2, 3])),  # s1: its path is s0's
        (7, RestorePlan([0, 1, 2], [0], 5, False, 14, 3, [1, 2, 3])),
        (4, RestorePlan([0], [1], 4, False, 14, 3, [0, 2, 3])),  # s0 does not fit, s1 does
        (3, RestorePlan([], [3], 3, False, 14, 3, [0, 1, 2])),  # s3 needs no block
        (2, RestorePlan([], [], 0, False, 14, 3, [0, 1, 2, 3])),
    ],
)
def test_a_smaller_tier_restores_the_densest_snapshots_that_fit(capacity, expected):
    assert restore_plan(file_tables(), capacity) == expected


def test_superseded_snapshots_are_restored_last():
    t = file_tables()
    s0 = t.snapshots[0]
    t.snapshots[0] = SnapshotRecord(
        s0.anchor, s0.frontier, s0.hits, s0.kind, s0.tail, s0.tail_slab, s0.image_slabs, True
    )
    assert restore_plan(t, 10) == RestorePlan([0, 3], [1, 2, 3], 10, False, 14, 3, [0])


# ---- rebuild ------------------------------------------------------------------------------


def _rebuilt(t: Tables, p: RestorePlan):
    index = make_tier(40).index
    pairs = plan.rebuild(index, t, p)
    nodes = {n.tokens: n for n in index.blocks.tree.nodes.values() if n.id != ROOT}
    return index, pairs, nodes


def test_rebuild_loads_every_planned_entry_host_only_with_its_slab_pairs():
    t = file_tables()
    t.snapshots[1] = SnapshotRecord(0, 74, 1, SnapshotKind.TAP, packed(5, 10), 0, (7, 8), True)
    index, pairs, nodes = _rebuilt(t, restore_plan(t, 14))
    node = [nodes[b.tokens] for b in t.blocks]
    assert [n.extra for n in node] == [0, 9, 0, 2**33]
    assert [n.parent for n in node] == [ROOT, node[0].id, node[1].id, ROOT]
    snaps = {(s.anchor, s.tail): s for s in index.snapshots.by_id.values()}
    assert len(snaps) == 4
    got = [snaps[(ROOT if r.anchor < 0 else node[r.anchor].id, r.tail)] for r in t.snapshots]
    assert [(s.kind, s.hits, s.frontier, s.superseded) for s in got] == [
        (SnapshotKind.ENDPOINT, 5, 192, False),
        (SnapshotKind.TAP, 1, 74, True),
        (SnapshotKind.BOUNDARY, 0, 64, False),
        (SnapshotKind.TAP, 4, 20, False),
    ]
    assert all(type(s.kind) is SnapshotKind for s in got)
    expected = [(b.slab, n.host_slab) for b, n in zip(t.blocks, node, strict=True)]
    for r, s in zip(t.snapshots, got, strict=True):
        expected += list(zip(r.image_slabs, s.host_slabs, strict=True))
        if r.tail_slab >= 0:
            expected.append((r.tail_slab, s.tail_slab))
    assert pairs == sorted(expected)
    assert [f for f, _ in pairs] == list(range(14))  # the tail in file slab 0 included
    assert len({h for _, h in pairs}) == 14
    index.check_invariants()


def test_rebuild_of_a_partial_plan_loads_only_its_entries():
    t = file_tables()
    index, pairs, nodes = _rebuilt(t, restore_plan(t, 8))
    assert sorted(n.tokens for n in nodes.values()) == sorted(b.tokens for b in t.blocks[:3])
    assert sorted(s.frontier for s in index.snapshots.by_id.values()) == [74, 192]
    assert [f for f, _ in pairs] == [0, 1, 2, 3, 5, 6, 7, 8]
    index.check_invariants()


def test_rebuild_refuses_images_of_another_length_than_the_tiers():
    t = file_tables()
    t.snapshots[2] = SnapshotRecord(3, 64, 0, SnapshotKind.BOUNDARY, b"", -1, (9,))
    index = make_tier(40).index
    with pytest.raises(ValueError):
        plan.rebuild(index, t, restore_plan(file_tables(), 14))


# ---- the sizes the load reports -----------------------------------------------------------


@pytest.mark.parametrize(
    ("slabs", "slab_bytes", "mib"),
    [(0, 4096, 0), (1, 4096, 1), (256, 4096, 1), (257, 4096, 2), (3, 1 << 20, 3), (5, 3 << 19, 8)],
)
def test_needed_mib_rounds_up_to_whole_mib(slabs, slab_bytes, mib):
    assert plan.needed_mib(slabs, slab_bytes) == mib


def test_describe_plan_counts_what_was_kept_and_what_the_file_needs():
    t = file_tables()
    assert plan.describe_plan(restore_plan(t, 8), t, 1 << 19) == (
        "kept 2 of 4 snapshots and 3 of 4 blocks (8 of 14 slabs); the whole file needs a Host "
        "tier of 7 MiB"
    )
