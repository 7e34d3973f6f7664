"""The Host-tier implementation of the engine's transfer seam (`transfer_seam.Transfer`).

Translates the prefix index's copy records (`RestoreBatch`, `BlockWriteBatch`, `SnapshotWrite`,
duck-typed: this module does not import `ninfer.cache`) into `Transfer` calls, tags every
batch with its `batch_id`, and reports landed ids back as `transfer_seam.Landed`.

What the engine calls, and when:

    admission   ticket = restore(batch, lane.slot)
                ticket.wait_prelude(compute)      before copy_prefix of a restored tail page
                lane's first prefill pass: ForwardBatch.before_layer = ticket.hook(compute)
                cancel before the first pass: ticket.wait_all(compute)
    release     write_blocks(result.write)        (ReleaseResult.write)
    publication write_snapshot(result.write, snap_phys[slot])
    each step   landed = poll()  -> index.on_restore_landed / on_write_through_landed
    shutdown    drain()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ninfer.memory.host_slabs import HostSlabs
from ninfer.memory.streams import Streams
from ninfer.memory.transfer import RestoreTicket, Transfer, WriteHandle
from ninfer.memory.transfer_seam import Landed


class HostTierTransfer:
    """`transfer_seam.Transfer` over pinned `HostSlabs`; see the module docstring.

    host_pool: the index's `HostSlabPool` (or None): when given, its slab count, slab bytes and
    chunking must equal the slabs' geometry (ValueError otherwise), so both sides agree on ids.
    """

    def __init__(
        self,
        slabs: HostSlabs,
        kv: list[torch.Tensor],
        conv: torch.Tensor,
        ssm: torch.Tensor,
        layer_types: Sequence[str],
        streams: Streams,
        host_pool: Any = None,
        *,
        timing: bool = False,
    ) -> None:
        g = slabs.geometry
        if host_pool is not None:
            theirs = (host_pool.n_slabs, host_pool.slab_bytes, host_pool.slabs_per_chunk)
            ours = (g.num_slabs, g.slab_bytes, g.slabs_per_chunk)
            if theirs != ours:
                raise ValueError(
                    f"Host slab geometry differs: index (slabs, slab_bytes, per chunk) {theirs}, "
                    f"memory {ours}; build CacheConfig from HostSlabs.geometry"
                )
        self.host_bytes = g.total_bytes
        self.transfer = Transfer(slabs, kv, conv, ssm, layer_types, streams, timing=timing)

    def restore(self, batch: Any, lane_slot: int) -> RestoreTicket:
        """RestoreBatch: block slabs -> pages (per layer), tail slab -> page (prelude), image
        slabs -> `lane_slot`. Returns the ticket the lane's first prefill pass waits on."""
        pages = [(b.page, b.slab) for b in batch.blocks]
        tails = [(batch.tail.page, batch.tail.slab)] if batch.tail is not None else []
        images = [(lane_slot, batch.image.slabs)] if batch.image is not None else []
        return self.transfer.restore(pages, tails, images, tag=batch.batch_id)

    def write_blocks(self, batch: Any) -> WriteHandle:
        """BlockWriteBatch: Device pages -> slabs, one batch on the transfer stream."""
        pages = [(b.page, b.slab) for b in batch.blocks]
        return self.transfer.write_through(pages, tag=batch.batch_id)

    def write_snapshot(self, write: Any, phys_slot: int) -> WriteHandle:
        """SnapshotWrite: the image of physical state slot `phys_slot` (and its tail page when
        tail_page >= 0) -> slabs."""
        pages = [(write.tail_page, write.tail_slab)] if write.tail_page >= 0 else []
        return self.transfer.write_through(pages, [(phys_slot, write.slabs)], tag=write.batch_id)

    def poll(self) -> Landed:
        """Batch ids landed since the last poll (never blocks)."""
        return _ids(self.transfer.poll())

    def drain(self) -> Landed:
        """Wait for both streams; every outstanding batch id."""
        return _ids(self.transfer.drain())


def _ids(landed) -> Landed:
    return Landed(restores=[t.tag for t in landed.restores], writes=[w.tag for w in landed.writes])
