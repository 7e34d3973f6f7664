"""CUDA ops for ninfer: FlashInfer attention, fla-core / Triton gated delta rule, Triton causal
conv, glue and skinny GEMMs. Importing this package needs only torch; the kernel libraries are
imported when a `CudaOps` is built, so CPU-only machines can import it and ask
`cuda_ops_available()`.
"""

from __future__ import annotations

import importlib.util

import torch

from ninfer.ops.cuda.ops import CudaOps

__all__ = ["CudaOps", "cuda_ops_available"]


def cuda_ops_available() -> bool:
    """True when a CUDA device is present and flashinfer, fla and triton are importable."""
    if not torch.cuda.is_available():
        return False
    return all(importlib.util.find_spec(m) is not None for m in ("flashinfer", "fla", "triton"))
