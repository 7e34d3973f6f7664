"""Fault containment: which faults end the engine, and which each level contains.

The engine's rule (applied by `containment.py`, and per request where the fault is met):

    per request   its sampling, its detokenization, its state  -> that request fails alone
    per step      a forward / copy that raised                 -> the step's lanes fail; their
                                                                  pins and pages are released
    Host tier     a raising Device->Host or Host->Device copy,  -> the affected entries lose
                  a raising Host slab allocation                  their Host copy (Device-only),
                                                                  counted in CacheStats.host_faults
    fatal         a CUDA error that poisons the context         -> the engine ends; every caller
                  (sticky: illegal address, device assert, ...)   gets that error's text

A fault is contained only while the cache stays consistent: the engine re-checks the invariants
after containing one and ends (fatal) when they do not hold. Host-tier faults are contained by
the KV-state owner (`kv/host_faults.py`); this module says which faults are fatal, and
`StepFault` names the lanes a step's fault hits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ninfer.engine.kv.lane import KVLane

# Texts of CUDA errors that leave the context unusable (torch raises them as RuntimeError, or
# torch.AcceleratorError): every later kernel launch fails the same way.
_STICKY = (
    "illegal memory access",
    "illegal address",
    "illegal instruction",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "uncorrectable ECC",
    "CUDA error",
    "cudaError",
    "CUBLAS_STATUS_EXECUTION_FAILED",
)


def is_fatal(exc: BaseException) -> bool:
    """Whether `exc` ends the engine: anything that is not an Exception (KeyboardInterrupt,
    SystemExit) and a CUDA error that poisons the context. An out-of-memory error is not
    sticky: the step's lanes fail and the engine goes on."""
    if not isinstance(exc, Exception):
        return True
    if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc):
        return False
    if type(exc).__name__ == "AcceleratorError":
        return True
    text = str(exc)
    return any(marker in text for marker in _STICKY)


class StepFault(Exception):
    """A step's forward or copy raised: its lanes fail (the table above)."""

    def __init__(self, lanes: list[KVLane], cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.lanes = lanes
        self.cause = cause
