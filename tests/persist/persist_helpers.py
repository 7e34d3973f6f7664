"""A Host tier without an engine: a `PrefixIndex` plus `HostSlabs` of a small, odd geometry
(2 full-attention rows per slab, a 2-slab image, 5 slabs per chunk), with slab contents that
are a function of what the slab holds, so a restore can be checked byte for byte."""

from __future__ import annotations

import torch

from ninfer.cache import CacheConfig, CacheCostModel, PrefixIndex, SnapshotKind
from ninfer.cache.common import ROOT
from ninfer.cache.host_pool import SlabGeometry
from ninfer.memory.host_slabs import HostSlabs
from ninfer.persist.cache_file import PrefixCacheFile

N_FA, CELL = 2, 2048
SLAB = N_FA * CELL
IMAGE = 6000  # 2 slabs
PER_CHUNK = 5
FINGERPRINT = {"model": {"checkpoint": "test"}, "dtype": "float32", "format_version": 1}


class Tier:
    """A stub of the KV state's part the cache file uses: `index`, `host_slabs`,
    `reset_index()`."""

    def __init__(self, config: CacheConfig, slabs: HostSlabs) -> None:
        self.host_slabs = slabs
        self.index = PrefixIndex(config, CacheCostModel.cpu())

    def reset_index(self) -> None:
        self.index = PrefixIndex(self.index.config, self.index.cost)


def make_tier(num_slabs: int, image_bytes: int = IMAGE) -> Tier:
    """An empty index and `num_slabs` Host slabs."""
    k = -(-image_bytes // SLAB)
    geometry = SlabGeometry(N_FA, CELL, SLAB, num_slabs, min(PER_CHUNK, num_slabs), image_bytes, k)
    slabs = HostSlabs(geometry, pin=False)
    for chunk in slabs.chunks:
        chunk.zero_()
    config = CacheConfig.for_host(geometry, device_snapshot_slots=2)
    return Tier(config, slabs)


def block_tokens(chain: int, depth: int) -> list[int]:
    return [chain * 1000 + depth * 64 + i for i in range(64)]


def pattern(seed: int) -> torch.Tensor:
    """[N_FA, CELL] bytes that identify `seed`."""
    n = torch.arange(N_FA * CELL, dtype=torch.int64)
    return ((n * 31 + seed * 977 + n // 251) % 256).to(torch.uint8).view(N_FA, CELL)


def add_chain(bridge, chain: int, length: int, parent: int = ROOT, start: int = 0) -> list[int]:
    """`length` Host-only blocks below `parent`, their slabs filled with their pattern."""
    index, nids = bridge.index, []
    for d in range(start, start + length):
        parent = index.load_block(parent, block_tokens(chain, d))
        bridge.host_slabs.slab_view(index.node(parent).host_slab).copy_(pattern(chain * 100 + d))
        nids.append(parent)
    return nids


def add_snapshot(bridge, anchor: int, hits: int = 0, tail: list[int] = ()) -> int:
    index = bridge.index
    sid = index.load_snapshot(anchor, list(tail), SnapshotKind.ENDPOINT, hits=hits)
    s = index.snapshot(sid)
    for p, slab in enumerate([*s.host_slabs, s.tail_slab] if tail else s.host_slabs):
        bridge.host_slabs.slab_view(slab).copy_(pattern(snapshot_seed(index, s, p)))
    return sid


def snapshot_seed(index, s, position: int) -> int:
    tok0 = int.from_bytes(index.node(s.anchor).tokens[:4], "little") if s.anchor else 0
    return 50_000 + (tok0 * 7 + s.frontier) * 10 + position


def name_of(index, s) -> str:
    """ "c<chain>@<frontier>" of a snapshot (chain of its anchor block)."""
    tok0 = int.from_bytes(index.node(s.anchor).tokens[:4], "little") if s.anchor else 0
    return f"c{tok0 // 1000}@{s.frontier}"


def names(index) -> set[str]:
    return {name_of(index, s) for s in index.snapshots.by_id.values()}


def check_contents(bridge) -> None:
    """Every restored block and snapshot slab holds the pattern of what it holds."""
    index, slabs = bridge.index, bridge.host_slabs
    for node in index.blocks.tree.nodes.values():
        if node.id == ROOT:
            continue
        chain, rest = divmod(int.from_bytes(node.tokens[:4], "little"), 1000)
        seed = chain * 100 + rest // 64
        assert torch.equal(slabs.slab_view(node.host_slab), pattern(seed)), node.id
    for s in index.snapshots.by_id.values():
        ids = [*s.host_slabs, s.tail_slab] if s.tail else s.host_slabs
        for p, slab in enumerate(ids):
            assert torch.equal(slabs.slab_view(slab), pattern(snapshot_seed(index, s, p)))


def file_for(path, fingerprint=None) -> PrefixCacheFile:
    return PrefixCacheFile(path, dict(fingerprint or FINGERPRINT))
