"""The one place that picks the op set.

    CPU                                   -> ReferenceOps
    CUDA, flashinfer + fla + triton import -> CudaOps (norms, RoPE, glue compiled if compile;
                                             built with the op choices, `OpsConfig.op_choices`)
    CUDA, a kernel library missing        -> ReferenceOps, with one warning saying which
(ReferenceOps has one path per op: it takes no choices.)

Which CudaOps fast paths then take the model is decided by `ninfer.engine.executor.warmup`
(`CudaOps.configure`), before the warm-up.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import torch

from ninfer.ops.choices import OpChoices

logger = logging.getLogger(__name__)


def select_ops(device: torch.device, compile: bool = False, choices: OpChoices | None = None):
    """The op set for `device` (see the module docstring); `choices` None: the defaults."""
    from ninfer.ops.reference import ReferenceOps

    if device.type != "cuda":
        return ReferenceOps()
    missing = [m for m in ("flashinfer", "fla", "triton") if importlib.util.find_spec(m) is None]
    if missing:
        logger.warning(
            "ninfer: CUDA device but %s not importable: using the slow ReferenceOps",
            ", ".join(missing),
        )
        return ReferenceOps()
    # Triton keeps compiled kernels on disk by default, autotune results only when asked: ask,
    # so that a restart skips the autotune of the GDN / GEMM kernels (most of a cold startup).
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    try:
        from ninfer.ops.cuda import CudaOps

        return CudaOps(device, compile=compile, choices=choices)
    except ImportError as e:  # a kernel library present but broken
        logger.warning("ninfer: CudaOps unavailable (%r): using the slow ReferenceOps", e)
        return ReferenceOps()
