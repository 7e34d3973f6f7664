"""Host slab geometry, chunking and the budget check."""

from __future__ import annotations

import pytest
import torch

from ninfer.memory.host_slabs import MIB, HostSlabs, SlabGeometry, plan_slab_geometry


def test_geometry_27b_bf16():
    # 16 FA layers x 4 KV heads x 256 x bf16: 256 KiB per layer page, 4 MiB per bundle;
    # image 48 x (3 MiB + 60 KiB) -> 37 slabs.
    image = 48 * (3 * MIB + 10240 * 3 * 2)
    g = plan_slab_geometry(8192, 16, 2 * 64 * 4 * 256 * 2, image)
    assert (g.cell_bytes, g.slab_bytes, g.num_slabs) == (256 << 10, 4 * MIB, 2048)
    assert (g.slabs_per_chunk, g.num_chunks, g.image_slabs) == (1024, 2, 37)
    assert g.chunk_starts == (0, 1024) and g.chunk_slabs == (1024, 1024)
    assert g.locate(1023) == (0, 1023) and g.locate(1024) == (1, 0)


def test_last_chunk_is_partial_and_slabs_never_cross_chunks():
    g = plan_slab_geometry(1, 2, 1024, 3000, max_chunk_bytes=7 * 2048 + 100)
    assert g.num_slabs == 512 and g.slabs_per_chunk == 7
    assert g.num_chunks == 74 and g.chunk_slabs[-1] == 512 - 73 * 7
    assert sum(g.chunk_slabs) == g.num_slabs
    with pytest.raises(IndexError):
        g.locate(512)


def test_zero_budget_means_no_host_tier():
    assert plan_slab_geometry(0, 2, 1024, 3000) is None


def test_budget_below_one_snapshot_plus_one_block_is_rejected():
    # 1 MiB = 512 slabs of 2048 B: an image of 511 slabs leaves no room for its tail and a block
    with pytest.raises(ValueError, match=r"host_cache_mib=1 .* host_cache_mib >= 2"):
        plan_slab_geometry(1, 2, 1024, 511 * 2048)
    assert plan_slab_geometry(1, 2, 1024, 510 * 2048).num_slabs == 512
    with pytest.raises(ValueError, match="host_cache_mib must be >= 0"):
        plan_slab_geometry(-1, 2, 1024, 3000)
    with pytest.raises(ValueError, match="does not fit a chunk"):
        plan_slab_geometry(1, 2, 1024, 3000, max_chunk_bytes=2047)


def test_host_slabs_layout_is_layer_major():
    g = plan_slab_geometry(1, 3, 512, 2000, max_chunk_bytes=5 * 1536)
    slabs = HostSlabs(g, pin=False)
    assert [tuple(c.shape) for c in slabs.chunks[:2]] == [(3, 5, 512), (3, 5, 512)]
    assert tuple(slabs.chunks[-1].shape) == (3, g.chunk_slabs[-1], 512)
    row = slabs.row(1, 2)
    assert row.is_contiguous() and row.numel() == 5 * 512
    # slab 7 = chunk 1, local 2: its cell of layer row 2 is bytes [1024, 1536) of that row
    slabs.chunks[1].zero_()
    slabs.slab_view(7)[2].fill_(7)
    assert bool((row[1024:1536] == 7).all()) and int(row[:1024].eq(7).sum()) == 0


def test_for_pools_sizes_from_the_device_tensors():
    kv = [torch.zeros(4, 2, 64, 1, 4, dtype=torch.bfloat16) for _ in range(2)]
    conv = torch.zeros(3, 6, 8, 3, dtype=torch.bfloat16)
    ssm = torch.zeros(3, 6, 4, 8, 8)
    slabs = HostSlabs.for_pools(kv, conv, ssm, 1, max_chunk_bytes=8 * 2048)
    assert slabs.geometry == SlabGeometry(
        n_fa_layers=2,
        cell_bytes=1024,
        slab_bytes=2048,
        num_slabs=512,
        slabs_per_chunk=8,
        image_bytes=6 * (8 * 3 * 2 + 4 * 8 * 8 * 4),
        image_slabs=4,
    )
    assert not slabs.pinned and len(slabs.chunks) == 64
    assert HostSlabs.for_pools(kv, conv, ssm, 0) is None
