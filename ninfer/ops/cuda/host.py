"""Small host-built index tensors, sent to the device without blocking the CPU."""

from __future__ import annotations

import torch


def pinned(values: list[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """A host tensor of `values`, page-locked when CUDA is present (plain on CPU-only hosts)."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory() if torch.cuda.is_available() else t


def to_device(values: list[int], device: torch.device, dtype: torch.dtype = torch.int64):
    """`values` as a tensor on `device` (an asynchronous copy from pinned memory)."""
    return pinned(values, dtype).to(device, non_blocking=True)
