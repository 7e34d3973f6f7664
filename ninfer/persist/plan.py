"""What a prefix cache file holds and what a load restores (design §5.5): the policy.

Pure Python (no torch), over a `PrefixIndex`: `collect` chooses the blocks and snapshots a save
writes, `plan_restore` the ones a smaller Host tier takes back (all, or the densest snapshots
first), `rebuild` loads them Host-only. The format is `tables.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ninfer.cache.common import ROOT, Residency, SnapshotKind, ceil_div
from ninfer.cache.host_pool import SlabGeometry
from ninfer.persist.tables import BlockRecord, SnapshotRecord, Tables

_RESIDENT = Residency.RESIDENT


@dataclass(slots=True)
class SaveSet:
    """What a save writes: the tables (checksums still zero) and, per file slab, the index's
    Host slab its bytes come from."""

    tables: Tables
    sources: list[int]  # index Host slab of each file slab

    @property
    def n_slabs(self) -> int:
        return len(self.sources)


@dataclass(slots=True)
class RestorePlan:
    """The blocks and snapshots a load restores (table indices, file order)."""

    blocks: list[int]
    snapshots: list[int]
    slabs: int  # file slabs they need
    complete: bool  # every snapshot of the file
    file_slabs: int  # slabs the whole file needs
    min_slabs: int = 0  # the smallest single snapshot's need (with its path)
    dropped: list[int] = field(default_factory=list)  # snapshots left out


# ---- save side ----------------------------------------------------------------------------


def collect(index, meta: dict) -> SaveSet:
    """Every Host-resident snapshot whose anchor path is Host-resident, and exactly those
    paths, parents first (design §5.5). Call with every Host write landed.

    Superseded snapshots are saved too, flagged: the process that kept running would still
    resume a retry of the same prompt from the one its last run resumed from (§9.3: only Host
    eviction removes it), so a restart keeps it as well, superseded, first to go again."""
    nodes = index.blocks.tree.nodes
    chosen: list = []
    needed: set[int] = set()
    for s in index.snapshots.by_id.values():
        path = _host_path(nodes, s)
        if path is not None:
            chosen.append(s)
            needed.update(path)
    order = sorted(needed, key=lambda nid: (nodes[nid].depth, nid))  # parents first
    pos = {ROOT: -1}
    blocks: list[BlockRecord] = []
    sources: list[int] = []
    for nid in order:
        n = nodes[nid]
        pos[nid] = len(blocks)
        blocks.append(BlockRecord(pos[n.parent], len(sources), n.extra, n.tokens))
        sources.append(n.host_slab)
    snaps: list[SnapshotRecord] = []
    for s in sorted(chosen, key=lambda s: (s.frontier, s.id)):
        snaps.append(_snapshot_record(s, pos[s.anchor], sources))
    return SaveSet(Tables(meta, blocks, snaps, [0] * len(sources)), sources)


def _host_path(nodes, s) -> list[int] | None:
    """`s`'s anchor path (node ids, anchor first); None unless it and `s` are Host-resident."""
    if s.host_state != _RESIDENT:
        return None
    path = []
    node = nodes[s.anchor]
    while node.id != ROOT and node.host_state == _RESIDENT:
        path.append(node.id)
        node = nodes[node.parent]
    if node.id != ROOT:
        return None  # a path block without a landed Host copy
    return path


def _snapshot_record(s, anchor: int, sources: list[int]) -> SnapshotRecord:
    """`s`'s table record; appends its image's, then its tail's, Host slabs to `sources`."""
    image = tuple(range(len(sources), len(sources) + len(s.host_slabs)))
    sources.extend(s.host_slabs)
    tail_slab = -1
    if s.tail:
        tail_slab = len(sources)
        sources.append(s.tail_slab)
    return SnapshotRecord(
        anchor, s.frontier, s.hits, int(s.kind), s.tail, tail_slab, image, s.superseded
    )


# ---- partial restore (design §5.5 plan_host_restore) ----------------------------------------


def snapshot_paths(tables: Tables) -> list[list[int]]:
    """Per snapshot, the block-table indices of its anchor path, root first."""
    out = []
    for s in tables.snapshots:
        path, b = [], s.anchor
        while b >= 0:
            path.append(b)
            b = tables.blocks[b].parent
        out.append(path[::-1])
    return out


