"""The Host transfer driven with the index's own copy records (`RestoreBatch`, `BlockWriteBatch`,
`SnapshotWrite`)."""

from __future__ import annotations

import torch
from slab_helpers import slabs_for_pools

from ninfer.cache.records import (
    BlockCopy,
    BlockWriteBatch,
    ImageCopy,
    RestoreBatch,
    SnapshotWrite,
    TailCopy,
)
from ninfer.memory.streams import Streams
from ninfer.memory.transfer import HostTransfer, Landed

LAYERS = ("linear_attention", "linear_attention", "full_attention") * 2


def setup(chunk_slabs: int = 3):
    gen = torch.Generator().manual_seed(5)
    kv = [torch.randn(16, 2, 64, 1, 4, generator=gen).to(torch.bfloat16) for _ in range(2)]
    conv = torch.randn(3, 4, 8, 3, generator=gen).to(torch.bfloat16)
    ssm = torch.randn(3, 4, 2, 8, 8, generator=gen)
    chunk = chunk_slabs * 2 * 1024
    slabs = slabs_for_pools(kv, conv, ssm, 1, max_chunk_bytes=chunk)
    seam = HostTransfer(slabs, kv, conv, ssm, LAYERS, Streams(torch.device("cpu")))
    return seam, kv, conv, ssm


def test_blocks_snapshot_and_restore_through_the_seam():
    seam, kv, conv, ssm = setup()
    img = seam.slabs.geometry.image_slabs
    assert img == 2 and seam.host_bytes == 512 * 2048
    want_kv = [[layer[p].clone() for p in (2, 3, 4)] for layer in kv]
    want_state = conv[0].clone(), ssm[0].clone()
    seam.write_blocks(BlockWriteBatch(7, [BlockCopy(1, 2, 10), BlockCopy(2, 3, 11)], 0))
    seam.write_snapshot(SnapshotWrite(8, 1, 0, [20, 23], 4, 12, 0), phys_slot=0)
    assert seam.poll() == Landed(restores=[], writes=[7, 8])
    batch = RestoreBatch(
        9,
        [BlockCopy(1, 8, 10), BlockCopy(2, 9, 11)],
        TailCopy(1, 12, 12),
        ImageCopy(1, [20, 23]),
        0,
    )
    ticket = seam.restore(batch, lane_slot=2)
    assert ticket.tag == 9 and ticket.parts == ("prelude", 0, 1, 2, 3, 4, 5)
    assert seam.drain() == Landed(restores=[9], writes=[])
    for layer, want in zip(kv, want_kv, strict=True):
        assert [torch.equal(layer[p], w) for p, w in zip((8, 9, 12), want, strict=True)] == [
            True
        ] * 3
    assert torch.equal(conv[2], want_state[0]) and torch.equal(ssm[2], want_state[1])


def test_snapshot_without_tail():
    seam, kv, conv, ssm = setup()
    handle = seam.write_snapshot(SnapshotWrite(1, 1, 0, [3, 4], -1, -1, 0), phys_slot=1)
    assert handle.ncopies == 2  # slabs 3, 4 share a chunk: ssm = row 0, conv starts row 1
    assert seam.poll() == Landed(restores=[], writes=[1])
