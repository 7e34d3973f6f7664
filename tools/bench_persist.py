"""Save and load throughput of the prefix cache file (spec §5.5) for a Host tier of several GB.

Fills a Host tier of Qwen3.5-27B geometry (16 full-attention layers: 4 MiB slabs; a 147 MiB
state image: 37 slabs) with conversations (a 2048-token block chain + its snapshot each, random
slab bytes) through the real index (`load_block` / `load_snapshot`), then runs the real save
(`PrefixCacheFile.save`: temp file, xxh3 per slab, fsync, rename) and the real load (tables,
plan, rebuild, checked slab reads) into a fresh index over the same slabs. The load is timed
cold (the file's pages dropped from the page cache with posix_fadvise) and warm.

    python tools/bench_persist.py [--gib 4] [--dir DIR]

Prints bytes, seconds and GB/s per phase; deletes the file afterwards.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from ninfer.cache import CacheConfig, CacheCostModel, PrefixIndex, SnapshotKind
from ninfer.cache.common import ROOT
from ninfer.cache.host_pool import plan_slab_geometry
from ninfer.memory.host_slabs import HostSlabs
from ninfer.models.presets import PRESETS
from ninfer.page import PAGE_SIZE
from ninfer.persist.cache_file import PrefixCacheFile

MIB = 1 << 20
MODEL = PRESETS["27B"]  # bf16 weights and KV
N_FA = len(MODEL.full_layer_ids)
CELL = MODEL.kv_bytes_per_token(2) * PAGE_SIZE // N_FA  # one page of one full-attention layer
IMAGE = MODEL.state_image_bytes(2)  # every GDN layer: fp32 recurrent state + bf16 conv window
BLOCKS_PER_CONVERSATION = 32


def build_tier(gib: float):
    g = plan_slab_geometry(int(gib * 1024), N_FA, CELL, IMAGE)
    slabs = HostSlabs(g, pin=False)
    noise = torch.randint(0, 256, (64 * MIB,), dtype=torch.uint8)
    for chunk in slabs.chunks:
        flat = chunk.view(-1)
        for o in range(0, flat.numel(), noise.numel()):
            n = min(noise.numel(), flat.numel() - o)
            flat[o : o + n].copy_(noise[:n])
            noise = noise.roll(4099)
    return slabs


def fresh_index(slabs: HostSlabs) -> PrefixIndex:
    g = slabs.geometry
    return PrefixIndex(CacheConfig.for_host(g, device_snapshot_slots=9), CacheCostModel.h200())


def fill(index: PrefixIndex, image_slabs: int) -> int:
    """Conversations until the tier is full; returns how many."""
    need = BLOCKS_PER_CONVERSATION + image_slabs
    n = 0
    while index.host.free_slabs >= need:
        parent = ROOT
        for d in range(BLOCKS_PER_CONVERSATION):
            parent = index.load_block(parent, [n * 100_000 + d * 64 + i for i in range(64)])
        index.load_snapshot(parent, (), SnapshotKind.ENDPOINT, hits=n % 3)
        n += 1
    return n


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def report(label: str, nbytes: int, seconds: float) -> None:
    print(f"{label:<22} {nbytes / 1e9:8.3f} GB {seconds:8.3f} s {nbytes / seconds / 1e9:8.2f} GB/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0, help="Host tier size (GiB)")
    ap.add_argument("--dir", default=None, help="directory for the file (default: a temp dir)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    slabs = build_tier(args.gib)
    g = slabs.geometry
    index = fresh_index(slabs)
    convs = fill(index, g.image_slabs)
    used = g.num_slabs - index.host.free_slabs
    print(
        f"Host tier {g.total_bytes / 2**30:.2f} GiB: {g.num_slabs} slabs of {g.slab_bytes} B, "
        f"image {g.image_slabs} slabs; {convs} conversations, {used} slabs in use "
        f"(filled in {time.perf_counter() - t0:.1f} s)"
    )
    workdir = Path(tempfile.mkdtemp(prefix="bench_persist_", dir=args.dir))
    path = workdir / "cache.hpc"
    fp = {"model": {"checkpoint": "bench"}, "format_version": 1}
    try:
        saver = PrefixCacheFile(path, fp)
        result = saver.save(SimpleNamespace(index=index, host_slabs=slabs))
        assert result is not None
        report("save (incl. fsync)", result.bytes, result.seconds)
        for label, cold in (("load, cold page cache", True), ("load, warm page cache", False)):
            if cold:
                drop_cache(path)
            bridge = SimpleNamespace(index=fresh_index(slabs), host_slabs=slabs)
            loader = PrefixCacheFile(path, fp)
            t = time.perf_counter()
            restored = loader.load(bridge)
            dt = time.perf_counter() - t
            assert restored == convs, (restored, convs)
            report(label, loader.last_load.bytes, dt)
    finally:
        path.unlink(missing_ok=True)
        workdir.rmdir()


if __name__ == "__main__":
    main()
