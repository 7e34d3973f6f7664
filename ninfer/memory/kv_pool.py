"""The Device KV page pool: one FlashInfer-layout tensor per full-attention layer.

    kv[layer]: [pages, 2, 64, Hkv, head_dim]   (dim 1: 0 = K, 1 = V)

A page id names the same page in every full-attention layer (one "page group", design §5.4).
The pool owns the tensors and the Free list only. Every non-free page is owned by exactly one
of: an active lane (private), the prefix index (a cached node or a snapshot tail), or a Filling
transfer; those owners keep their own sets and `check_partition` verifies, in debug mode, that
free + active + cached + filling is a partition of all pages.

Allocation hands out consecutive ids where it can, ascending: `alloc(n)` takes the lowest run
of n consecutive free pages when one exists (a C-speed search of the free flags), else the n
lowest free pages (a min-heap). So the pages a lane grows into, and hence the blocks it writes
through at release, and the pages a restore fills, are mostly consecutive: `copy_runs` joins
consecutive pages (and slabs) into one copy per layer, which runs near the PCIe bound where a
copy per scattered page runs far below it (docs/results-h200.md, "Copies the cache tiers
need").

Free-list invariant: `_flags[p]` is 1 iff page p is free and `_num_free` counts them; every free
page is in `_heap` (entries of allocated pages are stale and skipped when popped; the heap is
rebuilt when stale entries outnumber live ones).

Mutates: `alloc` / `free` change the Free list; `copy_prefix` writes page contents.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import torch

from ninfer.page import PAGE_SIZE


class KVPool:
    def __init__(
        self,
        num_pages: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        scratch: int = 0,
    ) -> None:
        self.num_pages = num_pages
        # `scratch` more pages after the pool's, never allocated: ids num_pages.. (the prefill
        # graphs' padding row writes its K/V there)
        self.scratch_pages = list(range(num_pages, num_pages + scratch))
        shape = (num_pages + scratch, 2, PAGE_SIZE, num_kv_heads, head_dim)
        self.kv = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._flags = bytearray(b"\x01") * num_pages  # 1 = free
        self._heap: list[int] = list(range(num_pages))  # a sorted list is a valid min-heap
        self._num_free = num_pages

    # ---- allocation -----------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self._num_free

    def alloc(self, n: int) -> list[int]:
        """Take n free pages, ascending: the lowest run of n consecutive free pages if there is
        one, else the n lowest free pages. Raises RuntimeError if fewer are free (callers
        check first)."""
        if n > self._num_free:
            raise RuntimeError(f"KV pool: asked for {n} pages, {self._num_free} free")
        flags = self._flags
        start = flags.find(b"\x01" * n) if n > 1 else -1
        if start >= 0:
            pages = list(range(start, start + n))
            flags[start : start + n] = bytes(n)
        else:
            pages, heap, pop = [], self._heap, heapq.heappop
            while len(pages) < n:
                p = pop(heap)
                if flags[p]:
                    flags[p] = 0
                    pages.append(p)
        self._num_free -= n
        if len(self._heap) > 2 * self._num_free + 1024:  # drop stale entries
            self._heap = [p for p, f in enumerate(flags) if f]
        return pages

    def free(self, pages: Iterable[int]) -> None:
        """Return pages to the Free list. Raises on a double free."""
        flags, heap = self._flags, self._heap
        for p in pages:
            if flags[p]:
                raise RuntimeError(f"KV pool: page {p} freed twice")
            flags[p] = 1
            heapq.heappush(heap, p)
            self._num_free += 1

    # ---- contents -------------------------------------------------------------------------
    def copy_prefix(self, src: int, dst: int, tokens: int) -> None:
        """Copy the first `tokens` slots of page `src` into page `dst` in every layer (a COW of
        a partial tail page, design §6.4 / §7.4). Queued on the current stream."""
        for layer in self.kv:
            layer[dst, :, :tokens].copy_(layer[src, :, :tokens])

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv)

    # ---- invariants -----------------------------------------------------------------------
    def check_partition(
        self, active: Iterable[int], cached: Iterable[int], filling: Iterable[int] = ()
    ) -> None:
        """Assert every page is exactly one of free / active / cached / filling (design §10.1)."""
        seen: dict[int, str] = {p: "free" for p, f in enumerate(self._flags) if f}
        if len(seen) != self._num_free:
            raise AssertionError("KV pool: free count and free flags differ")
        if not seen.keys() <= set(self._heap):
            raise AssertionError("KV pool: a free page is missing from the heap")
        for role, pages in (("active", active), ("cached", cached), ("filling", filling)):
            for p in pages:
                if p in seen:
                    raise AssertionError(f"KV pool: page {p} is both {seen[p]} and {role}")
                if self._flags[p]:
                    raise AssertionError(f"KV pool: {role} page {p} is marked free")
                seen[p] = role
        if len(seen) != self.num_pages:
            lost = sorted(set(range(self.num_pages)) - seen.keys())[:8]
            raise AssertionError(f"KV pool: pages owned by nobody (leaked): {lost} ...")
