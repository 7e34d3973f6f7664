"""ninfer: a PyTorch inference engine for Qwen3.5 hybrid models with a hybrid prefix cache."""

from __future__ import annotations

from ninfer.request import (
    EngineError,
    Metrics,
    RequestOutput,
    SamplingParams,
    StructuredOutputsParams,
    Usage,
)
from ninfer.version import __version__

__all__ = [
    "LLM",
    "EngineError",
    "Metrics",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
    "Usage",
    "__version__",
]


def __getattr__(name: str):
    # LLM pulls in torch and the engine; keep `import ninfer` light for the CLI's --help.
    if name == "LLM":
        from ninfer.llm import LLM

        return LLM
    raise AttributeError(f"module 'ninfer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
