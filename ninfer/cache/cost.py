"""CacheCostModel: the prefill and Host-to-Device cost coefficients that rank admission sources
(design §6.2) and value snapshots for Host eviction (§9.3, §11.4).

Costs only *rank* choices; capacity and validity never depend on them (§10.10). The engine
derives its model from the model's shape and the device's rates (`ninfer.costs`,
`KVState`); the presets below are fixed planning values for the standalone cache benchmark
and tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.cache.common import ceil_div


@dataclass(slots=True, frozen=True)
class CacheCostModel:
    """Linear prefill model plus a bandwidth-and-latency restore model.

    prefill_seconds(base B, tokens S) = token_s * S
                                      + pair_s * (B*S + S*(S+1)/2)     # attention pairs
                                      + chunk_s * ceil(S / chunk_tokens)
    restore_seconds(bytes) = bytes / h2d_bytes_per_s + batch_latency_s  (0 for 0 bytes)
    """

    token_s: float
    pair_s: float
    chunk_s: float
    chunk_tokens: int
    h2d_bytes_per_s: float
    batch_latency_s: float

    @classmethod
    def h200(cls, chunk_tokens: int = 8192) -> CacheCostModel:
        """Planning values for Qwen3.5-27B on one H200 (ADAPTATION.md: 55 GB/s pinned H2D).

        ~54 GFLOP per token of dense work at ~500 TFLOP/s effective; 16 full-attention layers x
        24 heads x head_dim 256 at ~4 FLOP/pair/dim and ~400 TFLOP/s; ~2 ms fixed per chunk.
        """
        return cls(
            token_s=1.1e-4,
            pair_s=1.0e-9,
            chunk_s=2.0e-3,
            chunk_tokens=chunk_tokens,
            h2d_bytes_per_s=55e9,
            batch_latency_s=20e-6,
        )

    @classmethod
    def cpu(cls, chunk_tokens: int = 512) -> CacheCostModel:
        """Generic values for the CPU reference path (demo model): prefill is slow, memcpy fast."""
        return cls(
            token_s=2.0e-3,
            pair_s=2.0e-8,
            chunk_s=5.0e-3,
            chunk_tokens=chunk_tokens,
            h2d_bytes_per_s=10e9,
            batch_latency_s=0.0,
        )

    def prefill_seconds(self, base: int, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        pairs = base * tokens + tokens * (tokens + 1) / 2
        return (
            self.token_s * tokens
            + self.pair_s * pairs
            + self.chunk_s * ceil_div(tokens, self.chunk_tokens)
        )

    def restore_seconds(self, nbytes: int) -> float:
        if nbytes <= 0:
            return 0.0
        return nbytes / self.h2d_bytes_per_s + self.batch_latency_s
