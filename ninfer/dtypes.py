"""The dtypes by name: the names the options take, their element sizes and torch dtypes.

`EngineOptions` takes these names and `resolve()` turns "auto" into one of them once
(`MemoryGeometry.dtype` / `kv_dtype`); every other module reads the resolved name through this
table. Imports no torch until `torch_dtype` is called (the command line reads the names).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# name -> (bytes per element, torch attribute)
_TABLE = {
    "bfloat16": (2, "bfloat16"),
    "float16": (2, "float16"),
    "float32": (4, "float32"),
    "fp8_e4m3": (1, "float8_e4m3fn"),  # KV cache only
}
DTYPES = ("bfloat16", "float16", "float32")  # weights and activations
KV_DTYPES = (*DTYPES, "fp8_e4m3")


def itemsize(name: str) -> int:
    """Bytes per element of dtype `name`."""
    return _TABLE[name][0]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of `name`."""
    import torch

    return getattr(torch, _TABLE[name][1])
