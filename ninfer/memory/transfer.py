"""The engine's Host transfer seam (design §6.5, §7.6): restores and write-through of the copy
records the prefix index produces, issued as `copy_runs` plans on the memory layer's streams.

    Transfer            what the engine calls (a Protocol); `Landed` is what `poll()` reports
    DeviceOnlyTransfer  no Host tier: the index never produces Host copies, so receiving one is
                        a logic error
    HostTransfer        over pinned `HostSlabs`:

    restore (H2D, design §6.4-6.5)   restore stream: waits for the compute stream's queued work,
                                   then prelude | layer 0 | layer 1 | ... with an event after
                                   each part; a `RestoreTicket` lets the compute stream wait
                                   per layer (the first prefill pass overlaps the copy).
    write-through (D2H, §7.6)      transfer stream: waits for the compute stream, then one
                                   batch of coalesced copies and one event; a `WriteHandle`.

What the engine calls, and when:

    admission   ticket = restore(batch, lane.slot)
                ticket.wait_prelude(compute)      before copy_prefix of a restored tail page
                lane's first prefill pass: ForwardBatch.before_layer = ticket.hook(compute)
                cancel before the first pass: ticket.wait_all(compute)
    release     write_blocks(result.write)        (ReleaseResult.write)
    publication write_snapshot(result.write, snap_phys[slot])
    each step   landed = poll()  -> index.on_restore_landed / on_write_through_landed
    shutdown    drain()

The index's records (`RestoreBatch`, `BlockWriteBatch`, `SnapshotWrite`) are duck-typed: this
module does not import `ninfer.cache`'s records. Every batch is tagged with its `batch_id`.
Each stream completes in issue order, so `poll()` retires landed batches oldest first. Until a
batch is reported by `poll()` / `drain()`, its Device pages / slots and Host slabs must stay
owned (Filling or pinned): nothing here checks ownership.

On the CPU every copy is a synchronous `copy_` and events are absent: the API and the
bookkeeping are the same, every batch has landed when its call returns.

Does not know: which slab holds what, which page is free, requests. Device-to-Device taps are
`StatePool.tap` / `resume`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ninfer.memory.copy_runs import Copy, DeviceLayout, Mark, SlotImage, plan_restore, plan_write
from ninfer.memory.host_slabs import HostSlabs
from ninfer.memory.streams import Streams

Stream = torch.cuda.Stream | None


@dataclass(slots=True)
class Landed:
    """Batch ids (tags) whose copies have completed since the previous poll, in issue order."""

    restores: list = field(default_factory=list)
    writes: list = field(default_factory=list)


class Transfer(Protocol):
    host_bytes: int  # pinned Host bytes this transfer layer holds (0 = none)

    def restore(self, batch: Any, lane_slot: int) -> Any:
        """Queue a RestoreBatch: block slabs -> pages, tail slab -> page, image -> lane_slot.
        Returns a ticket with wait_prelude() / wait_all() / hook() (per-layer waits) and
        synchronize() (host wait, for a prefetch)."""
        ...

    def write_blocks(self, batch: Any) -> Any:
        """Queue a BlockWriteBatch (Device pages -> Host slabs) on the transfer stream."""
        ...

    def write_snapshot(self, write: Any, phys_slot: int) -> Any:
        """Queue a SnapshotWrite (image of physical slot, and tail page) -> Host slabs."""
        ...

    def poll(self) -> Landed:
        """Batches that landed since the last poll (the engine tells the index)."""
        ...

    def drain(self) -> Landed:
        """Wait for every queued batch; what landed."""
        ...


class DeviceOnlyTransfer:
    """No Host tier: nothing is ever copied to or from the Host."""

    host_bytes = 0

    def restore(self, batch: Any, lane_slot: int) -> Any:
        raise RuntimeError("Device-only cache: the index asked for a Host restore")

    def write_blocks(self, batch: Any) -> None:
        raise RuntimeError("Device-only cache: the index asked for a Host write-through")

    def write_snapshot(self, write: Any, phys_slot: int) -> None:
        raise RuntimeError("Device-only cache: the index asked for a Host snapshot write")

    def poll(self) -> Landed:
        return Landed()

    def drain(self) -> Landed:
        return Landed()


class RestoreTicket:
    """One restore batch. parts: the recorded parts in issue order ("prelude", layer, ...).

    wait_*(compute_stream) order the compute stream after a part (None: `Streams.compute`); a
    part without copies, a batch `poll()` has retired, or any batch on the CPU: nothing to do.
    """

    def __init__(
        self,
        tag: object,
        parts: tuple[str | int, ...],
        nbytes: int,
        ncopies: int,
        compute: Stream,
    ) -> None:
        self.tag = tag
        self.parts = parts
        self.nbytes = nbytes
        self.ncopies = ncopies
        self.retired = False
        self._events: dict[str | int, torch.cuda.Event] = {}
        self.start_event: torch.cuda.Event | None = None  # set when timing=True
        self._compute = compute

    def wait_prelude(self, compute_stream: Stream = None) -> None:
        self._wait(self._events.get("prelude"), compute_stream)

    def wait_layer(self, layer: int, compute_stream: Stream = None) -> None:
        """Before model layer `layer` of the lane's first prefill pass (`before_layer`)."""
        self._wait(self._events.get(layer), compute_stream)

    def wait_all(self, compute_stream: Stream = None) -> None:
        """Before releasing a lane that never ran: its slot and pages may still be targets."""
        self._wait(self._last(), compute_stream)

    def synchronize(self) -> None:
        """Block the calling thread until every copy has landed (a prefetch the next quote
        must see settled, design §6.6). No-op on the CPU, when empty, or once retired."""
        last = self._last()
        if last is not None and not self.retired:
            last.synchronize()

    def hook(self, compute_stream: Stream = None) -> Callable[[int], None]:
        """A `ForwardBatch.before_layer` callable for this ticket."""
        return lambda layer: self.wait_layer(layer, compute_stream)

    def done(self) -> bool:
        """True once every copy has landed (does not retire; `HostTransfer.poll` does)."""
        last = self._last()
        return last is None or bool(last.query())

    def elapsed_ms(self) -> dict[str | int, float]:
        """Per part: ms from the batch's start to its event (needs timing=True, and done())."""
        if self.start_event is None:
            return {}
        return {p: self.start_event.elapsed_time(e) for p, e in self._events.items()}

    def _last(self) -> torch.cuda.Event | None:
        return self._events.get(self.parts[-1]) if self.parts else None

    def _wait(self, event: torch.cuda.Event | None, stream: Stream) -> None:
        if event is None or self.retired:
            return
        (stream or self._compute).wait_event(event)

    def _retire(self) -> None:
        self.retired = True
        if self.start_event is None:
            self._events = {}


