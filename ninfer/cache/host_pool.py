"""HostSlabPool: the index side of the pinned Host tier (spec §5.4).

The pool is `host_cache_bytes` cut into `slab_bytes` slabs, pinned by the memory layer in
chunks of at most `max_chunk_bytes` whole slabs, so a slab never crosses a chunk:

    chunk 0                           chunk 1                  chunk 2 (remainder)
    |slab 0|slab 1|...|slab c-1|      |slab c|...|slab 2c-1|   |slab 2c|...|slab n-1|
    c = max_chunk_bytes // slab_bytes, n = host_cache_bytes // slab_bytes

Capacity is just the number of free slabs: KV blocks take one slab, a snapshot image
ceil(image_bytes / slab_bytes) slabs (any slabs: byte o of the packed image lives in the o //
slab_bytes-th slab of its list), a snapshot tail one more.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from ninfer.cache.common import ceil_div


class SlabLocation(NamedTuple):
    chunk: int
    offset_bytes: int  # within the chunk


class CopyRun(NamedTuple):
    """`count` consecutive pages starting at `page` <-> consecutive slabs starting at `slab`."""

    page: int
    slab: int
    count: int


class HostSlabPool:
    """Fixed-size slab allocator over a min-heap of free slab ids.

    Invariants (check_invariants):
      - every slab index in [0, n_slabs) is either on the free heap (exactly once) or allocated;
      - allocation is all-or-nothing: `allocate(k)` returns k distinct slabs or None;
      - a slab's bytes [offset, offset + slab_bytes) lie inside one chunk.
    `allocate` hands out the lowest free slabs, ascending (O(k log n), not the spec's O(1)
    stack): a write-through batch or a snapshot image then lands in consecutive slabs, which
    the memory layer copies as one run per layer (about 2x faster than scattered slabs).
    """

    __slots__ = ("slab_bytes", "n_slabs", "slabs_per_chunk", "_free", "_allocated")

    def __init__(self, host_cache_bytes: int, slab_bytes: int, max_chunk_bytes: int = 4 << 30):
        if slab_bytes <= 0:
            raise ValueError(f"slab_bytes must be positive, got {slab_bytes}")
        if max_chunk_bytes < slab_bytes:
            raise ValueError("max_chunk_bytes must hold at least one slab")
        self.slab_bytes = slab_bytes
        self.n_slabs = host_cache_bytes // slab_bytes
        self.slabs_per_chunk = max_chunk_bytes // slab_bytes
        # A sorted list is a valid min-heap: 0, 1, 2, ... come out first.
        self._free: list[int] = list(range(self.n_slabs))
        self._allocated = bytearray(self.n_slabs)

    @property
    def free_slabs(self) -> int:
        return len(self._free)

    @property
    def n_chunks(self) -> int:
        return ceil_div(self.n_slabs, self.slabs_per_chunk)

    def chunk_bytes(self, chunk: int) -> int:
        """Bytes the memory layer pins for `chunk` (whole slabs only)."""
        first = chunk * self.slabs_per_chunk
        return (min(first + self.slabs_per_chunk, self.n_slabs) - first) * self.slab_bytes

    def slab_location(self, slab: int) -> SlabLocation:
        chunk, index = divmod(slab, self.slabs_per_chunk)
        return SlabLocation(chunk, index * self.slab_bytes)

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

    def copy_runs(self, pairs: Sequence[tuple[int, int]]) -> list[CopyRun]:
        """Coalesce (page, slab) pairs, in order, into runs of consecutive pages and slabs that
        stay inside one chunk (a strided copy across chunks would address unrelated memory)."""
        runs: list[CopyRun] = []
        for page, slab in pairs:
            if runs:
                last = runs[-1]
                if (
                    page == last.page + last.count
                    and slab == last.slab + last.count
                    and slab // self.slabs_per_chunk == last.slab // self.slabs_per_chunk
                ):
                    runs[-1] = last._replace(count=last.count + 1)
                    continue
            runs.append(CopyRun(page, slab, 1))
        return runs

    def check_invariants(self) -> None:
        free = self._free
        assert len(set(free)) == len(free), "slab on the free heap twice"
        for s in free:
            assert not self._allocated[s], f"slab {s} both free and allocated"
        assert len(free) + sum(self._allocated) == self.n_slabs, "slab neither free nor allocated"
