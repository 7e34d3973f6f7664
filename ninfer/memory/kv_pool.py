"""The Device KV page pool: one FlashInfer-layout tensor per full-attention layer.

    kv[layer]: [pages, 2, 64, Hkv, head_dim]   (dim 1: 0 = K, 1 = V)

A page id names the same page in every full-attention layer (one "page group", spec §5.4).
The pool owns the tensors and the Free list only. Every non-free page is owned by exactly one
of: an active lane (private), the prefix index (a cached node or a snapshot tail), or a Filling
transfer; those owners keep their own sets and `check_partition` verifies, in debug mode, that
free + active + cached + filling is a partition of all pages.

Mutates: `alloc` / `free` change the Free list; `copy_prefix` writes page contents.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ninfer.models.batch import PAGE_SIZE


class KVPool:
    def __init__(
        self,
        num_pages: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_pages = num_pages
        shape = (num_pages, 2, PAGE_SIZE, num_kv_heads, head_dim)
        self.kv = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # LIFO free stack: recently freed pages are reused first (warm in L2 on CUDA).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._is_free = [True] * num_pages

    # ---- allocation -----------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        """Take `n` free pages. Raises RuntimeError if fewer are free (callers check first)."""
        if n > len(self._free):
            raise RuntimeError(f"KV pool: asked for {n} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._is_free[p] = False
        return pages

    def free(self, pages: Iterable[int]) -> None:
        """Return pages to the Free list. Raises on a double free."""
        for p in pages:
            if self._is_free[p]:
                raise RuntimeError(f"KV pool: page {p} freed twice")
            self._is_free[p] = True
            self._free.append(p)

    # ---- contents -------------------------------------------------------------------------
    def copy_prefix(self, src: int, dst: int, tokens: int) -> None:
        """Copy the first `tokens` slots of page `src` into page `dst` in every layer (a COW of
        a partial tail page, spec §6.4 / §7.4). Queued on the current stream."""
        for layer in self.kv:
            layer[dst, :, :tokens].copy_(layer[src, :, :tokens])

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv)

    # ---- invariants -----------------------------------------------------------------------
    def check_partition(
        self, active: Iterable[int], cached: Iterable[int], filling: Iterable[int] = ()
    ) -> None:
        """Assert every page is exactly one of free / active / cached / filling (spec §10.1)."""
        seen: dict[int, str] = {p: "free" for p in self._free}
        if len(seen) != len(self._free):
            raise AssertionError("KV pool: a page is on the free list twice")
        for role, pages in (("active", active), ("cached", cached), ("filling", filling)):
            for p in pages:
                if p in seen:
                    raise AssertionError(f"KV pool: page {p} is both {seen[p]} and {role}")
                if self._is_free[p]:
                    raise AssertionError(f"KV pool: {role} page {p} is marked free")
                seen[p] = role
        if len(seen) != self.num_pages:
            lost = sorted(set(range(self.num_pages)) - seen.keys())[:8]
            raise AssertionError(f"KV pool: pages owned by nobody (leaked): {lost} ...")
