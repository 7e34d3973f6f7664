"""The Host tier's slab geometry and its slab allocator (design §5.4 HostSlabPool).

The tier is `host_cache_bytes` cut into `slab_bytes` slabs, pinned by the memory layer in
chunks of at most `max_chunk_bytes` whole slabs, so a slab never crosses a chunk:

    chunk 0                           chunk 1                  chunk 2 (remainder)
    |slab 0|slab 1|...|slab c-1|      |slab c|...|slab 2c-1|   |slab 2c|...|slab n-1|
    c = max_chunk_bytes // slab_bytes, n = host_cache_bytes // slab_bytes

A slab holds one block bundle: that block's page of every full-attention layer (n_fa "cells"
of cell_bytes, laid out by `ninfer.memory.host_slabs`). Capacity is just the number of free
slabs: KV blocks take one slab, a snapshot image ceil(image_bytes / slab_bytes) slabs (any
slabs: byte o of the packed image lives in the o // slab_bytes-th slab of its list), a
snapshot tail one more.

One `SlabGeometry` describes the tier: the engine computes it once (`plan_slab_geometry`, at
`resolve()`) and hands that object to this pool, to the pinned slabs, to copy planning and to
the prefix cache file; nothing recomputes or cross-checks it. Pure Python (no torch).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from ninfer.cache.common import ceil_div

MIB = 1 << 20
MAX_CHUNK_BYTES = 4 << 30


@dataclass(frozen=True, slots=True)
class SlabGeometry:
    """Plain-int geometry of the Host tier.

    chunk_starts[c] is the first global slab of chunk c; chunk c holds chunk_slabs[c] slabs
    (every chunk but the last holds slabs_per_chunk). Without layer rows (the cache alone, slabs
    opaque) n_fa_layers is 1 and a cell is the whole slab.
    """

    n_fa_layers: int
    cell_bytes: int  # one full-attention layer's page
    slab_bytes: int  # n_fa_layers * cell_bytes: one block bundle
    num_slabs: int
    slabs_per_chunk: int
    image_bytes: int
    image_slabs: int  # ceil(image_bytes / slab_bytes)

    @property
    def num_chunks(self) -> int:
        return -(-self.num_slabs // self.slabs_per_chunk)

    @property
    def chunk_starts(self) -> tuple[int, ...]:
        return tuple(range(0, self.num_slabs, self.slabs_per_chunk))

    @property
    def chunk_slabs(self) -> tuple[int, ...]:
        return tuple(min(self.slabs_per_chunk, self.num_slabs - s) for s in self.chunk_starts)

    @property
    def total_bytes(self) -> int:
        return self.num_slabs * self.slab_bytes

    def locate(self, slab: int) -> tuple[int, int]:
        """(chunk, local slab) of global slab `slab`. Raises IndexError when out of range."""
        if not 0 <= slab < self.num_slabs:
            raise IndexError(f"slab {slab} out of range [0, {self.num_slabs})")
        return divmod(slab, self.slabs_per_chunk)

    def file_dict(self) -> dict:
        """What a prefix cache file records of the geometry: a load needs these equal (the
        slab count and the chunking may differ between the saving and the loading tier)."""
        return {
            "n_fa_layers": self.n_fa_layers,
            "cell_bytes": self.cell_bytes,
            "slab_bytes": self.slab_bytes,
            "image_bytes": self.image_bytes,
            "image_slabs": self.image_slabs,
        }


def cut_slabs(
    host_cache_bytes: int,
    slab_bytes: int,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    image_bytes: int = 0,
    n_fa_layers: int = 1,
) -> SlabGeometry:
    """`host_cache_bytes` cut into whole slabs and chunks (no budget rule: see
    `check_host_budget`). Raises ValueError when a slab is empty or does not fit a chunk."""
    if slab_bytes <= 0:
        raise ValueError(f"slab_bytes must be positive, got {slab_bytes}")
    if max_chunk_bytes < slab_bytes:
        raise ValueError("max_chunk_bytes must hold at least one slab")
    num_slabs = host_cache_bytes // slab_bytes
    return SlabGeometry(
        n_fa_layers=n_fa_layers,
        cell_bytes=slab_bytes // n_fa_layers,
        slab_bytes=slab_bytes,
        num_slabs=num_slabs,
        slabs_per_chunk=max(1, min(max_chunk_bytes // slab_bytes, num_slabs)),
        image_bytes=image_bytes,
        image_slabs=ceil_div(image_bytes, slab_bytes),
    )


def check_host_budget(geometry: SlabGeometry, name: str, budget: int, unit: int = 1) -> None:
    """The §5.4 rule: a Host tier holds at least one snapshot (image slabs + tail slab) plus
    one block. Raises ValueError naming the option `name` = `budget` (in `unit` bytes)."""
    g = geometry
    need = g.image_slabs + 2
    if g.num_slabs < need:
        raise ValueError(
            f"{name}={budget} holds {g.num_slabs} slabs of {g.slab_bytes} B, but the Host tier "
            f"needs one snapshot plus one block (image {g.image_slabs} slabs + tail 1 + block "
            f"1): set {name} >= {ceil_div(need * g.slab_bytes, unit)}, or 0 for no Host tier"
        )


def plan_slab_geometry(
    host_cache_mib: int,
    n_fa_layers: int,
    page_bytes: int,
    image_bytes: int,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
) -> SlabGeometry | None:
    """The engine's Host tier of `host_cache_mib` MiB, slabs of one page per full-attention
    layer; None when the budget is 0 (Device only).

    Raises ValueError when a nonzero budget holds less than one snapshot (image + tail slab)
    plus one block (`check_host_budget`), or when one slab does not fit a chunk.
    """
    if host_cache_mib < 0:
        raise ValueError(f"host_cache_mib must be >= 0, got {host_cache_mib}")
    if host_cache_mib == 0:
        return None
    if n_fa_layers <= 0 or page_bytes <= 0 or image_bytes < 0:
        raise ValueError(
            f"Host slabs need full-attention pages: n_fa_layers={n_fa_layers}, "
            f"page_bytes={page_bytes}, image_bytes={image_bytes}"
        )
    slab_bytes = n_fa_layers * page_bytes
    if max_chunk_bytes < slab_bytes:
        raise ValueError(f"a slab of {slab_bytes} B does not fit a chunk of {max_chunk_bytes} B")
    g = cut_slabs(host_cache_mib * MIB, slab_bytes, max_chunk_bytes, image_bytes, n_fa_layers)
    check_host_budget(g, "host_cache_mib", host_cache_mib, MIB)
    return g


class HostSlabPool:
    """Fixed-size slab allocator over a min-heap of free slab ids, for one `SlabGeometry`.

    Invariants (check_invariants):
      - every slab index in [0, n_slabs) is either on the free heap (exactly once) or allocated;
      - allocation is all-or-nothing: `allocate(k)` returns k distinct slabs or None;
      - a slab's bytes [offset, offset + slab_bytes) lie inside one chunk.
    `allocate` hands out the lowest free slabs, ascending (O(k log n), not O(1)
    stack): a write-through batch or a snapshot image then lands in consecutive slabs, which
    the memory layer copies as one run per layer (docs/results-h200.md, "Copies the cache tiers
    need": a run near the PCIe bound, scattered copies far below it).
    """

    __slots__ = ("geometry", "slab_bytes", "n_slabs", "slabs_per_chunk", "_free", "_allocated")

    def __init__(self, geometry: SlabGeometry) -> None:
        self.geometry = geometry
        self.slab_bytes = geometry.slab_bytes
        self.n_slabs = geometry.num_slabs
        self.slabs_per_chunk = geometry.slabs_per_chunk
        # A sorted list is a valid min-heap: 0, 1, 2, ... come out first.
        self._free: list[int] = list(range(self.n_slabs))
        self._allocated = bytearray(self.n_slabs)

    @property
    def free_slabs(self) -> int:
        return len(self._free)

    def allocate(self, k: int) -> list[int] | None:
        """Pop k slabs (mutates), or return None and change nothing when fewer are free."""
        if k > len(self._free):
            return None
        free, pop = self._free, heapq.heappop
        out = [pop(free) for _ in range(k)]
        for s in out:
            self._allocated[s] = 1
        return out

    def free(self, slabs: Iterable[int]) -> None:
        """Return slabs to the free heap (mutates). Raises ValueError on a slab not allocated."""
        for s in slabs:
            if not 0 <= s < self.n_slabs or not self._allocated[s]:
                raise ValueError(f"slab {s} is not allocated")
            self._allocated[s] = 0
            heapq.heappush(self._free, s)

    def is_allocated(self, slab: int) -> bool:
        return bool(self._allocated[slab])

    def check_invariants(self) -> None:
        free = self._free
        assert len(set(free)) == len(free), "slab on the free heap twice"
        for s in free:
            assert not self._allocated[s], f"slab {s} both free and allocated"
        assert len(free) + sum(self._allocated) == self.n_slabs, "slab neither free nor allocated"
