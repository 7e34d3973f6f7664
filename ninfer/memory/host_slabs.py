"""The Host tier's memory (spec §5.4 HostSlabPool): pinned slabs in chunks of at most 4 GiB.

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

This module owns bytes and geometry only. Which slab is free, or holds which block, is the
prefix index's business (`ninfer/cache/`); it only needs the counts in `SlabGeometry`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIB = 1 << 20
MAX_CHUNK_BYTES = 4 << 30


@dataclass(frozen=True, slots=True)
class SlabGeometry:
    """Plain-int geometry of the Host tier (the cache index sizes its slab allocator from it).

    chunk_starts[c] is the first global slab of chunk c; chunk c holds chunk_slabs[c] slabs
    (every chunk but the last holds slabs_per_chunk).
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


def plan_slab_geometry(
    host_cache_mib: int,
    n_fa_layers: int,
    page_bytes: int,
    image_bytes: int,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
) -> SlabGeometry | None:
    """Geometry for a Host tier of `host_cache_mib` MiB; None when it is 0 (Device only).

    Raises ValueError when a nonzero budget holds less than one snapshot (image + tail slab)
    plus one block (spec §5.4; the index's rule), or when one slab does not fit a chunk.
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
    image_slabs = -(-image_bytes // slab_bytes)
    num_slabs = host_cache_mib * MIB // slab_bytes
    need = image_slabs + 2
    if num_slabs < need:
        need_mib = -(-need * slab_bytes // MIB)
        raise ValueError(
            f"host_cache_mib={host_cache_mib} holds {num_slabs} slabs of {slab_bytes} B, but the "
            f"Host tier needs one snapshot (image {image_slabs} slabs + tail 1) plus one block: "
            f"set host_cache_mib >= {need_mib}, or 0 for no Host tier"
        )
    per_chunk = max_chunk_bytes // slab_bytes
    if per_chunk < 1:
        raise ValueError(f"a slab of {slab_bytes} B does not fit a chunk of {max_chunk_bytes} B")
    return SlabGeometry(
        n_fa_layers=n_fa_layers,
        cell_bytes=page_bytes,
        slab_bytes=slab_bytes,
        num_slabs=num_slabs,
        slabs_per_chunk=min(per_chunk, num_slabs),
        image_bytes=image_bytes,
        image_slabs=image_slabs,
    )


class HostSlabs:
    """The Host tier's chunks: pinned on CUDA, plain memory on the CPU.

    chunks[c]: uint8 [n_fa, geometry.chunk_slabs[c], cell_bytes]; `row(c, fa)` is its flat,
    contiguous layer row. Contents are unspecified until written. Owns no policy; never
    mutated except by the copies `Transfer` issues and by a persistence load
    (`persist_file.read_payload`, through `chunks`).
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

    @classmethod
    def for_pools(
        cls,
        kv: list[torch.Tensor],
        conv: torch.Tensor,
        ssm: torch.Tensor,
        host_cache_mib: int,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
    ) -> HostSlabs | None:
        """Size the tier from the Device pools (`ModelCache.kv / conv / ssm` layouts); None when
        host_cache_mib is 0. Pinned iff the pools live on CUDA. Raises ValueError as
        `plan_slab_geometry` does."""
        page_bytes = {_nbytes(layer[0]) for layer in kv}
        if len(page_bytes) > 1:
            raise ValueError(f"full-attention layers differ in page bytes: {sorted(page_bytes)}")
        geometry = plan_slab_geometry(
            host_cache_mib,
            n_fa_layers=len(kv),
            page_bytes=page_bytes.pop() if page_bytes else 0,
            image_bytes=_nbytes(conv[0]) + _nbytes(ssm[0]),
            max_chunk_bytes=max_chunk_bytes,
        )
        if geometry is None:
            return None
        return cls(geometry, pin=ssm.device.type == "cuda")

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


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
