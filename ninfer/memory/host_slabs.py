"""The Host tier's memory (design §5.4 HostSlabPool): pinned slabs in chunks of at most 4 GiB.

A slab holds one block bundle: that block's page of every full-attention layer (one "cell" of
page_bytes = 2 * 64 * Hkv * head_dim * itemsize per layer). A chunk is laid out layer-major, so
one layer's run of consecutive slabs is one contiguous byte range (ADAPTATION.md: a contiguous
pinned range copies at full PCIe speed; a strided view stages through a slow CPU copy):

    chunk c: uint8 [n_fa, slabs_in_chunk, cell_bytes]

                 local slab 0   local slab 1   local slab 2        ...
    fa row 0   | cell (L0,s0) | cell (L0,s1) | cell (L0,s2) | ...        <- one contiguous row
    fa row 1   | cell (L1,s0) | cell (L1,s1) | cell (L1,s2) | ...
      ...
    fa row F-1 | cell         | cell         | cell         | ...

    global slab s = chunk_start[c] + local;  slab_bytes = n_fa * cell_bytes;
    a slab never crosses a chunk.

A snapshot image (every GDN layer's ssm then conv bytes of one state slot) spans
`image_slabs = ceil(image_bytes / slab_bytes)` slabs; `copy_runs.ImageMap` defines where each
image byte lives. A snapshot tail is one page bundle, i.e. one slab like a block.

This module owns bytes only. The geometry is the cache's `SlabGeometry`
(`ninfer.cache.host_pool`), computed once by the engine and handed to both sides; which slab is
free, or holds which block, is the prefix index's business.
"""

from __future__ import annotations

import torch

from ninfer.cache.host_pool import SlabGeometry


class HostSlabs:
    """The Host tier's chunks: pinned on CUDA, plain memory on the CPU.

    chunks[c]: uint8 [n_fa, geometry.chunk_slabs[c], cell_bytes]; `row(c, fa)` is its flat,
    contiguous layer row. Contents are unspecified until written. Owns no policy; never
    mutated except by the copies `HostTransfer` issues and by a persistence load
    (`ninfer.persist.payload.read_payload`, through `chunks`).
    """

    def __init__(self, geometry: SlabGeometry, *, pin: bool) -> None:
        self.geometry = geometry
        self.pinned = pin
        g = geometry
        self.chunks = [
            torch.empty((g.n_fa_layers, n, g.cell_bytes), dtype=torch.uint8, pin_memory=pin)
            for n in g.chunk_slabs
        ]
        self._rows = [[chunk[fa].view(-1) for fa in range(g.n_fa_layers)] for chunk in self.chunks]

    @property
    def num_slabs(self) -> int:
        return self.geometry.num_slabs

    @property
    def slab_bytes(self) -> int:
        return self.geometry.slab_bytes

    def row(self, chunk: int, fa: int) -> torch.Tensor:
        """Flat uint8 view of chunk `chunk`'s layer row `fa` (contiguous)."""
        return self._rows[chunk][fa]

    def slab_view(self, slab: int) -> torch.Tensor:
        """uint8 [n_fa, cell_bytes] view of one slab (strided across rows; for persistence and
        tests, not for Device copies)."""
        chunk, local = self.geometry.locate(slab)
        return self.chunks[chunk][:, local]
