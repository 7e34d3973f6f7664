"""Host slabs for a test's own Device pools, cut by the engine's geometry rule."""

from __future__ import annotations

import torch

from ninfer.cache.host_pool import MAX_CHUNK_BYTES, plan_slab_geometry
from ninfer.memory.host_slabs import HostSlabs


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def slabs_for_pools(
    kv: list[torch.Tensor],
    conv: torch.Tensor,
    ssm: torch.Tensor,
    host_mib: int,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
) -> HostSlabs:
    """`plan_slab_geometry` of the pools' page (kv[i][0]) and image (conv[0] + ssm[0]) sizes;
    pinned iff the pools live on CUDA."""
    image = nbytes(conv[0]) + nbytes(ssm[0])
    g = plan_slab_geometry(host_mib, len(kv), nbytes(kv[0][0]), image, max_chunk_bytes)
    return HostSlabs(g, pin=ssm.device.type == "cuda")
