"""Streams and events of the memory layer: real on CUDA, no-ops on the CPU.

The compute stream runs forward passes; the restore stream carries Host -> Device restores
(design §6.5) and the transfer stream Device -> Host write-through (§7.6). On the CPU every copy is
synchronous, so streams and events collapse to no-ops with the same interface; engine code never
branches on the device type.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch


class Event:
    """A point in one stream's work."""

    __slots__ = ("_event",)

    def __init__(self, event: torch.cuda.Event | None) -> None:
        self._event = event

    def query(self) -> bool:
        """True once every operation before the event has completed (CPU: always)."""
        return True if self._event is None else bool(self._event.query())

    def synchronize(self) -> None:
        if self._event is not None:
            self._event.synchronize()


class Streams:
    """The engine's three streams on one device. Owns nothing else."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        if self.is_cuda:
            self.compute: torch.cuda.Stream | None = torch.cuda.current_stream(device)
            self.restore: torch.cuda.Stream | None = torch.cuda.Stream(device)
            self.transfer: torch.cuda.Stream | None = torch.cuda.Stream(device)
        else:
            self.compute = self.restore = self.transfer = None

    def record(self, stream: torch.cuda.Stream | None = None) -> Event:
        """Record an event on `stream` (default: compute)."""
        if not self.is_cuda:
            return Event(None)
        event = torch.cuda.Event()
        event.record(stream or self.compute)
        return Event(event)

    def on(self, stream: torch.cuda.Stream | None):
        """Context manager making `stream` current (CPU: nothing)."""
        return torch.cuda.stream(stream) if self.is_cuda and stream is not None else nullcontext()