def density(
    s: SnapshotRecord,
    path_blocks: int,
    geometry: SlabGeometry,
    prefill_seconds: Callable[[int, int], float],
    restore_seconds: Callable[[int], float],
) -> float:
    """§9.3's GDSF priority without its time-dependent base L: (1 + hits) x the prefill a
    restore saves from the root, per byte of image, tail and anchor path."""
    saved = max(0.0, prefill_seconds(0, s.frontier) - restore_seconds(geometry.image_bytes))
    nbytes = geometry.image_bytes + geometry.slab_bytes * ((s.tail_slab >= 0) + path_blocks)
    return (1 + s.hits) * saved / nbytes


def plan_restore(
    tables: Tables,
    capacity_slabs: int,
    geometry: SlabGeometry,
    prefill_seconds: Callable[[int, int], float],
    restore_seconds: Callable[[int], float],
) -> RestorePlan:
    """All of the file when it fits; else whole snapshots greedily, retained ones first, by
    `density`, each with the path blocks it needs and no others (a snapshot that no longer
    fits is skipped, smaller ones after it may still go in)."""
    paths = snapshot_paths(tables)
    needs = [s.n_slabs + len(p) for s, p in zip(tables.snapshots, paths, strict=True)]
    min_slabs = min(needs, default=0)
    total = tables.n_slabs
    if total <= capacity_slabs:
        every = list(range(len(tables.snapshots)))
        return RestorePlan(list(range(len(tables.blocks))), every, total, True, total, min_slabs)
    taken_blocks: set[int] = set()
    kept, dropped, used = [], [], 0
    for i in _by_priority(tables, paths, geometry, prefill_seconds, restore_seconds):
        new = [b for b in paths[i] if b not in taken_blocks]
        need = tables.snapshots[i].n_slabs + len(new)
        if used + need <= capacity_slabs:
            used += need
            taken_blocks.update(new)
            kept.append(i)
        else:
            dropped.append(i)
    return RestorePlan(
        sorted(taken_blocks), sorted(kept), used, False, total, min_slabs, sorted(dropped)
    )


def _by_priority(
    tables: Tables,
    paths: list[list[int]],
    geometry: SlabGeometry,
    prefill_seconds: Callable[[int, int], float],
    restore_seconds: Callable[[int], float],
) -> list[int]:
    """The snapshots' table indices: retained before superseded, then by falling `density`."""
    return sorted(
        range(len(tables.snapshots)),
        key=lambda i: (
            tables.snapshots[i].superseded,
            -density(
                tables.snapshots[i], len(paths[i]), geometry, prefill_seconds, restore_seconds
            ),
            i,
        ),
    )


def rebuild(index, tables: Tables, plan: RestorePlan) -> list[tuple[int, int]]:
    """Load the plan's entries Host-only (parents before children, never evicting) and return
    (file slab, index Host slab) pairs, sorted by file slab, for the byte copy."""
    nid = {-1: ROOT}
    pairs: list[tuple[int, int]] = []
    for b in plan.blocks:  # ascending table order = parents first
        rec = tables.blocks[b]
        nid[b] = index.load_block(nid[rec.parent], rec.tokens, rec.extra)
        pairs.append((rec.slab, index.node(nid[b]).host_slab))
    for i in plan.snapshots:
        rec = tables.snapshots[i]
        kind = SnapshotKind(rec.kind)
        sid = index.load_snapshot(nid[rec.anchor], rec.tail, kind, rec.hits, rec.superseded)
        snap = index.snapshot(sid)
        pairs += list(zip(rec.image_slabs, snap.host_slabs, strict=True))
        if rec.tail_slab >= 0:
            pairs.append((rec.tail_slab, snap.tail_slab))
    pairs.sort()
    return pairs


def needed_mib(slabs: int, slab_bytes: int) -> int:
    """MiB of Host tier that hold `slabs` slabs."""
    return ceil_div(slabs * slab_bytes, 1 << 20)


def describe_plan(plan: RestorePlan, tables: Tables, slab_bytes: int) -> str:
    return (
        f"kept {len(plan.snapshots)} of {len(tables.snapshots)} snapshots and "
        f"{len(plan.blocks)} of {len(tables.blocks)} blocks ({plan.slabs} of {plan.file_slabs} "
        f"slabs); the whole file needs a Host tier of {needed_mib(plan.file_slabs, slab_bytes)} "
        "MiB"
    )
