"""The Host tier's pinned slabs: layer-major chunks cut by the geometry of the Device pools."""

from __future__ import annotations

import torch
from slab_helpers import slabs_for_pools

from ninfer.cache.host_pool import SlabGeometry, plan_slab_geometry
from ninfer.memory.host_slabs import HostSlabs


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


def test_geometry_from_the_device_pools_sizes():
    kv = [torch.zeros(4, 2, 64, 1, 4, dtype=torch.bfloat16) for _ in range(2)]
    conv = torch.zeros(3, 6, 8, 3, dtype=torch.bfloat16)
    ssm = torch.zeros(3, 6, 4, 8, 8)
    slabs = slabs_for_pools(kv, conv, ssm, 1, max_chunk_bytes=8 * 2048)
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
    assert plan_slab_geometry(0, 2, 1024, 6000) is None