class WriteHandle:
    """One write-through batch; `tag` is the caller's (e.g. the nodes it backs up)."""

    def __init__(self, tag: object, nbytes: int, ncopies: int, event: torch.cuda.Event | None):
        self.tag = tag
        self.nbytes = nbytes
        self.ncopies = ncopies
        self.event = event
        self.retired = False

    def done(self) -> bool:
        return self.event is None or bool(self.event.query())

    def _retire(self) -> None:
        self.retired = True
        self.event = None


class HostTransfer:
    """`Transfer` over pinned `HostSlabs`: issues restores and write-through between the
    `ModelCache` pools and the slabs; see the module docstring.

    kv: per full-attention layer [pages, 2, 64, Hkv, hd]; conv: [slots, n_gdn, C, K-1];
    ssm: [slots, n_gdn, Hv, dk, dv] (all contiguous, any dtype: bytes move as they are).
    layer_types: per model layer "full_attention" | "linear_attention" (forward order).
    """

    def __init__(
        self,
        slabs: HostSlabs,
        kv: list[torch.Tensor],
        conv: torch.Tensor,
        ssm: torch.Tensor,
        layer_types: Sequence[str],
        streams: Streams,
        *,
        timing: bool = False,
    ) -> None:
        for name, t in [*((f"kv{i}", t) for i, t in enumerate(kv)), ("conv", conv), ("ssm", ssm)]:
            if not t.is_contiguous():
                raise ValueError(f"HostTransfer: Device pool {name} must be contiguous")
        self.slabs = slabs
        self.streams = streams
        self.timing = timing and streams.is_cuda
        self.layout = DeviceLayout(
            layer_types=tuple(layer_types),
            page_bytes=_nbytes(kv[0][0]) if kv else 0,
            num_pages=kv[0].shape[0] if kv else 0,
            ssm_layer_bytes=_nbytes(ssm[0, 0]),
            conv_layer_bytes=_nbytes(conv[0, 0]),
            num_slots=ssm.shape[0],
        )
        lay, geom = self.layout, slabs.geometry
        if (lay.n_fa, lay.page_bytes) != (geom.n_fa_layers, geom.cell_bytes) or len(kv) != lay.n_fa:
            raise ValueError("HostTransfer: KV pools or layer types do not match the slab geometry")
        if lay.image_bytes != geom.image_bytes or conv.shape[1] != lay.n_gdn:
            raise ValueError("HostTransfer: state pools or layer types do not match the image size")
        self._dev = {f"kv{i}": _flat(t) for i, t in enumerate(kv)}
        self._dev |= {"conv": _flat(conv), "ssm": _flat(ssm)}
        self.host_bytes = slabs.geometry.total_bytes
        self._writes: deque[WriteHandle] = deque()
        self._restores: deque[RestoreTicket] = deque()

    # ---- the index's copy records -------------------------------------------------------------
    def restore(self, batch: Any, lane_slot: int) -> RestoreTicket:
        """RestoreBatch: block slabs -> pages (per layer), tail slab -> page (prelude), image
        slabs -> `lane_slot`. Returns the ticket the lane's first prefill pass waits on."""
        pages = [(b.page, b.slab) for b in batch.blocks]
        tails = [(batch.tail.page, batch.tail.slab)] if batch.tail is not None else []
        images = [(lane_slot, batch.image.slabs)] if batch.image is not None else []
        return self.restore_slabs(pages, tails, images, tag=batch.batch_id)

    def write_blocks(self, batch: Any) -> WriteHandle:
        """BlockWriteBatch: Device pages -> slabs, one batch on the transfer stream."""
        pages = [(b.page, b.slab) for b in batch.blocks]
        return self.write_through(pages, tag=batch.batch_id)

    def write_snapshot(self, write: Any, phys_slot: int) -> WriteHandle:
        """SnapshotWrite: the image of physical state slot `phys_slot` (and its tail page when
        tail_page >= 0) -> slabs."""
        pages = [(write.tail_page, write.tail_slab)] if write.tail_page >= 0 else []
        return self.write_through(pages, [(phys_slot, write.slabs)], tag=write.batch_id)

    # ---- issue ------------------------------------------------------------------------------
    def restore_slabs(
        self,
        pages: Sequence[tuple[int, int]] = (),
        tails: Sequence[tuple[int, int]] = (),
        images: Sequence[SlotImage | tuple[int, Sequence[int]]] = (),
        *,
        tag: object = None,
    ) -> RestoreTicket:
        """Copy slabs into Device pages ((page, slab) pairs: `pages` are path blocks, restored
        layer by layer; `tails` are read before layer 0) and images into state slots
        ((slot, slabs)). Ordered after the compute stream's queued work. Mutates the pages and
        slots (asynchronously on CUDA). Raises ValueError / IndexError on bad ids."""
        plan = plan_restore(self.layout, self.slabs.geometry, pages, tails, _images(images))
        copies = [s for s in plan if isinstance(s, Copy)]
        parts = tuple(s.part for s in plan if isinstance(s, Mark))
        parts = parts if copies else ()
        ticket = RestoreTicket(tag, parts, _total(copies), len(copies), self.streams.compute)
        stream = self.streams.restore
        with self.streams.on(stream):
            if stream is not None:
                stream.wait_stream(self.streams.compute)
                if self.timing:
                    ticket.start_event = self._record(stream)
            for step in plan if copies else ():
                if isinstance(step, Mark):
                    if stream is not None:
                        ticket._events[step.part] = self._record(stream)
                else:
                    dev, host = self._views(step)
                    dev.copy_(host, non_blocking=True)
        self._restores.append(ticket)
        return ticket

    def write_through(
        self,
        pages: Sequence[tuple[int, int]] = (),
        images: Sequence[SlotImage | tuple[int, Sequence[int]]] = (),
        *,
        tag: object = None,
    ) -> WriteHandle:
        """Copy Device page bundles ((page, slab) pairs: blocks and tails) and state images
        ((slot, slabs)) to their slabs, after the compute stream's queued work. Mutates the
        slabs (asynchronously on CUDA). Raises ValueError / IndexError on bad ids."""
        plan = plan_write(self.layout, self.slabs.geometry, pages, _images(images))
        stream = self.streams.transfer
        with self.streams.on(stream):
            if stream is not None:
                stream.wait_stream(self.streams.compute)
            for step in plan:
                dev, host = self._views(step)
                host.copy_(dev, non_blocking=True)
            event = self._record(stream) if stream is not None and plan else None
        handle = WriteHandle(tag, _total(plan), len(plan), event)
        self._writes.append(handle)
        return handle

    # ---- retire -----------------------------------------------------------------------------
    def poll(self) -> Landed:
        """Retire the batches that have landed and return their tags (oldest first; never
        blocks)."""
        restores = [t.tag for t in _retire_landed(self._restores)]
        return Landed(restores=restores, writes=[w.tag for w in _retire_landed(self._writes)])

    def drain(self) -> Landed:
        """Wait for both streams, then retire every outstanding batch; their tags."""
        for stream in (self.streams.restore, self.streams.transfer):
            if stream is not None:
                stream.synchronize()
        return self.poll()

    @property
    def in_flight(self) -> int:
        return len(self._writes) + len(self._restores)

    def _views(self, c: Copy) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self._dev[c.dev][c.dev_off : c.dev_off + c.nbytes]
        host = self.slabs.row(c.chunk, c.row)[c.host_off : c.host_off + c.nbytes]
        return dev, host

    def _record(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=self.timing)
        event.record(stream)
        return event


def _retire_landed(queue: deque) -> list:
    out = []
    while queue and queue[0].done():
        item = queue.popleft()
        item._retire()
        out.append(item)
    return out


def _images(images: Sequence[SlotImage | tuple[int, Sequence[int]]]) -> list[SlotImage]:
    return [SlotImage(int(slot), tuple(slabs)) for slot, slabs in images]


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.view(-1).view(torch.uint8)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _total(copies: Sequence[Copy]) -> int:
    return sum(c.nbytes for c in copies)
