"""Plain data of the public API (spec/API.md): sampling parameters and request outputs.

This module knows nothing about tensors, the model or the cache; it is imported by everything
above the engine and by the CLI.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(slots=True)
class SamplingParams:
    """How one request samples. `temperature=0` is greedy.

    `logprobs=k` returns, for every generated position, the top-k natural-log probabilities over
    the full vocabulary (before the sampling filters) plus the chosen token's.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k!r}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise ValueError(f"logprobs must be None or an integer >= 0, got {self.logprobs!r}")
        if self.stop is not None and not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        if self.stop_token_ids is not None and not all(
            isinstance(t, int) for t in self.stop_token_ids
        ):
            raise ValueError("stop_token_ids must be a list of integers")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(slots=True)
class Usage:
    """Token accounting of one request.

    cached_tokens: the reuse frontier the request resumed from (prompt tokens not prefilled).
    cached_prefix_tokens: the longest cached block prefix, reusable or not.
    restored_host_bytes: bytes copied from the Host tier for this request.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cached_prefix_tokens: int = 0
    restored_host_bytes: int = 0


@dataclass(slots=True)
class Metrics:
    """Timings of one request, in seconds.

    restore_s: how long the request's Host restore ran on the restore stream, from its first
    copy to its last (CUDA only; 0.0 on the CPU or without a Host hit). It overlaps the first
    prefill pass, so it is part of ttft_s, not added to it.
    """

    queued_s: float = 0.0
    ttft_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    restore_s: float = 0.0


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    error: str | None = None
    logprobs: list[dict[int, float]] | None = None
    usage: Usage = field(default_factory=Usage)
    metrics: Metrics = field(default_factory=Metrics)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class StreamDelta:
    """One streamed event: new tokens and their text since the previous event."""

    request_id: str
    token_ids: list[int]
    text: str
